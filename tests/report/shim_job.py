"""Real processes under the shim for the report and top tests: live_endings
(tests/programs) run with libpinshim.so and the fake runtime in create mode,
so that the statistics and live records read are the ones the library
writes; and Prometheus' own parser for what pinshim report --prometheus and
pinshim top --prometheus print.

Environment (set by meson): PINSHIM_LIB, FAKE_CUDART, LIVE_ENDINGS.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")
NEEDED = ("PINSHIM_LIB", "FAKE_CUDART", "LIVE_ENDINGS")
# live_endings locks buffers of this size, one registration each.
BUFFER_BYTES = 1 << 20


def why_no_shim_runs():
    """Why processes cannot be run under the shim here, or None."""
    if EMULATOR:
        return (f"under {EMULATOR}: live_endings and the shim are another architecture's "
                "programs than this python3")
    missing = [name for name in NEEDED if not os.environ.get(name)]
    if missing:
        return f"{', '.join(missing)} not set (run through meson test)"
    return None


class LockingProcess:
    """live_endings under the shim, told what to do one command at a time."""

    def __init__(self, environment):
        self.process = subprocess.Popen([os.environ["LIVE_ENDINGS"]], env=environment,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
        self.pid = self.process.pid

    def say(self, command, count=1):
        for _ in range(count):
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
            while True:
                line = self.process.stdout.readline()
                if not line:
                    raise AssertionError(f"live_endings ended before answering {command}")
                if line.startswith(("ok ", "failed ")):
                    if not line.startswith("ok "):
                        raise AssertionError(line)
                    break

    def end(self, how):
        """Ends it: "exit" (end of input), "_exit", or a signal number."""
        if how == "exit":
            self.process.stdin.close()
        elif how == "_exit":
            self.process.stdin.write("_exit\n")
            self.process.stdin.flush()
        else:
            self.process.send_signal(how)
        status = self.process.wait(timeout=60)
        expected = 0 if how in ("exit", "_exit") else -how
        if status != expected:
            raise AssertionError(f"live_endings ended with {status}, not {expected}")

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=60)
        for stream in (self.process.stdin, self.process.stdout):
            if not stream.closed:
                stream.close()


class ShimCase(unittest.TestCase):
    """A test with a job's statistics directory and a runtime directory of
    its own (XDG_RUNTIME_DIR), where the shim keeps its live records."""

    def setUp(self):
        why = why_no_shim_runs()
        if why:
            self.skipTest(why)
        self.temporary = tempfile.TemporaryDirectory(prefix="pinshim-job-")
        self.addCleanup(self.temporary.cleanup)
        self.directory = self.temporary.name
        self.stats = os.path.join(self.directory, "stats")
        self.runtime = os.path.join(self.directory, "run")
        os.mkdir(self.stats)
        os.mkdir(self.runtime, 0o700)

    def shim_environment(self, stats=None, extra=None):
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith(("PINSHIM_", "FAKE_CUDART"))
                       and name not in ("LD_PRELOAD", "XDG_RUNTIME_DIR")}
        environment.update(
            LD_PRELOAD=os.environ["PINSHIM_LIB"],
            PINSHIM_CUDART=os.environ["FAKE_CUDART"],
            PINSHIM_CONTEXT="create",
            # Registered inside the lock call: when live_endings answers, its
            # statistics and record hold the registration.
            PINSHIM_ASYNC="off",
            PINSHIM_STATS=os.path.join(stats or self.stats, "stats.%h.%p.json"),
            XDG_RUNTIME_DIR=self.runtime)
        environment.update(extra or {})
        return environment

    def reader_environment(self):
        """The environment of pinshim report and top: the same runtime directory."""
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith("PINSHIM_") and name != "LD_PRELOAD"}
        environment["XDG_RUNTIME_DIR"] = self.runtime
        return environment

    def start(self, locks, stats=None, extra=None):
        """A process that has locked (and registered) locks buffers; extra:
        more variables for it."""
        process = LockingProcess(self.shim_environment(stats, extra))
        self.addCleanup(process.close)
        process.say("lock", locks)
        return process

    def ended(self, locks, how="exit", extra=None):
        """The pid of a process that locked locks buffers and ended (how)."""
        process = self.start(locks, extra=extra)
        process.end(how)
        return process.pid

    def stats_path(self, pid):
        return os.path.join(self.stats, f"stats.{socket.gethostname()}.{pid}.json")

    def stats_document(self, pid):
        with open(self.stats_path(pid), encoding="utf-8") as handle:
            return json.load(handle)


# Parses with prometheus_client in a python3 that has it, and prints the
# families as JSON.
PARSER = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
print(json.dumps([{"name": family.name, "type": family.type, "help": family.documentation,
                   "samples": [[sample.name, sample.labels, sample.value]
                               for sample in family.samples]}
                  for family in text_string_to_metric_families(sys.stdin.read())]))
"""
# scripts/deps installs Debian's python3-prometheus-client, for Debian's
# python3; the tests may run under another python3 (a pyenv one, say).
DEBIAN_PYTHON = "/usr/bin/python3"


def parser_python():
    if importlib.util.find_spec("prometheus_client") is not None:
        return sys.executable
    if os.access(DEBIAN_PYTHON, os.X_OK) and subprocess.run(
            [DEBIAN_PYTHON, "-c", "import prometheus_client.parser"],
            capture_output=True, timeout=60).returncode == 0:
        return DEBIAN_PYTHON
    return None


def parse_exposition(text):
    """The families prometheus_client's parser reads in text: a list of
    {name, type, help, samples: [[name, labels, value]]}. Skips the test when
    no python3 here has prometheus_client."""
    python = parser_python()
    if python is None:
        raise unittest.SkipTest(
            f"prometheus_client is installed neither for {sys.executable} nor for "
            f"{DEBIAN_PYTHON} (Debian: python3-prometheus-client, which scripts/deps installs)")
    result = subprocess.run([python, "-c", PARSER], input=text, capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"prometheus_client cannot parse the output: {result.stderr}")
    return json.loads(result.stdout)


def samples_of(families):
    """{(sample name, frozenset of labels): value} of parsed families."""
    samples = {}
    for family in families:
        for name, labels, value in family["samples"]:
            key = (name, frozenset(labels.items()))
            if key in samples:
                raise AssertionError(f"{name} {labels} is there twice")
            samples[key] = value
    return samples


def sample(samples, name, **labels):
    """The value of the sample with exactly these labels, or None."""
    return samples.get((name, frozenset((key, str(value)) for key, value in labels.items())))
