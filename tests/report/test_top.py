#!/usr/bin/env python3
"""pinshim-top on live records written by live_record_writer.py: --once with
running, killed and other hosts' records (MiB and --bytes), the order of the
rows, the NUMA and huge pages columns and lines, the default directories
(XDG_RUNTIME_DIR, /tmp/pinshim-UID, PINSHIM_LIVE, PINSHIM_STATS), refreshing
into a pipe and on a terminal until Ctrl-C, usage errors, and pinshim top
through the C command.

Environment (set by meson): PINSHIM_TOP (the script in the source tree),
PINSHIM_CLI (the pinshim command of the build tree).
"""

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import live_record_writer as writer  # noqa: E402
from shim_job import (BUFFER_BYTES, ShimCase, parse_exposition, sample,  # noqa: E402
                      samples_of)
from test_report import check_conventions, run_report  # noqa: E402

TOP = os.environ.get("PINSHIM_TOP", "")
HOST = socket.gethostname()
HEADING = ["host", "pid", "program", "state", "registered MiB", "ranges", "pending", "queued",
           "failures", "last change", "runtime"]


def default_runtime():
    """The runtime directory without XDG_RUNTIME_DIR."""
    return (f"/dev/shm/pinshim-{os.getuid()}" if os.path.isdir("/dev/shm")
            else f"/tmp/pinshim-{os.getuid()}")


def searched(*directories):
    """What the title says of DIRs given: they, and the runtime directory for
    the records of processes whose statistics go to them."""
    whom = "it" if len(directories) == 1 else "one of them"
    return (f"{', '.join(directories)}, and in {default_runtime()} those of processes whose "
            f"statistics go to {whom}")


def clean_environment(**extra):
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("PINSHIM_") and name not in ("LD_PRELOAD",
                                                                       "XDG_RUNTIME_DIR")}
    environment.update(extra)
    return environment


def run_top(*arguments, command=None, environment=None):
    return run_report(command=command or [sys.executable, TOP, *arguments],
                      environment=environment or clean_environment())


def cells(line):
    return re.split(r"\s{2,}", line.strip())


def table(stdout):
    """(title, [rows of cells]) of one --once output."""
    lines = stdout.splitlines()
    title = lines[0]
    if len(lines) > 1 and lines[1].startswith("no running process"):
        return title, []
    assert cells(lines[1])[:4] == HEADING[:4], lines[1]
    # The NUMA and huge pages lines under the table (when the records carry
    # placement and page sizes).
    return title, [cells(line) for line in lines[2:]
                   if not line.startswith(("NUMA, ", "huge pages: "))]


class TopCase(writer.RecordsCase):
    prefix = "pinshim-top-"

    def write_running(self, directory=None, name=None, live_bytes=64 << 20, **options):
        pid, ticks = self.running_child()
        path = os.path.join(directory or self.directory, name or f"{HOST}.{pid}.live")
        values = writer.busy_values(live_bytes=live_bytes, **options.pop("values", {}))
        writer.write_record(path, values, pid=pid, ticks=ticks, **options)
        return pid

    def write_killed(self, directory=None):
        pid = writer.gone_pid()
        path = os.path.join(directory or self.directory, f"{HOST}.{pid}.live")
        writer.write_record(path, writer.busy_values(live_bytes=512 << 20), pid=pid, ticks=1)
        return pid


