#!/usr/bin/env python3
"""Issue 10: job statistics that tell the truth. Every process that locked
memory reports, also those that end with _exit (Python's fork-context
workers, a C program calling _exit or _Exit); processes that locked nothing
write nothing; pinshim report adds them all up.

Environment (set by meson): PINSHIM_LIB, FAKE_CUDART, PINSHIM_REPORT, ROUND2.
The fake CUDA runtime stands in for CUDA (PINSHIM_CONTEXT=create: these
processes never initialise CUDA themselves).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

# Under a cross build's emulator (tests/meson.build sets PINSHIM_TEST_EMULATOR)
# the build machine's programs (python3 itself, true, sh) cannot load the shim,
# which is another architecture's.
EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")


def foreign(program):
    """Why a test that runs program under the shim skips under EMULATOR."""
    return (f"under {EMULATOR}: {program} is the build machine's program, of another "
            "architecture than the shim, and cannot load it")


HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 4 << 20


def shim_environment(directory, **extra):
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PINSHIM_", "FAKE_CUDART")) and name != "LD_PRELOAD"}
    environment.update(
        LD_PRELOAD=os.environ["PINSHIM_LIB"],
        PINSHIM_CUDART=os.environ["FAKE_CUDART"],
        PINSHIM_CONTEXT="create",
        # Registered inside the lock call: a process that ends right after
        # its lock has registered it (with the registration thread it may
        # still be queued; test_async_exit covers that).
        PINSHIM_ASYNC="off",
        PINSHIM_STATS=os.path.join(directory, "stats.%h.%p.json"),
    )
    environment.update(extra)
    return environment


def stats_files(directory):
    documents = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                documents.append(json.load(handle))
    return documents


def report(directory, *arguments, environment=None):
    """pinshim report --json of directory (more options before it), as a document."""
    result = subprocess.run(
        [sys.executable, os.environ["PINSHIM_REPORT"], "--json", *arguments, directory],
        env=environment, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(result.stdout + result.stderr)
    return json.loads(result.stdout)


class Multiprocessing(unittest.TestCase):
    def run_workers(self, method):
        with tempfile.TemporaryDirectory() as directory:
            result = subprocess.run(
                [sys.executable, os.path.join(HERE, "mp_workers.py"), method],
                env=shim_environment(directory), capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            workers = {int(line.split()[1]) for line in result.stdout.splitlines()
                       if line.startswith("worker ")}
            self.assertEqual(len(workers), 3, result.stdout)  # two in the pool, one Process
            documents = stats_files(directory)
            by_pid = {document["pid"]: document for document in documents}
            # Every locking process reported, and only they (the parent and
            # spawn's helper processes locked nothing).
            self.assertEqual(set(by_pid), workers, (sorted(by_pid), sorted(workers)))
            for pid, document in by_pid.items():
                with self.subTest(pid=pid):
                    self.assertEqual(document["register"]["ok"], 1, document)
                    self.assertEqual(document["register"]["bytes"], SIZE, document)
                    self.assertEqual(document["live"]["ranges"], 1, document)
                    if method == "fork":
                        self.assertEqual(document["ended_by"], "_exit", document)
                        self.assertTrue(document["fork_child"], document)
            merged = report(directory)
            totals = merged["totals"]
            self.assertEqual(totals["registrations"], 3, totals)
            self.assertEqual(totals["bytes"], 3 * SIZE, totals)
            return documents

    def test_fork_context(self):
        self.run_workers("fork")

    def test_spawn_context(self):
        self.run_workers("spawn")


class ExitWithoutHandlers(unittest.TestCase):
    def test_exit_and_capital_exit(self):
        for how in ("_exit", "_Exit"):
            with self.subTest(how=how), tempfile.TemporaryDirectory() as directory:
                result = subprocess.run([os.environ["ROUND2"], "exit_now", how],
                                        env=shim_environment(directory), capture_output=True,
                                        text=True, timeout=60)
                self.assertEqual(result.returncode, 3, result.stdout + result.stderr)
                documents = stats_files(directory)
                self.assertEqual(len(documents), 1, documents)
                document = documents[0]
                self.assertEqual(document["ended_by"], "_exit", document)
                self.assertEqual(document["register"]["ok"], 1, document)
                # Held at _exit: counted live, not unregistered (the kernel
                # drops the pins with the process).
                self.assertEqual(document["live"]["ranges"], 1, document)
                self.assertEqual(document["unregister"]["exit"], 0, document)

    def test_async_exit(self):
        """With the registration thread, a lock followed at once by _exit may
        end queued: counted as such, never lost from the numbers."""
        with tempfile.TemporaryDirectory() as directory:
            result = subprocess.run([os.environ["ROUND2"], "exit_now"],
                                    env=shim_environment(directory, PINSHIM_ASYNC="on"),
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 3, result.stderr)
            document = stats_files(directory)[0]
            self.assertEqual(document["register"]["ok"] + document["thread"]["queued_at_exit"],
                             1, document)
            self.assertEqual(document["live"]["ranges"], document["register"]["ok"], document)

    def test_exit_during_a_registration(self):
        """_exit while the registration thread is inside the registration:
        the shim waits for that call (as exit does), so the range is counted
        as registered and live, not lost between the counts (found under
        ASan's timing, reached here on purpose)."""
        with tempfile.TemporaryDirectory() as directory:
            result = subprocess.run([os.environ["ROUND2"], "exit_now"],
                                    env=shim_environment(
                                        directory, PINSHIM_ASYNC="on", ROUND2_EXIT_IN_FLIGHT="1",
                                        FAKE_CUDA_REGISTER_SECONDS_PER_GIB="50"),
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 3, result.stdout + result.stderr)
            self.assertIn("a registration is in flight", result.stdout)
            document = stats_files(directory)[0]
            self.assertEqual(document["register"]["ok"], 1, document)
            self.assertEqual(document["thread"]["queued_at_exit"], 0, document)
            self.assertEqual(document["live"]["ranges"], 1, document)

    def test_summary_on_stderr(self):
        with tempfile.TemporaryDirectory() as directory:
            result = subprocess.run([os.environ["ROUND2"], "exit_now"],
                                    env=shim_environment(directory, PINSHIM_STATS="1"),
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 3, result.stderr)
            self.assertIn("registered 1 (4.0 MiB", result.stderr)
            self.assertIn("live at exit 1 (4.0 MiB)", result.stderr)


class NothingToSay(unittest.TestCase):
    def test_a_pipeline_of_processes_that_lock_nothing_writes_nothing(self):
        with tempfile.TemporaryDirectory() as directory:
            result = subprocess.run(["sh", "-c", "ls / | wc -l; true; echo done"],
                                    env=shim_environment(directory), capture_output=True,
                                    text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(stats_files(directory), [])


if __name__ == "__main__":
    if EMULATOR:
        print(f"SKIP: {foreign('python3 (and sh)')}")
        sys.exit(77)
    for name in ("PINSHIM_LIB", "FAKE_CUDART", "PINSHIM_REPORT", "ROUND2"):
        if not os.environ.get(name):
            print(f"{name} is not set (run through meson test)")
            sys.exit(1)
    unittest.main(verbosity=2)
