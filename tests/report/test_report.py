#!/usr/bin/env python3
"""pinshim-report on generated stats files: tables, --json, bad files, exit
statuses, and never a traceback.

Environment (set by meson): PINSHIM_REPORT (the script in the source tree),
PINSHIM_CLI (the pinshim command of the build tree), PINSHIM_LIB.
"""

import copy
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import unittest

REPORT = os.environ.get("PINSHIM_REPORT", "")


def stats_document(pid, host="node1", exe="/usr/bin/train", ok=3, register_failed=0,
                   unregister_failed=0, bytes_registered=3 * 1048576, seconds=0.000250,
                   live_ranges=1, live_bytes=1048576, errors=None):
    """A stats document as libpinshim.so writes it (src/stats.c)."""
    return {
        "pinshim": "0.1.0", "pid": pid, "host": host, "exe": exe, "fork_child": False,
        "config": {"REGISTER": "on", "MIN_BYTES": 65536, "FLAGS": "default",
                   "CUDART": "search", "STATS": "/x/stats.%h.%p.json", "LOG": "warn"},
        "cudart": {"loaded": True, "usable": True, "shared_with_program": False,
                   "path": "libcudart.so.13", "error": None},
        "register": {"ok": ok, "failed": register_failed, "already_registered": 0,
                     "skipped_small": 2, "skipped_no_runtime": 0, "skipped_address": 0,
                     "bytes": bytes_registered, "seconds": seconds},
        "unregister": {"ok": ok, "failed": unregister_failed, "munlock": 1, "free": 1,
                       "realloc": 0, "munmap": 0, "mremap": 0, "mmap_fixed": 0, "exit": 1,
                       "exit_unloading": 0, "seconds": 0.0003},
        "calls": {"lock": 5, "unlock": 1, "mlockall": 0},
        "live": {"ranges": live_ranges, "bytes": live_bytes, "peak_bytes": bytes_registered},
        "errors": errors or {},
    }


def write_json(path, document):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle)


def run_report(*arguments, command=None):
    result = subprocess.run(command or [sys.executable, REPORT, *arguments],
                            capture_output=True, text=True, timeout=60)
    # Whatever happened, the user never sees a Python traceback.
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    return result


class ReportCase(unittest.TestCase):
    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory(prefix="pinshim-report-")
        self.directory = self.temporary.name

    def tearDown(self):
        self.temporary.cleanup()

    def make_job(self, name="job"):
        """Three processes on two hosts, one with failures."""
        job = os.path.join(self.directory, name)
        os.mkdir(job)
        write_json(os.path.join(job, "stats.node1.100.json"), stats_document(100))
        write_json(os.path.join(job, "stats.node1.101.json"),
                   stats_document(101, ok=2, bytes_registered=2 * 1048576, live_ranges=0,
                                  live_bytes=0, seconds=0.5))
        write_json(os.path.join(job, "stats.node2.200.json"),
                   stats_document(200, host="node2", exe="/opt/app/bin/loader", ok=1,
                                  register_failed=2, unregister_failed=1,
                                  bytes_registered=65536, live_bytes=65536,
                                  errors={"cudaErrorMemoryAllocation": 2,
                                          "cudaErrorInvalidValue": 1}))
        return job