class Once(TopCase):
    def test_running_shown_killed_not_in_mib_and_bytes(self):
        pid = self.write_running(values={"last_change": time.time() - 150,
                                         "deferred.pending_ranges_at_exit": 1,
                                         "thread.queued_at_exit": 2, "register.failed": 1,
                                         "unregister.failed": 2},
                                 live_bytes=(64 << 20) + (1 << 19))
        self.write_killed()
        result = run_top("--once", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        title, rows = table(result.stdout)
        self.assertTrue(title.startswith("pinshim top  "), title)
        self.assertIn("1 process running", title)
        self.assertIn(f"(records in {searched(self.directory)})", title)
        self.assertEqual(cells(result.stdout.splitlines()[1]), HEADING)
        self.assertEqual(rows, [[HOST, str(pid), "train", "running", "64.5", "2", "1", "2", "3",
                                 "2 min ago", "-"]])
        result = run_top("--once", "--bytes", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        heading = cells(result.stdout.splitlines()[1])
        self.assertEqual(heading[4], "registered bytes")
        _, rows = table(result.stdout)
        self.assertEqual(rows[0][4], str((64 << 20) + (1 << 19)))

    def test_nothing_running(self):
        self.write_killed()
        result = run_top("--once", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(len(lines), 2, result.stdout)
        self.assertIn("0 processes running", lines[0])
        self.assertEqual(lines[1],
                         f"no running process has a live record in {searched(self.directory)}")

    def test_most_bytes_first_other_hosts_unknown_forks_named(self):
        small = self.write_running(live_bytes=1 << 20, values={"last_change": 0})
        big = self.write_running(live_bytes=3 << 30, fork_child=True, exe="/opt/bin/worker",
                                 values={"last_change": time.time() - 3})
        writer.write_record(os.path.join(self.directory, "elsewhere.live"),
                            writer.busy_values(live_bytes=2 << 20), host="node9.example",
                            pid=4242, ticks=1)
        exiting = self.write_running(live_bytes=0, state=writer.EXITING)
        writer.write_record(os.path.join(self.directory, "exec.live"), writer.busy_values(),
                            state=writer.REPLACED, ended_by="exec", ticks=1)
        with open(os.path.join(self.directory, "bad.live"), "wb") as handle:
            handle.write(b"PSHM")
        result = run_top("--once", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        title, rows = table(result.stdout)
        self.assertIn("3 processes running, 1 unknown (other hosts), 1 unreadable record",
                      title)
        self.assertEqual([(row[1], row[2], row[3], row[4]) for row in rows],
                         [(str(big), "worker (fork)", "running", "3072.0"),
                          ("4242", "train", "unknown", "2.0"),
                          (str(small), "train", "running", "1.0"),
                          (str(exiting), "train", "exiting", "0.0")])
        self.assertEqual(rows[0][-2], "3 s ago")
        self.assertEqual(rows[2][-2], "-")

    def test_several_directories(self):
        other = os.path.join(self.directory, "other")
        os.mkdir(other)
        first = self.write_running()
        second = self.write_running(directory=other)
        result = run_top("--once", self.directory, other)
        self.assertEqual(result.returncode, 0, result.stderr)
        title, rows = table(result.stdout)
        self.assertIn(f"(records in {searched(self.directory, other)})", title)
        self.assertEqual(sorted(int(row[1]) for row in rows), sorted([first, second]))


class DefaultDirectories(TopCase):
    def titled_directories(self, environment):
        result = run_top("--once", environment=environment)
        self.assertEqual(result.returncode, 0, result.stderr)
        title = result.stdout.splitlines()[0]
        return title[title.index("(records in ") + len("(records in "):-1].split(", "), result

    def test_xdg_runtime_dir_of_ones_own(self):
        runtime = os.path.join(self.directory, "run")
        os.mkdir(runtime, 0o700)
        records = os.path.join(runtime, "pinshim")
        os.mkdir(records, 0o700)
        pid = self.write_running(directory=records)
        directories, result = self.titled_directories(clean_environment(XDG_RUNTIME_DIR=runtime))
        self.assertEqual(directories, [records])
        self.assertEqual([int(row[1]) for row in table(result.stdout)[1]], [pid])

    def test_otherwise_dev_shm_or_tmp_pinshim_uid(self):
        fallback = default_runtime()
        not_ours = os.path.join(self.directory, "not_ours")
        os.mkdir(not_ours)
        if os.geteuid() == 0:
            os.chown(not_ours, 65534, 65534)
        else:
            not_ours = "/"  # root's
        cases = {"unset": clean_environment(),
                 "relative": clean_environment(XDG_RUNTIME_DIR="run/user"),
                 "missing": clean_environment(XDG_RUNTIME_DIR=os.path.join(self.directory, "no")),
                 "a file": clean_environment(XDG_RUNTIME_DIR=TOP),
                 "not ours": clean_environment(XDG_RUNTIME_DIR=not_ours)}
        for name, environment in cases.items():
            with self.subTest(case=name):
                directories, _ = self.titled_directories(environment)
                self.assertEqual(directories, [fallback])

    def test_pinshim_live_and_the_stats_directory(self):
        live = os.path.join(self.directory, "live")
        stats = os.path.join(self.directory, f"stats-{HOST}")
        os.mkdir(live)
        os.mkdir(stats)
        first = self.write_running(directory=live)
        second = self.write_running(directory=stats, name=f"stats.{HOST}.1.json.live")
        template = os.path.join(self.directory, "stats-%h", "stats.%h.%p.json")
        directories, result = self.titled_directories(clean_environment(
            PINSHIM_LIVE=live, PINSHIM_STATS=template, XDG_RUNTIME_DIR=self.directory))
        self.assertEqual(directories, [live, stats])
        self.assertEqual(sorted(int(row[1]) for row in table(result.stdout)[1]),
                         sorted([first, second]))
        # PINSHIM_LIVE that is no directory (off, auto): the runtime directory;
        # PINSHIM_STATS that is no file (1, stderr) or whose directory has %p:
        # nothing more.
        runtime = os.path.join(self.directory, "pinshim")
        for live_value, stats_value in (("off", "1"), ("auto", "stderr"),
                                        ("", os.path.join(self.directory, "%p", "s.json"))):
            with self.subTest(live=live_value, stats=stats_value):
                directories, _ = self.titled_directories(clean_environment(
                    PINSHIM_LIVE=live_value, PINSHIM_STATS=stats_value,
                    XDG_RUNTIME_DIR=self.directory))
                self.assertEqual(directories, [runtime])
        # A relative template: its directory as given.
        directories, _ = self.titled_directories(clean_environment(
            PINSHIM_STATS="stats.%p.json", XDG_RUNTIME_DIR=self.directory))
        self.assertEqual(directories, [runtime, "."])


class Refresh(TopCase):
    def read_until(self, stream_fd, predicate, what):
        """Reads from a file descriptor until predicate(text) holds."""
        text = b""
        deadline = time.monotonic() + 60  # a limit for a broken run, not a measurement
        while not predicate(text.decode(errors="replace")):
            remaining = deadline - time.monotonic()
            self.assertGreater(remaining, 0, f"no {what} in: {text[-2000:]!r}")
            ready, _, _ = select.select([stream_fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(stream_fd, 65536)
                except OSError:  # a pty whose other side closed
                    chunk = b""
                self.assertTrue(chunk, f"output ended before {what}: {text[-2000:]!r}")
                text += chunk
        return text.decode(errors="replace")

    def test_into_a_pipe_one_table_after_the_other_until_ctrl_c(self):
        pid = self.write_running()
        process = subprocess.Popen([sys.executable, TOP, "--interval", "0.05", self.directory],
                                   env=clean_environment(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        try:
            text = self.read_until(process.stdout.fileno(),
                                   lambda text: text.count("pinshim top  ") >= 3, "3 tables")
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 0, stderr)
        self.assertEqual(stderr, b"")
        self.assertNotIn("\033[", text)
        blocks = text.split("\n\n")
        for block in blocks[:2]:  # the last may be cut
            lines = block.splitlines()
            self.assertTrue(lines[0].startswith("pinshim top  "), block)
            self.assertEqual(cells(lines[1]), HEADING)
            self.assertEqual(cells(lines[2])[1], str(pid))

    def test_on_a_terminal_in_place(self):
        self.write_running()
        leader, follower = pty.openpty()
        process = subprocess.Popen([sys.executable, TOP, "--interval", "0.05", self.directory],
                                   env=clean_environment(), stdout=follower,
                                   stderr=subprocess.PIPE)
        os.close(follower)
        try:
            text = self.read_until(leader, lambda text: text.count("\033[H\033[2J") >= 2,
                                   "2 redraws")
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
            os.close(leader)
        self.assertEqual(process.returncode, 0, stderr)
        self.assertEqual(stderr, b"")
        self.assertTrue(text.startswith("\033[H\033[2Jpinshim top  "), text[:200])


class Usage(TopCase):
    def test_usage_errors_exit_2(self):
        missing = os.path.join(self.directory, "missing")
        cases = {("--interval", "0"): "--interval",
                 ("--interval", "soon"): "'soon' is not a number of seconds",
                 ("--frobnicate",): "unrecognized arguments",
                 (missing,): f"{missing}: no such directory",
                 (TOP,): f"{TOP}: not a directory"}
        for arguments, message in cases.items():
            with self.subTest(arguments=arguments):
                result = run_top("--once", *arguments)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("usage: pinshim-top", result.stderr)
                self.assertIn(message, result.stderr)
                self.assertEqual(result.stdout, "")

    def test_help(self):
        result = run_top("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        usage = " ".join(result.stdout.split("\n\n")[0].split())
        self.assertEqual(usage, "usage: pinshim-top [-h] [--once] [--bytes] [--interval SECONDS] "
                                "[--prometheus] [--prometheus-file PATH] [DIR ...]")
        self.assertIn("exit status", result.stdout)

    def test_without_pinshim_report_beside_it(self):
        alone = os.path.join(self.directory, "pinshim-top")
        shutil.copy(TOP, alone)
        result = run_top(command=[sys.executable, alone, "--once", self.directory])
        self.assertEqual(result.returncode, 2)
        self.assertIn("pinshim-report is not installed next to pinshim-top", result.stderr)

    def test_no_bytecode_beside_the_scripts(self):
        copy = os.path.join(self.directory, "bin")
        os.mkdir(copy)
        for name in ("pinshim-top", "pinshim-report"):
            shutil.copy(os.path.join(os.path.dirname(TOP), name), copy)
        result = run_top(command=[sys.executable, os.path.join(copy, "pinshim-top"), "--once",
                                  self.directory])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(copy)), ["pinshim-report", "pinshim-top"])


class JobDirectory(ShimCase):
    """pinshim top DIR, DIR a job's statistics directory: its running
    processes keep their records in the runtime directory (issue 29: "no
    running process has a live record in stats")."""

    def top(self, *arguments):
        result = run_top("--once", *arguments, environment=self.reader_environment())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def test_shows_the_jobs_running_processes(self):
        other_job = os.path.join(self.directory, "other-stats")
        os.mkdir(other_job)
        process = self.start(2)
        other = self.start(1, stats=other_job)
        ended = self.start(1)
        ended.end("exit")
        self.assertEqual(os.listdir(self.stats), [os.path.basename(self.stats_path(ended.pid))])
        runtime = os.path.join(self.runtime, "pinshim")
        self.assertEqual(len(os.listdir(runtime)), 2, "the running ones' records")
        output = self.top("--bytes", self.stats)
        title, rows = table(output)
        self.assertIn("1 process running", title)
        # The shim located the registered pages (issue 29): on a node, none remote.
        self.assertRegex(output, r"\nNUMA, bytes registered so far: node \d+ \d+ bytes")
        self.assertIn(f"(records in {self.stats}, and in {runtime} those of processes whose "
                      "statistics go to it)", title)
        self.assertEqual([(row[1], row[2], row[3], row[4]) for row in rows],
                         [(str(process.pid), "live_endings", "running", str(2 * BUFFER_BYTES))])
        # The vendor and the call, from the live record (issue 27).
        self.assertRegex(rows[0][-1], r"^CUDA cu(da)?(Mem)?HostRegister$")
        # Each job's own; both with two directories; the runtime directory
        # itself shows every record there.
        _, rows = table(self.top(other_job))
        self.assertEqual([row[1] for row in rows], [str(other.pid)])
        _, rows = table(self.top(self.stats, other_job))
        self.assertEqual(sorted(row[1] for row in rows), sorted([str(process.pid),
                                                                 str(other.pid)]))
        title, rows = table(self.top(runtime))
        self.assertIn(f"(records in {runtime})", title)
        self.assertEqual(len(rows), 2)
        # Once the process is gone, so is its row.
        process.end(signal.SIGKILL)
        title, rows = table(self.top(self.stats))
        self.assertEqual(rows, [])

    def test_prometheus_of_the_job(self):
        process = self.start(3)
        exposition = self.top("--prometheus", self.stats)
        families = parse_exposition(exposition)
        check_conventions(self, families)
        samples = samples_of(families)
        labels = dict(stats_dir=self.stats, host=HOST, pid=process.pid,
                      exe=os.path.realpath(os.environ["LIVE_ENDINGS"]))
        self.assertEqual(sample(samples, "pinshim_process_live_registered_bytes", **labels),
                         3 * BUFFER_BYTES)
        self.assertEqual(sample(samples, "pinshim_process_registrations_total", **labels), 3)
        self.assertEqual(sample(samples, "pinshim_processes", stats_dir=self.stats,
                                ended="running"), 1)


class Prometheus(TopCase):
    def test_running_processes_once(self):
        first = self.write_running(live_bytes=5 << 20, stats_path="/jobs/a/s.json")
        second = self.write_running(live_bytes=7 << 20, stats_path="/jobs/a/t.json")
        third = self.write_running(live_bytes=1 << 20)
        self.write_killed()
        result = run_top("--prometheus", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        families = parse_exposition(result.stdout)
        check_conventions(self, families)
        samples = samples_of(families)
        # A job is the directory of its processes' statistics ("" without).
        self.assertEqual(sample(samples, "pinshim_processes", stats_dir="/jobs/a",
                                ended="running"), 2)
        self.assertEqual(sample(samples, "pinshim_live_registered_bytes", stats_dir="/jobs/a"),
                         12 << 20)
        self.assertEqual(sample(samples, "pinshim_processes", stats_dir="", ended="running"), 1)
        pids = {labels_pid for name, labels in samples
                if name == "pinshim_process_live_registered_bytes"
                for key, labels_pid in labels if key == "pid"}
        self.assertEqual(pids, {str(first), str(second), str(third)}, "the killed one is not")
        self.assertEqual(sample(samples, "pinshim_process_live_registered_bytes", stats_dir="",
                                host=HOST, pid=third, exe="/usr/bin/train"), 1 << 20)

    def test_file_once(self):
        self.write_running()
        path = os.path.join(self.directory, "top.prom")
        result = run_top("--once", "--prometheus-file", path, self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "")
        with open(path, encoding="utf-8") as handle:
            written = handle.read()
        self.assertEqual(written, run_top("--prometheus", self.directory).stdout)
        self.assertEqual(sorted(name for name in os.listdir(self.directory)
                                if not name.endswith(".live")), ["top.prom"])

    def test_file_at_each_refresh_until_ctrl_c(self):
        self.write_running(live_bytes=1 << 20)
        path = os.path.join(self.directory, "top.prom")
        process = subprocess.Popen([sys.executable, TOP, "--interval", "0.05",
                                    "--prometheus-file", path, self.directory],
                                   env=clean_environment(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        try:
            self.assertTrue(wait_for(lambda: os.path.exists(path)), "no file written")
            # A process that starts: a later refresh writes its series.
            pid = self.write_running(live_bytes=3 << 20)
            self.assertTrue(wait_for(lambda: f'pid="{pid}"' in read_text(path)),
                            "the file was not rewritten")
        finally:
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 0, stderr)
        self.assertEqual(stdout, b"")

    def test_bad_values(self):
        missing = os.path.join(self.directory, "missing", "top.prom")
        result = run_top("--prometheus-file", missing, self.directory)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f"pinshim-top: error: argument --prometheus-file: {missing}: no such "
                      f"directory {os.path.dirname(missing)}", result.stderr)
        result = run_top("--once", "--prometheus-file", "/proc/top.prom", self.directory)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"pinshim-top: --prometheus-file /proc/top.prom: "
                                        r"/proc/top.prom.tmp.\d+: ")


# The NUMA fields of a live record as this reader expects the C side to lay
# them out (issue 29; not written by the library yet): per node, bytes and
# local bytes; remote and unknown bytes; each device's node.
NODES = 4
NUMA_FIELDS = [("numa.nodes[].bytes", writer.COUNT, NODES, 16, 8192),
               ("numa.nodes[].local_bytes", writer.COUNT, NODES, 16, 8200),
               ("numa.remote_bytes", writer.COUNT, 1, 8, 8192 + 16 * NODES),
               ("numa.unknown_bytes", writer.COUNT, 1, 8, 8200 + 16 * NODES),
               ("numa.device_nodes[]", writer.INT32, writer.DEVICES, 4, 8208 + 16 * NODES)]


def numa_values(nodes, local, remote, unknown, device_nodes):
    return {"numa.nodes[].bytes": nodes, "numa.nodes[].local_bytes": local,
            "numa.remote_bytes": remote, "numa.unknown_bytes": unknown,
            "numa.device_nodes[]": device_nodes}


class Numa(TopCase):
    def test_remote_column_and_bytes_per_node(self):
        placed = self.write_running(
            live_bytes=96 << 20, devices=[(0, 3, 96 << 20), (1, 1, 1 << 20)],
            extra_fields=NUMA_FIELDS,
            values=numa_values([64 << 20, 32 << 20, 0, 0], [64 << 20, 0, 0, 0], 32 << 20, 0,
                               [0, 0, -1, -1]))
        older = self.write_running(live_bytes=1 << 20)
        result = run_top("--once", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(cells(lines[1]), HEADING[:5] + ["remote MiB"] + HEADING[5:])
        remote = {row[1]: row[5] for row in map(cells, lines[2:4])}
        self.assertEqual(remote, {str(placed): "32.0", str(older): "-"})
        self.assertEqual(lines[4], "NUMA, bytes registered so far: node 0 64.0 MiB (64.0 MiB "
                                   "local), node 1 32.0 MiB (0.0 MiB local); remote 32.0 MiB "
                                   "(1 process)")
        # The report reads the same fields; the devices' nodes are those of
        # the devices the process registered with.
        document = json.loads(run_report("--json", self.directory).stdout)
        numa = {row["pid"]: row["numa"] for row in document["processes"]}
        self.assertEqual(numa[placed], {
            "nodes": {"0": {"bytes": 64 << 20, "local_bytes": 64 << 20},
                      "1": {"bytes": 32 << 20, "local_bytes": 0}},
            "remote_bytes": 32 << 20, "unknown_bytes": 0, "device_nodes": {"0": 0, "1": 0}})
        self.assertIsNone(numa[older])
        exposition = run_top("--prometheus", self.directory).stdout
        samples = samples_of(parse_exposition(exposition))
        self.assertEqual(sample(samples, "pinshim_numa_registered_bytes_total", stats_dir="",
                                node=1), 32 << 20)
        self.assertEqual(sample(samples, "pinshim_numa_remote_registered_bytes_total",
                                stats_dir=""), 32 << 20)


# The huge pages fields of a live record as src/live_record.c lays them out
# (issue 36): the kernel's THP mode (text), then the counts; past the NUMA ones.
HUGE_PAGE_COUNTS = ["huge_bytes", "small_bytes", "unknown_bytes", "made_bytes",
                    "had_pages_bytes", "no_block_bytes", "refused_bytes", "stopped_bytes",
                    "aligned_allocations", "backed_off"]
HUGE_FIELDS = ([("huge_pages.kernel", writer.TEXT, 1, 16, 9000)]
               + [(f"huge_pages.{name}", writer.COUNT, 1, 8, 9016 + 8 * index)
                  for index, name in enumerate(HUGE_PAGE_COUNTS)])


def huge_values(kernel=b"madvise", **counts):
    values = {"huge_pages.kernel": kernel}
    values.update({f"huge_pages.{name}": counts.get(name, 0) for name in HUGE_PAGE_COUNTS})
    return values


class HugePages(TopCase):
    def test_huge_column_and_the_bytes_by_page_size(self):
        placed = self.write_running(
            live_bytes=64 << 20, extra_fields=HUGE_FIELDS,
            values=huge_values(huge_bytes=48 << 20, small_bytes=16 << 20, made_bytes=32 << 20,
                               had_pages_bytes=16 << 20, aligned_allocations=1))
        older = self.write_running(live_bytes=1 << 20)
        result = run_top("--once", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        lines = result.stdout.splitlines()
        self.assertEqual(cells(lines[1]), HEADING[:5] + ["huge"] + HEADING[5:])
        shares = {row[1]: row[5] for row in map(cells, lines[2:4])}
        self.assertEqual(shares, {str(placed): "75%", str(older): "-"})
        self.assertEqual(lines[4], "huge pages: 48.0 MiB locked on huge pages (75%), 16.0 MiB "
                                   "on small, 0.0 MiB unknown; made huge by the shim 32.0 MiB; "
                                   "THP madvise")
        self.assertEqual(len(lines), 5)
        # The report reads the same fields (a record has no option nor PMD size).
        document = json.loads(run_report("--json", self.directory).stdout)
        huge_pages = {row["pid"]: row["huge_pages"] for row in document["processes"]}
        self.assertEqual(huge_pages[placed], {
            "option": None, "kernel": "madvise", "pmd_size": None, "huge_bytes": 48 << 20,
            "small_bytes": 16 << 20, "unknown_bytes": 0, "made_bytes": 32 << 20,
            "had_pages_bytes": 16 << 20, "no_block_bytes": 0, "refused_bytes": 0,
            "stopped_bytes": 0, "aligned_allocations": 1, "backed_off": False})
        self.assertIsNone(huge_pages[older])
        self.assertEqual(document["totals"]["huge_pages"]["kernel_modes"], ["madvise"])

    def test_beside_numa_in_bytes_and_backed_off(self):
        both = self.write_running(
            live_bytes=8 << 20, devices=[(0, 1, 8 << 20)],
            extra_fields=NUMA_FIELDS + HUGE_FIELDS,
            values=dict(numa_values([8 << 20, 0, 0, 0], [8 << 20, 0, 0, 0], 0, 0,
                                    [0, -1, -1, -1]),
                        **huge_values(small_bytes=6 << 20, unknown_bytes=2 << 20,
                                      no_block_bytes=4 << 20, stopped_bytes=2 << 20,
                                      backed_off=1)))
        # Nothing locked yet: no share.
        idle = self.write_running(live_bytes=0, extra_fields=HUGE_FIELDS,
                                  values=huge_values(kernel=b""))
        result = run_top("--once", "--bytes", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(cells(lines[1])[4:8], ["registered bytes", "remote bytes", "huge",
                                                "ranges"])
        shares = {row[1]: row[6] for row in map(cells, lines[2:4])}
        self.assertEqual(shares, {str(both): "0%", str(idle): "-"})
        self.assertTrue(lines[4].startswith("NUMA, bytes registered so far: "), lines[4])
        self.assertEqual(lines[5], f"huge pages: 0 bytes locked on huge pages (0%), "
                                   f"{6 << 20} bytes on small, {2 << 20} bytes unknown; made "
                                   f"huge by the shim 0 bytes, left small for want of free "
                                   f"blocks {4 << 20} bytes; stopped after a slow batch in 1 "
                                   f"process ({2 << 20} bytes left small); THP madvise")
        _, rows = table(result.stdout)
        self.assertEqual(len(rows), 2)


def wait_for(predicate):
    """Whether predicate() held within a minute (a limit for a broken run)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


class ThroughTheCommand(TopCase):
    def test_pinshim_top_runs_the_script(self):
        self.write_running()
        self.write_killed()
        cli = os.environ["PINSHIM_CLI"]
        direct = run_top("--once", "--bytes", self.directory)
        through = run_top(command=[cli, "top", "--once", "--bytes", self.directory])
        self.assertEqual(through.returncode, 0, through.stderr)
        self.assertEqual(through.stderr, "")
        # The title has the time; the table is the same.
        self.assertEqual(through.stdout.splitlines()[1:], direct.stdout.splitlines()[1:])
        self.assertEqual(len(table(through.stdout)[1]), 1)
        usage = run_top(command=[cli, "top", "--interval", "-1"])
        self.assertEqual(usage.returncode, 2, usage.stderr)
        self.assertIn("usage: pinshim-top", usage.stderr)


if __name__ == "__main__":
    if not TOP:
        print("PINSHIM_TOP is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
