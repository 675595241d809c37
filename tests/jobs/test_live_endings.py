#!/usr/bin/env python3
"""Issue 19: nothing is lost, however a process ends, and a running job can
be watched. Real processes under the shim (the fake runtime, create mode),
ended each way on purpose: multiprocessing's Pool.__exit__ (SIGTERM to its
workers), SIGTERM and SIGKILL to a process holding registrations, _exit, and
a process still running when the report is made; pinshim top --once while a
process holds registrations. Live records go where they go by default (the
per-user runtime directory, here XDG_RUNTIME_DIR of the test's own) and
pinshim report DIR finds them through their stats path. The fake runtime's
log says how many registrations it saw: the report must find as many.

Environment (set by meson): PINSHIM_LIB, FAKE_CUDART, PINSHIM_REPORT,
PINSHIM_TOP, LIVE_ENDINGS.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

from test_job_stats import report, shim_environment

EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")
SIZE = 4 << 20


class JobCase(unittest.TestCase):
    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory(prefix="pinshim-endings-")
        self.directory = self.temporary.name
        self.stats = os.path.join(self.directory, "stats")
        self.runtime = os.path.join(self.directory, "run")
        os.mkdir(self.stats)
        os.mkdir(self.runtime, 0o700)
        self.log = os.path.join(self.directory, "fake.log")

    def tearDown(self):
        self.temporary.cleanup()

    def environment(self, **extra):
        return shim_environment(self.stats, XDG_RUNTIME_DIR=self.runtime, FAKE_CUDART_LOG=self.log,
                                **extra)

    def runtime_registrations(self):
        """Registrations the fake runtime saw succeed ("register PID ADDR
        SIZE FLAGS ERROR" lines with error 0)."""
        if not os.path.exists(self.log):
            return 0
        with open(self.log, encoding="utf-8") as handle:
            return sum(1 for line in handle
                       if line.startswith("register ") and line.split()[-1] == "0")

    def report(self, *arguments):
        return report(self.stats, "--all", *arguments,
                      environment=dict(os.environ, XDG_RUNTIME_DIR=self.runtime))

    def top_once(self, *arguments):
        result = subprocess.run(
            [sys.executable, os.environ["PINSHIM_TOP"], "--once", *arguments],
            env={name: value for name, value in dict(os.environ,
                                                     XDG_RUNTIME_DIR=self.runtime).items()
                 if not name.startswith("PINSHIM_")},
            capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout

    def records(self):
        directory = os.path.join(self.runtime, "pinshim")
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


POOL_WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pool_workers.py")


class PoolExit(JobCase):
    """Pool.__exit__ ends its workers with SIGTERM: each worker's record
    holds what it registered."""

    def run_pools(self, *pools):
        result = subprocess.run([sys.executable, POOL_WORKERS, *pools], env=self.environment(),
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return {int(pid) for pid in result.stdout.split()}

    def check(self, workers, registrations):
        seen = self.runtime_registrations()
        self.assertEqual(seen, registrations, "the runtime saw another number than the test")
        document = self.report()
        totals = document["totals"]
        self.assertEqual(totals["registrations"], seen, totals)
        self.assertEqual(totals["bytes"], seen * SIZE, totals)
        self.assertEqual(totals["live_ranges"], seen, totals)
        by_pid = {row["pid"]: row for row in document["processes"]}
        self.assertTrue(workers <= set(by_pid), (sorted(workers), sorted(by_pid)))
        # terminate() sends SIGTERM to workers waiting for tasks; a worker
        # that has already seen the end of its queue leaves by itself first
        # (sys.exit in spawn's, os._exit in fork's). Either way it counts.
        for pid in workers:
            with self.subTest(pid=pid):
                row = by_pid[pid]
                self.assertIn((row["ended_by"], row["source"]),
                              {("killed", "live"), ("exit", "json"), ("_exit", "json")}, row)
        self.assertEqual(sum(totals["ended"].values()), len(by_pid), totals)

    def test_spawn_pool(self):
        """The issue's one: 6 registrations, the report found 0."""
        workers = self.run_pools("spawn:6")
        self.check(workers, 6)

    def test_fork_and_spawn_pools_together(self):
        """The issue's other: 10 registrations, the stats files said 6."""
        workers = self.run_pools("fork:4", "spawn:6")
        self.check(workers, 10)


class Signals(JobCase):
    def start(self):
        process = subprocess.Popen([os.environ["LIVE_ENDINGS"]], env=self.environment(),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   bufsize=1)
        def finish():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=60)
            for stream in (process.stdin, process.stdout):
                if not stream.closed:
                    stream.close()
        self.addCleanup(finish)
        return process

    def say(self, process, command, count=1):
        for _ in range(count):
            process.stdin.write(command + "\n")
            process.stdin.flush()
            while True:
                line = process.stdout.readline()
                self.assertTrue(line, f"the program ended before answering {command}")
                if line.startswith(("ok ", "failed ")):
                    self.assertTrue(line.startswith("ok "), line)
                    break

    def killed_by(self, signal_number, locks):
        process = self.start()
        self.say(process, "lock", locks)
        process.send_signal(signal_number)
        self.assertEqual(process.wait(timeout=60), -signal_number)
        document = self.report()
        rows = [row for row in document["processes"] if row["pid"] == process.pid]
        self.assertEqual(len(rows), 1, document["processes"])
        row = rows[0]
        self.assertEqual(row["ended_by"], "killed", row)
        self.assertEqual(row["registrations"], locks, row)
        self.assertEqual(row["bytes"], locks << 20, row)
        self.assertEqual(row["live_ranges"], locks, row)
        self.assertEqual(self.runtime_registrations(), locks)
        self.assertEqual(row["job"], self.stats, "the record belongs to the job's directory")

    def test_sigterm(self):
        """scancel, timeout, torchrun tearing down the other ranks."""
        self.killed_by(signal.SIGTERM, 3)

    def test_sigkill(self):
        """The OOM killer."""
        self.killed_by(signal.SIGKILL, 5)

    def test_underscore_exit(self):
        process = self.start()
        self.say(process, "lock", 2)
        process.stdin.write("_exit\n")
        process.stdin.flush()
        self.assertEqual(process.wait(timeout=60), 0)
        self.assertEqual(self.records(), [], "a clean end left its record")
        document = self.report()
        row = [row for row in document["processes"] if row["pid"] == process.pid][0]
        self.assertEqual((row["ended_by"], row["source"], row["registrations"]),
                         ("_exit", "json", 2), row)

    def test_exit(self):
        process = self.start()
        self.say(process, "lock", 2)
        process.stdin.close()
        self.assertEqual(process.wait(timeout=60), 0)
        self.assertEqual(self.records(), [])
        row = [row for row in self.report()["processes"] if row["pid"] == process.pid][0]
        self.assertEqual((row["ended_by"], row["source"], row["registrations"]),
                         ("exit", "json", 2), row)

    def test_still_running_then_killed(self):
        process = self.start()
        self.say(process, "lock", 2)
        row = [row for row in self.report()["processes"] if row["pid"] == process.pid][0]
        self.assertEqual((row["ended_by"], row["registrations"], row["live_ranges"]),
                         ("running", 2, 2), row)
        process.kill()
        process.wait(timeout=60)
        row = [row for row in self.report()["processes"] if row["pid"] == process.pid][0]
        self.assertEqual(row["ended_by"], "killed", row)

    def test_top_shows_a_running_process_as_it_changes(self):
        process = self.start()
        self.say(process, "lock", 3)
        lines = self.top_once().splitlines()
        header = lines[1].split()
        rows = [line.split() for line in lines[2:] if line.split()[1:2] == [str(process.pid)]]
        self.assertEqual(len(rows), 1, "\n".join(lines))
        self.assertIn("MiB", header)
        row = rows[0]
        self.assertIn("3.0", row, "registered now: 3 MiB")
        # Exact bytes, after one of the three buffers went.
        self.say(process, "unlock")
        lines = self.top_once("--bytes").splitlines()
        rows = [line.split() for line in lines[2:] if line.split()[1:2] == [str(process.pid)]]
        self.assertEqual(len(rows), 1, "\n".join(lines))
        self.assertIn(str(2 << 20), rows[0])
        process.kill()
        process.wait(timeout=60)
        self.assertNotIn(str(process.pid), self.top_once(), "a killed process is not shown")


if __name__ == "__main__":
    if EMULATOR:
        print(f"SKIP: under {EMULATOR}: python3 is the build machine's program and cannot "
              "load the shim, which is another architecture's")
        sys.exit(77)
    for name in ("PINSHIM_LIB", "FAKE_CUDART", "PINSHIM_REPORT", "PINSHIM_TOP", "LIVE_ENDINGS"):
        if not os.environ.get(name):
            print(f"{name} is not set (run through meson test)")
            sys.exit(1)
    unittest.main(verbosity=2)