class Table(ReportCase):
    def test_rows_host_subtotals_and_totals(self):
        job = self.make_job()
        result = run_report(job)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], f"job {job}: 3 processes on 2 hosts")
        header = lines[1].split()
        self.assertEqual(header[:4], ["host", "pid", "exe", "registrations"])
        rows = {line.split()[1]: line for line in lines
                if re.match(r"^node\d\s+\d+\s+(?!process)", line)}
        self.assertEqual(sorted(rows), ["100", "101", "200"])
        self.assertRegex(rows["100"], r"^node1\s+100\s+train\s+3\s+3\.0 MiB\s+0\s+0\.250 ms\s+"
                                      r"1 \(1\.0 MiB\)\s+-$")
        self.assertRegex(rows["101"], r"\s2\s+2\.0 MiB\s+0\s+500\.000 ms\s+0 \(0 B\)\s+-$")
        self.assertRegex(rows["200"], r"^node2\s+200\s+loader\s+1\s+64\.0 KiB\s+3\s+")
        self.assertTrue(rows["200"].endswith("cudaErrorInvalidValue 1, "
                                             "cudaErrorMemoryAllocation 2"), rows["200"])
        subtotals = [line for line in lines if line.split()[0] in ("node1", "node2")
                     and "process" in line]
        self.assertEqual(len(subtotals), 2, lines)
        self.assertRegex(subtotals[0], r"^node1\s+2 processes\s+5\s+5\.0 MiB\s+0\s+")
        total = [line for line in lines if line.startswith("total")]
        self.assertEqual(len(total), 1, lines)
        self.assertRegex(total[0], r"^total\s+3 processes\s+6\s+5\.1 MiB\s+3\s+500\.500 ms\s+"
                                   r"2 \(1\.1 MiB\)\s+cudaErrorInvalidValue 1, "
                                   r"cudaErrorMemoryAllocation 2$")

    def test_one_host_has_no_subtotals_and_singular_words(self):
        write_json(os.path.join(self.directory, "a.json"), stats_document(7))
        result = run_report(os.path.join(self.directory, "a.json"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("1 process on 1 host", result.stdout)
        self.assertEqual(sum(line.startswith("node1") for line in result.stdout.splitlines()), 1)

    def test_one_table_per_directory(self):
        first, second = self.make_job("first"), self.make_job("second")
        result = run_report(first, second)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("\njob ") + result.stdout.startswith("job "), 2)
        self.assertIn(f"job {first}: 3 processes", result.stdout)
        self.assertIn(f"job {second}: 3 processes", result.stdout)
        self.assertEqual(result.stdout.count("\ntotal "), 2)

    def test_runtime_error_is_noted(self):
        document = stats_document(9, ok=0, bytes_registered=0, live_ranges=0, live_bytes=0)
        document["cudart"].update(usable=False, error="libcudart.so.13: no usable NVIDIA driver")
        write_json(os.path.join(self.directory, "a.json"), document)
        result = run_report(self.directory)
        self.assertIn("note: node1 pid 9 (train): CUDA runtime not used: libcudart.so.13: "
                      "no usable NVIDIA driver", result.stdout)


class Json(ReportCase):
    def test_document_rows_and_totals(self):
        job = self.make_job()
        result = run_report("--json", job)
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertEqual(document["pinshim_report"], 1)
        self.assertEqual(document["files_read"], 3)
        self.assertEqual(document["skipped"], [])
        rows = document["processes"]
        self.assertEqual([(row["host"], row["pid"]) for row in rows],
                         [("node1", 100), ("node1", 101), ("node2", 200)])
        loader = rows[2]
        self.assertEqual(loader["exe"], "/opt/app/bin/loader")
        self.assertEqual(loader["exe_name"], "loader")
        self.assertEqual(loader["job"], job)
        self.assertEqual(loader["file"], os.path.join(job, "stats.node2.200.json"))
        self.assertEqual((loader["failures"], loader["register_failed"],
                          loader["unregister_failed"]), (3, 2, 1))
        self.assertEqual(loader["errors"], {"cudaErrorInvalidValue": 1,
                                            "cudaErrorMemoryAllocation": 2})
        totals = document["totals"]
        for key in ("registrations", "bytes", "failures", "live_ranges", "live_bytes"):
            self.assertEqual(totals[key], sum(row[key] for row in rows), key)
        self.assertEqual((totals["processes"], totals["hosts"]), (3, 2))
        self.assertEqual((totals["registrations"], totals["live_ranges"]), (6, 2))
        self.assertAlmostEqual(totals["register_seconds"], 0.5005, places=6)
        self.assertEqual(totals["errors"], {"cudaErrorInvalidValue": 1,
                                            "cudaErrorMemoryAllocation": 2})
        hosts = {entry["host"]: entry for entry in document["hosts"]}
        self.assertEqual((hosts["node1"]["processes"], hosts["node1"]["registrations"]), (2, 5))
        self.assertEqual((hosts["node2"]["processes"], hosts["node2"]["failures"]), (1, 3))
        self.assertEqual([entry["job"] for entry in document["jobs"]], [job])
        self.assertEqual(document["jobs"][0]["registrations"], 6)

    def test_file_given_twice_counts_once(self):
        job = self.make_job()
        result = run_report("--json", job, os.path.join(job, "stats.node1.100.json"))
        self.assertEqual(json.loads(result.stdout)["totals"]["processes"], 3)


class BadFiles(ReportCase):
    def write_bad_files(self):
        good = stats_document(300)
        text = json.dumps(good)
        missing = copy.deepcopy(good)
        del missing["register"]["seconds"]
        wrong_type = copy.deepcopy(good)
        wrong_type["register"]["ok"] = "3"
        bad = {
            "truncated.json": (text[: len(text) // 2], "truncated JSON"),
            "notjson.json": ("pinshim: pid 4 on node1: registered 0\n", "not valid JSON"),
            "missing.json": (json.dumps(missing), "missing key register.seconds"),
            "wrongtype.json": (json.dumps(wrong_type), "register.ok is not a count"),
            "array.json": ("[1, 2, 3]", "not a JSON object"),
            "other.json": ('{"name": "package.json"}', 'no "pinshim" key'),
            "empty.json": ("", "empty file"),
            "nan.json": (text.replace('"seconds": 0.00025', '"seconds": NaN'), "NaN"),
            "latin1.json": (None, "not UTF-8"),
        }
        for name, (content, _) in bad.items():
            path = os.path.join(self.directory, name)
            if content is None:
                with open(path, "wb") as handle:
                    handle.write(b'{"host": "caf\xe9"}')
            else:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(content)
        return bad

    def test_bad_files_are_named_and_skipped(self):
        bad = self.write_bad_files()
        write_json(os.path.join(self.directory, "good.json"), stats_document(301))
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        for name, (_, reason) in bad.items():
            with self.subTest(name=name):
                prefix = f"pinshim-report: {os.path.join(self.directory, name)}: "
                line = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
                self.assertEqual(len(line), 1, result.stderr)
                self.assertIn(reason, line[0])
                self.assertTrue(line[0].endswith("; skipped"), line[0])
        self.assertEqual(len(result.stderr.splitlines()), len(bad))
        self.assertIn("1 process on 1 host", result.stdout)
        self.assertRegex(result.stdout, r"(?m)^node1\s+301\s+train\s")

    def test_skipped_files_in_json(self):
        bad = self.write_bad_files()
        result = run_report("--json", self.directory)
        self.assertEqual(result.returncode, 1)
        document = json.loads(result.stdout)
        self.assertEqual(document["files_read"], 0)
        self.assertEqual(sorted(os.path.basename(entry["file"]) for entry in document["skipped"]),
                         sorted(bad))

    def test_only_bad_files_exit_1(self):
        self.write_bad_files()
        result = run_report(os.path.join(self.directory, "truncated.json"),
                            os.path.join(self.directory, "notjson.json"))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertIn("pinshim-report: no stats file could be read", result.stderr)

    def test_missing_file_and_empty_directory(self):
        empty = os.path.join(self.directory, "empty")
        os.mkdir(empty)
        missing = os.path.join(self.directory, "missing.json")
        result = run_report(empty, missing)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"pinshim-report: {empty}: no *.json files in this directory; skipped",
                      result.stderr)
        self.assertIn(f"pinshim-report: {missing}: No such file or directory; skipped",
                      result.stderr)

    def test_fifo_is_not_read(self):
        fifo = os.path.join(self.directory, "pipe.json")
        os.mkfifo(fifo)
        result = run_report(fifo)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"{fifo}: not a regular file; skipped", result.stderr)

    @unittest.skipIf(os.geteuid() == 0, "root reads files whatever their mode")
    def test_unreadable_file(self):
        path = os.path.join(self.directory, "secret.json")
        write_json(path, stats_document(5))
        os.chmod(path, 0)
        result = run_report(path)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"{path}: Permission denied; skipped", result.stderr)


class Usage(ReportCase):
    def test_usage_errors_exit_2(self):
        for arguments in ([], ["--frobnicate", self.directory], ["--json"]):
            with self.subTest(arguments=arguments):
                result = run_report(*arguments)
                self.assertEqual(result.returncode, 2)
                self.assertIn("usage: pinshim-report", result.stderr)

    def test_help(self):
        result = run_report("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("usage: pinshim-report [-h] [--json] FILE [FILE ...]", result.stdout)
        self.assertIn("exit status", result.stdout)

    def test_script_is_executable_on_its_own(self):
        self.assertTrue(os.stat(REPORT).st_mode & stat.S_IXUSR, f"{REPORT} is not executable")
        write_json(os.path.join(self.directory, "a.json"), stats_document(1))
        result = run_report(command=[REPORT, self.directory])
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_closed_pipe_is_quiet(self):
        for index in range(800):  # more output than a pipe holds
            write_json(os.path.join(self.directory, f"s{index}.json"), stats_document(index))
        process = subprocess.Popen([sys.executable, REPORT, self.directory],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read().decode()
        process.wait(timeout=60)
        self.assertEqual(stderr, "")
        self.assertIn(process.returncode, (0, -signal.SIGPIPE))


class ThroughTheCommandAndTheShim(ReportCase):
    def test_pinshim_report_runs_the_script(self):
        job = self.make_job()
        direct = run_report("--json", job)
        through = run_report(command=[os.environ["PINSHIM_CLI"], "report", "--json", job])
        self.assertEqual(through.returncode, 0, through.stderr)
        self.assertEqual(json.loads(through.stdout), json.loads(direct.stdout))
        usage = run_report(command=[os.environ["PINSHIM_CLI"], "report"])
        self.assertEqual(usage.returncode, 2)

    def test_reads_what_the_shim_writes(self):
        """A file from the real library, so the report follows its format."""
        path = os.path.join(self.directory, "stats.%h.%p.json")
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith("PINSHIM_")}
        environment.update(LD_PRELOAD=os.environ["PINSHIM_LIB"], PINSHIM_STATS=path)
        # A program that ends with exit(), so the shim's destructor runs (dash
        # ends with _exit and writes no stats).
        process = subprocess.Popen(["true"], env=environment, stderr=subprocess.PIPE, text=True)
        _, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 0, stderr)
        result = run_report("--json", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = json.loads(result.stdout)["processes"]
        self.assertEqual([(row["pid"], row["exe_name"]) for row in rows],
                         [(process.pid, os.path.basename(os.path.realpath(
                             shutil.which("true"))))])


if __name__ == "__main__":
    if not REPORT:
        print("PINSHIM_REPORT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
