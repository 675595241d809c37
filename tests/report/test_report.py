#!/usr/bin/env python3
"""pinshim-report on generated stats files: the totals that lead each job, the
processes that did something sorted by bytes (--all: every one), --json with the
same, optional keys (devices, deferred, numa, huge_pages, ...) present or not,
bad files, exit statuses, and never a traceback.

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
import socket
import unittest

from shim_job import BUFFER_BYTES, ShimCase, parse_exposition, sample, samples_of

# Under a cross build's emulator (tests/meson.build sets PINSHIM_TEST_EMULATOR)
# the build machine's programs (python3 itself, true, sh) cannot load the shim,
# which is another architecture's.
EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")


def foreign(program):
    """Why a test that runs program under the shim skips under EMULATOR."""
    return (f"under {EMULATOR}: {program} is the build machine's program, of another "
            "architecture than the shim, and cannot load it")


REPORT = os.environ.get("PINSHIM_REPORT", "")


def stats_document(pid, host="node1", exe="/usr/bin/train", ok=3, register_failed=0,
                   unregister_failed=0, bytes_registered=3 * 1048576, seconds=0.000250,
                   live_ranges=1, live_bytes=1048576, errors=None, locks=5):
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
        "calls": {"lock": locks, "unlock": 1, "mlockall": 0},
        "live": {"ranges": live_ranges, "bytes": live_bytes, "peak_bytes": bytes_registered},
        "warnings": 0,
        "errors": errors or {},
    }


def idle_document(pid, host="node1", exe="/bin/bash"):
    """A process that locked nothing (written with PINSHIM_STATS_ALL=1)."""
    return stats_document(pid, host=host, exe=exe, ok=0, bytes_registered=0, seconds=0,
                          live_ranges=0, live_bytes=0, locks=0)


def write_json(path, document):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle)


def run_report(*arguments, command=None, environment=None):
    result = subprocess.run(command or [sys.executable, REPORT, *arguments], env=environment,
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


def totals_block(stdout):
    """The labelled lines that lead a job: {label: text}."""
    block = {}
    label = None
    for line in stdout.splitlines()[1:]:
        if not line.startswith("  "):
            break
        name, text = line[2:16].strip(), line[17:]
        label = name or label
        block[label] = block[label] + "\n" + text if name == "" else text
    return block


def table_rows(stdout):
    """The process rows of the table: lists of cells split on 2+ spaces."""
    lines = stdout.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("host "))
    rows = []
    for line in lines[start + 2:]:
        if not line or line.startswith(("note:", "job ")):
            break
        rows.append(re.split(r"\s{2,}", line))
    return rows


class Text(ReportCase):
    def test_totals_lead_then_the_rows_by_bytes(self):
        job = self.make_job()
        result = run_report(job)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], f"job {job}")
        totals = totals_block(result.stdout)
        self.assertEqual(totals["processes"], "3 reported on 2 hosts, all did something")
        self.assertEqual(totals["registered"], "6 registrations, 5.1 MiB, in 500.500 ms")
        self.assertEqual(totals["failures"],
                         "3 failures (2 registering, 1 unregistering): "
                         "cudaErrorInvalidValue 1, cudaErrorMemoryAllocation 2")
        self.assertEqual(totals["slowest"], "node1 pid 101 (train), 500.000 ms registering")
        self.assertEqual(totals["live at end"], "2 (1.1 MiB)")
        self.assertEqual(totals["ended"], "3 exited")
        self.assertEqual(totals["by host"],
                         "node1: 2 processes, 5 registrations, 5.0 MiB, 0 failures\n"
                         "node2: 1 process, 1 registration, 64.0 KiB, 3 failures")
        # No optional key in these documents: no line for them.
        for label in ("device 0", "deferred", "contexts", "time", "warnings", "read-only",
                      "left out"):
            self.assertNotIn(label, totals)
        header = lines[lines.index("") + 1]
        self.assertEqual(header.split()[:6],
                         ["host", "pid", "exe", "ended", "locks", "registrations"])
        self.assertIn("live at end", header)
        rows = table_rows(result.stdout)
        self.assertEqual([row[1] for row in rows], ["100", "101", "200"])
        self.assertEqual(rows[0], ["node1", "100", "train", "exit", "5", "3", "3.0 MiB", "0",
                                   "0.250 ms", "1 (1.0 MiB)", "-", "-"])
        self.assertEqual(rows[1][6:10], ["2.0 MiB", "0", "500.000 ms", "0 (0 B)"])
        self.assertEqual(rows[2][:3] + rows[2][6:8], ["node2", "200", "loader", "64.0 KiB", "3"])
        self.assertEqual(rows[2][-2], "cudaErrorInvalidValue 1, cudaErrorMemoryAllocation 2")
        # Documents without "accelerator" (older shims) name no runtime.
        self.assertEqual([row[-1] for row in rows], ["-", "-", "-"])

    def test_only_processes_that_did_something_unless_all(self):
        write_json(os.path.join(self.directory, "small.json"),
                   stats_document(1, ok=1, bytes_registered=65536, seconds=0.001))
        write_json(os.path.join(self.directory, "big.json"),
                   stats_document(2, ok=2, bytes_registered=8 << 20, seconds=0.002))
        write_json(os.path.join(self.directory, "idle1.json"), idle_document(3))
        write_json(os.path.join(self.directory, "idle2.json"), idle_document(4, exe="/bin/ls"))
        # Locked below PINSHIM_MIN_BYTES: registered nothing but did something.
        write_json(os.path.join(self.directory, "locked.json"),
                   stats_document(5, ok=0, bytes_registered=0, seconds=0, live_ranges=0,
                                  live_bytes=0, locks=2))
        # Failed only.
        write_json(os.path.join(self.directory, "failed.json"),
                   stats_document(6, ok=0, bytes_registered=0, seconds=0, live_ranges=0,
                                  live_bytes=0, locks=0, register_failed=1,
                                  errors={"cudaErrorMemoryAllocation": 1}))
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(totals_block(result.stdout)["processes"],
                         "6 reported on 1 host, 4 did something (listed below; --all lists "
                         "the other 2)")
        # Most bytes first; ties by registrations, then failures.
        self.assertEqual([row[1] for row in table_rows(result.stdout)], ["2", "1", "6", "5"])
        result = run_report("--all", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([row[1] for row in table_rows(result.stdout)],
                         ["2", "1", "6", "5", "3", "4"])
        self.assertIn("(--all: every one is listed)", result.stdout)

    def test_warnings_alone_are_counted_not_listed(self):
        write_json(os.path.join(self.directory, "a.json"), stats_document(1))
        warned = idle_document(2)
        warned["warnings"] = 2
        write_json(os.path.join(self.directory, "b.json"), warned)
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        totals = totals_block(result.stdout)
        self.assertEqual(totals["warnings"], "2")
        self.assertIn("1 did something", totals["processes"])
        self.assertEqual([row[1] for row in table_rows(result.stdout)], ["1"])

    def test_nothing_done_says_so(self):
        write_json(os.path.join(self.directory, "a.json"), idle_document(3))
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(totals_block(result.stdout)["slowest"], "-")
        self.assertIn("No process locked or registered anything (--all lists the 1 process "
                      "that reported).", result.stdout)
        self.assertNotIn("host ", result.stdout)

    def test_one_host_has_no_host_lines_and_singular_words(self):
        write_json(os.path.join(self.directory, "a.json"),
                   stats_document(7, ok=1, register_failed=1))
        result = run_report(os.path.join(self.directory, "a.json"))
        self.assertEqual(result.returncode, 0, result.stderr)
        totals = totals_block(result.stdout)
        self.assertEqual(totals["processes"], "1 reported on 1 host, all did something")
        self.assertTrue(totals["registered"].startswith("1 registration, "), totals)
        self.assertTrue(totals["failures"].startswith("1 failure ("), totals)
        self.assertNotIn("by host", totals)
        self.assertEqual(len(table_rows(result.stdout)), 1)

    def test_one_block_per_directory(self):
        first, second = self.make_job("first"), self.make_job("second")
        result = run_report(first, second)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("\njob ") + result.stdout.startswith("job "), 2)
        self.assertIn(f"job {first}\n  processes      3 reported", result.stdout)
        self.assertIn(f"job {second}\n  processes      3 reported", result.stdout)

    def test_runtime_error_is_noted(self):
        document = stats_document(9, ok=0, bytes_registered=0, live_ranges=0, live_bytes=0)
        document["cudart"].update(usable=False, error="libcudart.so.13: no usable NVIDIA driver")
        write_json(os.path.join(self.directory, "a.json"), document)
        result = run_report(self.directory)
        self.assertIn("note: node1 pid 9 (train): GPU runtime not used: libcudart.so.13: "
                      "no usable NVIDIA driver", result.stdout)


def add_optional_keys(document, devices, deferred=None, contexts=None, wait=None,
                      background=None):
    document["devices"] = [{"device": device, "registrations": count, "bytes": size}
                           for device, count, size in devices]
    if deferred is not None:
        document["deferred"] = {"ranges": deferred[0], "registered_later": 0, "dropped": 0,
                                "pending_ranges_at_exit": deferred[1],
                                "pending_bytes_at_exit": deferred[2]}
    if contexts is not None:
        document["context"] = {"mode": "program", "driver": None, "contexts_created": contexts}
    if wait is not None or background is not None:
        document["thread"] = {"queued_at_exit": 0, "cancelled": 0}
    if wait is not None:
        document["thread"]["wait_seconds"] = wait
    if background is not None:
        document["thread"]["background_seconds"] = background
    return document


class OptionalKeys(ReportCase):
    """Keys that newer shims add: shown when present, never required."""

    def make_mixed_job(self):
        first = add_optional_keys(stats_document(1, ok=3), [(0, 2, 2 << 20), (1, 1, 1 << 20)],
                                  deferred=(2, 1, 4096), contexts=1, wait=0.25, background=0.5)
        second = add_optional_keys(stats_document(2, ok=2, bytes_registered=2 << 20),
                                   [(1, 2, 2 << 20)], contexts=2, wait=0.5)
        write_json(os.path.join(self.directory, "first.json"), first)
        write_json(os.path.join(self.directory, "second.json"), second)
        # A document from a shim without the new keys.
        write_json(os.path.join(self.directory, "old.json"), stats_document(3, ok=1))

    def test_per_device_totals_and_the_rest_in_text(self):
        self.make_mixed_job()
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        totals = totals_block(result.stdout)
        self.assertEqual(totals["device 0"], "2 registrations, 2.0 MiB")
        self.assertEqual(totals["device 1"], "3 registrations, 3.0 MiB")
        self.assertEqual(totals["deferred"], "2 ranges waited for a CUDA context; 1 range "
                                             "(4.0 KiB) still waiting at exit")
        self.assertEqual(totals["contexts"], "3 created")
        self.assertEqual(totals["time"], "750.000 ms waiting, 500.000 ms in the background")

    def test_per_device_totals_in_json(self):
        self.make_mixed_job()
        document = json.loads(run_report("--json", self.directory).stdout)
        totals = document["totals"]
        self.assertEqual(totals["devices"], [
            {"device": 0, "registrations": 2, "bytes": 2 << 20},
            {"device": 1, "registrations": 3, "bytes": 3 << 20}])
        self.assertEqual(totals["deferred"],
                         {"ranges": 2, "pending_ranges": 1, "pending_bytes": 4096})
        self.assertEqual(totals["contexts_created"], 3)
        self.assertAlmostEqual(totals["wait_seconds"], 0.75)
        self.assertAlmostEqual(totals["background_seconds"], 0.5)
        rows = {row["pid"]: row for row in document["processes"]}
        self.assertEqual(rows[3]["devices"], [])
        self.assertIsNone(rows[3]["deferred"])
        self.assertIsNone(rows[3]["contexts_created"])
        self.assertIsNone(rows[2]["background_seconds"])

    def test_without_them_the_keys_are_empty(self):
        write_json(os.path.join(self.directory, "a.json"), stats_document(1))
        totals = json.loads(run_report("--json", self.directory).stdout)["totals"]
        self.assertEqual(totals["devices"], [])
        for key in ("deferred", "contexts_created", "wait_seconds", "background_seconds"):
            self.assertIsNone(totals[key], key)

    def test_bad_optional_keys_skip_the_file(self):
        cases = {
            "devices.json": ({"devices": [{"device": 0, "registrations": "2", "bytes": 1}]},
                             "devices is not a list of objects"),
            "deferred.json": ({"deferred": {"ranges": 1}}, "deferred is not an object"),
            "contexts.json": ({"context": {"contexts_created": -1}},
                              "context.contexts_created is not a count"),
            "wait.json": ({"thread": {"wait_seconds": "soon"}},
                          "thread.wait_seconds is not a number of seconds"),
            "locks.json": ({"calls": {"lock": 1.5, "unlock": 0, "mlockall": 0}},
                           "calls.lock is not a count"),
        }
        for name, (extra, _) in cases.items():
            document = stats_document(1)
            document.update(extra)
            write_json(os.path.join(self.directory, name), document)
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 1)
        for name, (_, reason) in cases.items():
            with self.subTest(name=name):
                self.assertIn(f"{os.path.join(self.directory, name)}: {reason}", result.stderr)

    def test_documents_without_calls_still_count(self):
        """Files from shims before calls.* existed: registrations make them active."""
        document = stats_document(1)
        del document["calls"]
        del document["warnings"]
        write_json(os.path.join(self.directory, "a.json"), document)
        result = run_report("--json", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        row = json.loads(result.stdout)["processes"][0]
        self.assertEqual((row["locks"], row["warnings"], row["active"]), (0, 0, True))


class Json(ReportCase):
    def test_document_totals_first_then_rows(self):
        job = self.make_job()
        write_json(os.path.join(job, "stats.node1.102.json"), idle_document(102))
        result = run_report("--json", job)
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertEqual(list(document)[:2], ["pinshim_report", "totals"])
        self.assertEqual(list(document).index("processes"), len(document) - 3)
        self.assertEqual(document["pinshim_report"], 5)
        self.assertEqual(document["files_read"], 4)
        self.assertEqual(document["skipped"], [])
        self.assertIs(document["all_processes"], False)
        rows = document["processes"]
        # Those that did something, most bytes first.
        self.assertEqual([(row["host"], row["pid"]) for row in rows],
                         [("node1", 100), ("node1", 101), ("node2", 200)])
        self.assertTrue(all(row["active"] for row in rows))
        loader = rows[2]
        self.assertEqual(loader["exe"], "/opt/app/bin/loader")
        self.assertEqual(loader["exe_name"], "loader")
        self.assertEqual(loader["job"], job)
        self.assertEqual(loader["file"], os.path.join(job, "stats.node2.200.json"))
        self.assertEqual((loader["failures"], loader["register_failed"],
                          loader["unregister_failed"], loader["locks"]), (3, 2, 1, 5))
        self.assertEqual(loader["errors"], {"cudaErrorInvalidValue": 1,
                                            "cudaErrorMemoryAllocation": 2})
        totals = document["totals"]
        for key in ("registrations", "bytes", "failures", "live_ranges", "live_bytes", "locks"):
            self.assertEqual(totals[key], sum(row[key] for row in rows), key)
        self.assertEqual((totals["processes"], totals["active"], totals["hosts"]), (4, 3, 2))
        self.assertEqual((totals["registrations"], totals["live_ranges"]), (6, 2))
        self.assertAlmostEqual(totals["register_seconds"], 0.5005, places=6)
        self.assertEqual(totals["errors"], {"cudaErrorInvalidValue": 1,
                                            "cudaErrorMemoryAllocation": 2})
        self.assertEqual(totals["slowest"], {
            "host": "node1", "pid": 101, "exe": "/usr/bin/train", "exe_name": "train",
            "register_seconds": 0.5, "file": os.path.join(job, "stats.node1.101.json")})
        hosts = {entry["host"]: entry for entry in document["hosts"]}
        self.assertEqual((hosts["node1"]["processes"], hosts["node1"]["registrations"]), (3, 5))
        self.assertEqual((hosts["node2"]["processes"], hosts["node2"]["failures"]), (1, 3))
        self.assertEqual([entry["job"] for entry in document["jobs"]], [job])
        self.assertEqual(document["jobs"][0]["registrations"], 6)
        self.assertEqual(document["jobs"][0]["slowest"]["pid"], 101)

    def test_all_lists_every_process(self):
        job = self.make_job()
        write_json(os.path.join(job, "stats.node1.102.json"), idle_document(102))
        document = json.loads(run_report("--json", "--all", job).stdout)
        self.assertIs(document["all_processes"], True)
        self.assertEqual([(row["pid"], row["active"]) for row in document["processes"]],
                         [(100, True), (101, True), (200, True), (102, False)])
        self.assertEqual(document["totals"]["processes"], 4)

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
            "cut_in_string.json": (text[: text.index('"exe": "') + 12], "truncated JSON"),
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
        self.assertIn("1 reported on 1 host", result.stdout)
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
        self.assertIn(f"pinshim-report: {empty}: no *.json or *.live files in this directory; "
                      "skipped",
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
        usage = " ".join(result.stdout.split("\n\n")[0].split())
        self.assertEqual(usage, "usage: pinshim-report [-h] [--all] [--json] [--prometheus] "
                                "[--prometheus-file PATH] [--prune] [--no-runtime-records] "
                                "FILE [FILE ...]")
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

    @unittest.skipIf(EMULATOR, foreign("true"))
    def test_reads_what_the_shim_writes(self):
        """A file from the real library, so the report follows its format."""
        path = os.path.join(self.directory, "stats.%h.%p.json")
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith("PINSHIM_")}
        # true locks nothing: only PINSHIM_STATS_ALL makes it write stats.
        environment.update(LD_PRELOAD=os.environ["PINSHIM_LIB"], PINSHIM_STATS=path,
                           PINSHIM_STATS_ALL="1")
        # One process (a shell would add its own file: processes that end
        # with _exit write stats too).
        process = subprocess.Popen(["true"], env=environment, stderr=subprocess.PIPE, text=True)
        _, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 0, stderr)
        result = run_report("--json", "--all", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = json.loads(result.stdout)["processes"]
        self.assertEqual([(row["active"], row["locks"], row["warnings"]) for row in rows],
                         [(False, 0, 0)])
        self.assertEqual([(row["pid"], row["exe_name"]) for row in rows],
                         [(process.pid, os.path.basename(os.path.realpath(
                             shutil.which("true"))))])


def run_report_in(case, *arguments):
    """pinshim report with case's runtime directory (a ShimCase's)."""
    return run_report(*arguments, environment=case.reader_environment())


class RunningJob(ShimCase):
    def test_an_empty_directory_of_a_running_job_is_not_complained_about(self):
        """Until its first process exits, a job's directory holds no file: its
        processes are found in the runtime directory, and that is no error."""
        process = self.start(2)
        result = run_report_in(self, "--json", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        document = json.loads(result.stdout)
        self.assertEqual([(row["pid"], row["ended_by"]) for row in document["processes"]],
                         [(process.pid, "running")])
        self.assertEqual(document["skipped"], [])
        # Without the runtime directory's records it is empty, and said so.
        result = run_report_in(self, "--no-runtime-records", self.stats)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"{self.stats}: no *.json or *.live files in this directory; skipped",
                      result.stderr)


# A NUMA object as the shim is to write it (issue 29): bytes registered per
# node of their pages, the part local to their device, remote and unknown.
def numa_object(nodes, remote, unknown, device_nodes):
    return {"device_nodes": {str(device): node for device, node in device_nodes.items()},
            "nodes": {str(node): {"bytes": size, "local_bytes": local}
                      for node, (size, local) in nodes.items()},
            "remote_bytes": remote, "unknown_bytes": unknown}


class Numa(ShimCase):
    """Statistics the shim wrote, with their numa object (rewritten here to
    place pages on nodes this one-node machine lacks): shown when present,
    silent when not (PINSHIM_NUMA=0, or a shim from before issue 29)."""

    def add_numa(self, pid, numa):
        document = self.stats_document(pid)
        document["numa"] = numa
        write_json(self.stats_path(pid), document)
        return document

    def make_numa_job(self):
        """Three processes: one whose pages were all on its device's node 0,
        one whose pages were on node 1 (but 64 KiB of unknown node) with its
        device on node 0, and one from a shim without NUMA statistics."""
        local, remote = self.ended(2), self.ended(1)
        old = self.ended(1, extra={"PINSHIM_NUMA": "0"})
        # As the shim wrote it: every registered byte counted on a node.
        written = self.stats_document(local)
        self.assertEqual(sum(node["bytes"] for node in written["numa"]["nodes"].values())
                         + written["numa"]["unknown_bytes"], written["register"]["bytes"])
        self.assertNotIn("numa", self.stats_document(old))
        local_bytes = self.stats_document(local)["register"]["bytes"]
        remote_bytes = self.stats_document(remote)["register"]["bytes"]
        self.assertEqual((local_bytes, remote_bytes), (2 * BUFFER_BYTES, BUFFER_BYTES))
        self.add_numa(local, numa_object({0: (local_bytes, local_bytes)}, 0, 0, {0: 0}))
        unknown = 65536
        self.add_numa(remote, numa_object({1: (remote_bytes - unknown, 0)},
                                          remote_bytes - unknown, unknown, {0: 0}))
        return local, remote, old

    def test_text(self):
        local, remote, old = self.make_numa_job()
        result = run_report_in(self, self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        totals = totals_block(result.stdout)
        self.assertEqual(totals["numa"], "node 0 2.0 MiB (2.0 MiB local), "
                                         "node 1 960.0 KiB (0 B local)\n"
                                         "remote 960.0 KiB (1 process), node unknown 64.0 KiB")
        header = result.stdout.splitlines()[result.stdout.splitlines().index("") + 1]
        self.assertEqual(re.split(r"\s{2,}", header)[-3:], ["remote", "errors", "runtime"])
        remote_cells = {row[1]: row[-3] for row in table_rows(result.stdout)}
        # Real processes under the shim (create mode): the vendor and the call (issue 27).
        self.assertEqual({row[-1] for row in table_rows(result.stdout)}, {"CUDA cudaHostRegister"})
        self.assertEqual(remote_cells, {str(local): "0 B", str(remote): "960.0 KiB",
                                        str(old): "-"})

    def test_json(self):
        local, remote, old = self.make_numa_job()
        result = run_report_in(self, "--json", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertEqual(document["totals"]["numa"], {
            "processes": 2,
            "nodes": {"0": {"bytes": 2 * BUFFER_BYTES, "local_bytes": 2 * BUFFER_BYTES},
                      "1": {"bytes": BUFFER_BYTES - 65536, "local_bytes": 0}},
            "remote_bytes": BUFFER_BYTES - 65536, "unknown_bytes": 65536,
            "remote_processes": 1})
        rows = {row["pid"]: row for row in document["processes"]}
        self.assertEqual(rows[remote]["numa"], {
            "nodes": {"1": {"bytes": BUFFER_BYTES - 65536, "local_bytes": 0}},
            "remote_bytes": BUFFER_BYTES - 65536, "unknown_bytes": 65536,
            "device_nodes": {"0": 0}})
        self.assertIsNone(rows[old]["numa"])

    def test_prometheus(self):
        local, remote, old = self.make_numa_job()
        result = run_report_in(self, "--prometheus", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        samples = samples_of(parse_exposition(result.stdout))
        job = {"stats_dir": self.stats}
        self.assertEqual(sample(samples, "pinshim_numa_registered_bytes_total", node=0, **job),
                         2 * BUFFER_BYTES)
        self.assertEqual(sample(samples, "pinshim_numa_registered_bytes_total", node=1, **job),
                         BUFFER_BYTES - 65536)
        self.assertEqual(sample(samples, "pinshim_numa_local_registered_bytes_total", node=1,
                                **job), 0)
        self.assertEqual(sample(samples, "pinshim_numa_remote_registered_bytes_total", **job),
                         BUFFER_BYTES - 65536)
        self.assertEqual(sample(samples, "pinshim_numa_unknown_registered_bytes_total", **job),
                         65536)
        exe = self.stats_document(remote)["exe"]
        process = dict(job, host=socket.gethostname(), pid=remote, exe=exe)
        self.assertEqual(sample(samples, "pinshim_process_numa_remote_registered_bytes_total",
                                **process), BUFFER_BYTES - 65536)
        self.assertEqual(sample(samples, "pinshim_process_device_numa_node", device=0,
                                **process), 0)
        # The process without NUMA statistics has no NUMA series.
        old_series = [key for key in samples if "numa" in key[0]
                      and ("pid", str(old)) in key[1]]
        self.assertEqual(old_series, [])

    def test_missing_keys_are_tolerated(self):
        first, second = self.ended(1), self.ended(1)
        self.add_numa(first, {})
        self.add_numa(second, {"nodes": {"0": {"bytes": 4096}}})
        result = run_report_in(self, "--json", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {row["pid"]: row for row in json.loads(result.stdout)["processes"]}
        self.assertEqual(rows[first]["numa"], {"nodes": {}, "remote_bytes": None,
                                               "unknown_bytes": None, "device_nodes": {}})
        self.assertEqual(rows[second]["numa"]["nodes"], {"0": {"bytes": 4096,
                                                               "local_bytes": 0}})
        result = run_report_in(self, self.stats)
        self.assertEqual(totals_block(result.stdout)["numa"], "node 0 4.0 KiB (0 B local)")
        self.assertEqual({row[-2] for row in table_rows(result.stdout)}, {"-"})

    def test_bad_values_skip_the_file(self):
        cases = {"not an object": ([0], "numa is not an object"),
                 "node name": ({"nodes": {"zero": {"bytes": 1}}},
                               "numa.nodes has the key 'zero', which is not a number"),
                 "node bytes": ({"nodes": {"0": {"bytes": -1}}},
                                "numa.nodes.0.bytes is not a byte count"),
                 "device node": ({"device_nodes": {"0": "near"}},
                                 "numa.device_nodes.0 is not a node number or -1"),
                 "remote": ({"remote_bytes": 1.5}, "numa.remote_bytes is not a byte count")}
        pids = {}
        for name, (numa, _) in cases.items():
            pids[name] = self.ended(1)
            self.add_numa(pids[name], numa)
        result = run_report_in(self, self.stats)
        self.assertEqual(result.returncode, 1)
        for name, (_, reason) in cases.items():
            with self.subTest(case=name):
                self.assertIn(f"{self.stats_path(pids[name])}: {reason}; skipped", result.stderr)

    def test_without_numa_nothing_is_said(self):
        self.ended(2, extra={"PINSHIM_NUMA": "0"})
        self.ended(1, extra={"PINSHIM_NUMA": "0"})
        text = run_report_in(self, self.stats)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertNotIn("numa", totals_block(text.stdout))
        self.assertNotIn("remote", text.stdout)
        document = json.loads(run_report_in(self, "--json", self.stats).stdout)
        self.assertIsNone(document["totals"]["numa"])
        self.assertEqual({row["numa"] for row in document["processes"]}, {None})
        exposition = run_report_in(self, "--prometheus", self.stats).stdout
        self.assertEqual([family["name"] for family in parse_exposition(exposition)
                          if "numa" in family["name"]], [])


# A huge_pages object as the shim writes it (issue 36): the bytes of plain
# locks by page size, what the shim did to their chunks, the kernel's THP mode.
def huge_pages_object(huge, small, unknown=0, made=0, had_pages=0, no_block=0, refused=0,
                      stopped=0, aligned=0, backed_off=False, kernel="madvise",
                      option="auto"):
    return {"option": option, "kernel": kernel, "pmd_size": 2 << 20, "huge_bytes": huge,
            "small_bytes": small, "unknown_bytes": unknown, "made_bytes": made,
            "had_pages_bytes": had_pages, "no_block_bytes": no_block,
            "refused_bytes": refused, "stopped_bytes": stopped,
            "aligned_allocations": aligned, "backed_off": backed_off}


class HugePages(ShimCase):
    """Statistics the shim wrote, with their huge_pages object (rewritten here
    with sizes this machine's locks did not have): shown when present,
    silent when not (a shim from before issue 36)."""

    def add_huge_pages(self, pid, huge_pages):
        document = self.stats_document(pid)
        document["huge_pages"] = huge_pages
        write_json(self.stats_path(pid), document)
        return document

    def make_huge_pages_job(self):
        """Three processes: one whose locks were all on huge pages the shim
        made, one whose locks stayed small (for want of free blocks, then
        after a slow batch) under THP always, and one from a shim without
        page sizes."""
        huge, small, old = self.ended(2), self.ended(1), self.ended(1)
        # As the shim wrote it: every byte of the plain locks counted once.
        written = self.stats_document(huge)["huge_pages"]
        self.assertEqual(written["huge_bytes"] + written["small_bytes"]
                         + written["unknown_bytes"], 2 * BUFFER_BYTES)
        self.assertEqual(set(written), set(huge_pages_object(0, 0)))
        self.add_huge_pages(huge, huge_pages_object(3 << 30, 0, made=3 << 30, aligned=2))
        self.add_huge_pages(small, huge_pages_object(0, 1 << 30, no_block=512 << 20,
                                                     stopped=256 << 20, backed_off=True,
                                                     kernel="always"))
        document = self.stats_document(old)
        del document["huge_pages"]
        write_json(self.stats_path(old), document)
        return huge, small, old

    def test_text(self):
        huge, small, old = self.make_huge_pages_job()
        result = run_report_in(self, self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        totals = totals_block(result.stdout)
        self.assertEqual(totals["huge pages"],
                         "3.0 GiB locked on huge pages (75%), 1.0 GiB on small, 0 B unknown\n"
                         "made huge by the shim 3.0 GiB, left small for want of free blocks "
                         "512.0 MiB; stopped after a slow batch in 1 process (256.0 MiB left "
                         "small); THP always, madvise")
        header = result.stdout.splitlines()[result.stdout.splitlines().index("") + 1]
        # Before the NUMA column (the shim places pages too), the errors and the runtime.
        self.assertEqual(re.split(r"\s{2,}", header)[-4:], ["huge", "remote", "errors",
                                                             "runtime"])
        shares = {row[1]: row[-4] for row in table_rows(result.stdout)}
        self.assertEqual(shares, {str(huge): "100%", str(small): "0%", str(old): "-"})

    def test_json(self):
        huge, small, old = self.make_huge_pages_job()
        result = run_report_in(self, "--json", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        document = json.loads(result.stdout)
        self.assertEqual(document["pinshim_report"], 5)
        self.assertEqual(document["totals"]["huge_pages"], {
            "processes": 2, "huge_bytes": 3 << 30, "small_bytes": 1 << 30, "unknown_bytes": 0,
            "made_bytes": 3 << 30, "had_pages_bytes": 0, "no_block_bytes": 512 << 20,
            "refused_bytes": 0, "stopped_bytes": 256 << 20, "aligned_allocations": 2,
            "backed_off_processes": 1, "kernel_modes": ["always", "madvise"]})
        self.assertEqual(document["jobs"][0]["huge_pages"], document["totals"]["huge_pages"])
        rows = {row["pid"]: row for row in document["processes"]}
        self.assertEqual(rows[small]["huge_pages"], huge_pages_object(
            0, 1 << 30, no_block=512 << 20, stopped=256 << 20, backed_off=True,
            kernel="always"))
        self.assertEqual(rows[huge]["huge_pages"]["made_bytes"], 3 << 30)
        self.assertIsNone(rows[old]["huge_pages"])

    def test_old_files_say_nothing(self):
        pids = [self.ended(1), self.ended(2)]
        for pid in pids:
            document = self.stats_document(pid)
            del document["huge_pages"]
            write_json(self.stats_path(pid), document)
        text = run_report_in(self, self.stats)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertEqual(text.stderr, "")
        self.assertNotIn("huge pages", totals_block(text.stdout))
        self.assertNotIn("huge", text.stdout.splitlines()[text.stdout.splitlines().index("") + 1])
        document = json.loads(run_report_in(self, "--json", self.stats).stdout)
        self.assertIsNone(document["totals"]["huge_pages"])
        self.assertEqual({row["huge_pages"] for row in document["processes"]}, {None})

    def test_missing_keys_are_tolerated(self):
        empty, counted = self.ended(1), self.ended(1)
        self.add_huge_pages(empty, {})
        # backed_off as a live record has it: a count.
        self.add_huge_pages(counted, {"huge_bytes": 4096, "backed_off": 1})
        result = run_report_in(self, "--json", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {row["pid"]: row for row in json.loads(result.stdout)["processes"]}
        self.assertEqual(rows[empty]["huge_pages"], dict(
            huge_pages_object(0, 0, kernel=None, option=None), pmd_size=None))
        self.assertEqual(rows[counted]["huge_pages"], dict(
            huge_pages_object(4096, 0, kernel=None, option=None, backed_off=True),
            pmd_size=None))
        result = run_report_in(self, self.stats)
        self.assertEqual(totals_block(result.stdout)["huge pages"],
                         "4.0 KiB locked on huge pages (100%), 0 B on small, 0 B unknown\n"
                         "made huge by the shim 0 B; stopped after a slow batch in 1 process")
        shares = {row[1]: row[-4] for row in table_rows(result.stdout)}
        self.assertEqual(shares, {str(empty): "-", str(counted): "100%"})

    def test_bad_values_skip_the_file(self):
        cases = {"not an object": ([0], "huge_pages is not an object"),
                 "kernel": ({"kernel": 2}, "huge_pages.kernel is not a string"),
                 "option": ({"option": ["auto"]}, "huge_pages.option is not a string"),
                 "pmd size": ({"pmd_size": -1}, "huge_pages.pmd_size is not a byte count"),
                 "huge": ({"huge_bytes": -1}, "huge_pages.huge_bytes is not a byte count"),
                 "made": ({"made_bytes": 1.5}, "huge_pages.made_bytes is not a byte count"),
                 "aligned": ({"aligned_allocations": "2"},
                             "huge_pages.aligned_allocations is not a count"),
                 "backed off": ({"backed_off": "yes"},
                                "huge_pages.backed_off is not true or false")}
        pids = {}
        for name, (huge_pages, _) in cases.items():
            pids[name] = self.ended(1)
            self.add_huge_pages(pids[name], huge_pages)
        result = run_report_in(self, self.stats)
        self.assertEqual(result.returncode, 1)
        for name, (_, reason) in cases.items():
            with self.subTest(case=name):
                self.assertIn(f"{self.stats_path(pids[name])}: {reason}; skipped", result.stderr)


class HugeShare(ReportCase):
    """The share of the bytes locked on huge pages, in the rows and totals:
    0% or 100% only when none or all were."""

    def test_share_is_rounded_but_never_all_or_nothing_falsely(self):
        cases = {1: ((1, 999, 0), "1%"), 2: ((999, 1, 0), "99%"), 3: ((1, 2, 1), "25%"),
                 4: ((0, 0, 4096), "0%"), 5: ((0, 0, 0), "-")}
        for pid, ((huge, small, unknown), _) in cases.items():
            document = stats_document(pid)
            document["huge_pages"] = huge_pages_object(huge, small, unknown)
            write_json(os.path.join(self.directory, f"{pid}.json"), document)
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        header = result.stdout.splitlines()[result.stdout.splitlines().index("") + 1]
        self.assertEqual(re.split(r"\s{2,}", header)[-3:], ["huge", "errors", "runtime"])
        shares = {int(row[1]): row[-3] for row in table_rows(result.stdout)}
        self.assertEqual(shares, {pid: share for pid, (_, share) in cases.items()})
        self.assertTrue(totals_block(result.stdout)["huge pages"].startswith(
            "1001 B locked on huge pages (16%), 1002 B on small, 4.0 KiB unknown\n"),
            result.stdout)


def check_conventions(case, families):
    """Prometheus' naming rules, as pinshim keeps them: a pinshim_ prefix,
    help and a type for every family, _total on counters' samples, each
    series once, and a process's series labelled with its job, host, pid
    and executable."""
    samples_of(families)  # raises on a series given twice
    for family in families:
        with case.subTest(family=family["name"]):
            case.assertTrue(family["name"].startswith("pinshim_"), family["name"])
            case.assertIn(family["type"], ("counter", "gauge"))
            case.assertTrue(family["help"], "no HELP line")
            for name, labels, _ in family["samples"]:
                if family["type"] == "counter":
                    case.assertEqual(name, family["name"] + "_total")
                else:
                    case.assertEqual(name, family["name"])
                if family["name"].startswith("pinshim_process_"):
                    case.assertLessEqual({"stats_dir", "host", "pid", "exe"}, set(labels))
                elif family["name"] != "pinshim_report_skipped_files":
                    case.assertIn("stats_dir", labels)
                    case.assertNotIn("pid", labels)


class Prometheus(ShimCase):
    def make_job(self):
        """Four processes, each ended its way: exit, _exit, killed, running.
        Returns {pid: (locks, how it ended)}."""
        processes = {self.ended(2, "exit"): (2, "exit"),
                     self.ended(1, "_exit"): (1, "_exit"),
                     self.ended(3, signal.SIGKILL): (3, "killed")}
        running = self.start(1)
        processes[running.pid] = (1, "running")
        return processes

    def test_a_job_from_the_shim(self):
        processes = self.make_job()
        result = run_report_in(self, "--prometheus", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        families = parse_exposition(result.stdout)
        check_conventions(self, families)
        samples = samples_of(families)
        document = json.loads(run_report_in(self, "--json", "--all", self.stats).stdout)
        job = {"stats_dir": self.stats}
        locks = sum(count for count, _ in processes.values())
        self.assertEqual(sample(samples, "pinshim_registrations_total", **job), locks)
        self.assertEqual(sample(samples, "pinshim_registered_bytes_total", **job),
                         locks * BUFFER_BYTES)
        self.assertEqual(sample(samples, "pinshim_device_registered_bytes_total", device=0,
                                **job), locks * BUFFER_BYTES)
        for ended in ("exit", "_exit", "killed", "running"):
            with self.subTest(ended=ended):
                self.assertEqual(sample(samples, "pinshim_processes", ended=ended, **job), 1)
        totals = document["totals"]
        for name, key in (("pinshim_live_registered_bytes", "live_bytes"),
                          ("pinshim_lock_calls_total", "locks"),
                          ("pinshim_registering_seconds_total", "register_seconds")):
            with self.subTest(metric=name):
                self.assertAlmostEqual(sample(samples, name, **job), totals[key], places=6)
        for operation in ("register", "unregister"):
            self.assertEqual(sample(samples, "pinshim_failures_total", operation=operation,
                                    **job), 0)
        rows = {row["pid"]: row for row in document["processes"]}
        self.assertEqual(set(rows), set(processes))
        for pid, (count, ended) in processes.items():
            with self.subTest(pid=pid, ended=ended):
                row = rows[pid]
                self.assertEqual(row["ended_by"], ended)
                labels = dict(job, host=socket.gethostname(), pid=pid, exe=row["exe"])
                self.assertEqual(row["exe"], os.path.realpath(os.environ["LIVE_ENDINGS"]))
                self.assertEqual(sample(samples, "pinshim_process_registrations_total",
                                        **labels), count)
                self.assertEqual(sample(samples, "pinshim_process_registered_bytes_total",
                                        **labels), count * BUFFER_BYTES)
                self.assertEqual(sample(samples, "pinshim_process_live_registered_bytes",
                                        **labels), row["live_bytes"])

    def test_label_values_are_escaped(self):
        pid = self.ended(1)
        document = self.stats_document(pid)
        document["exe"] = '/opt/a "quoted"\\dir/new\nline/train'
        document["host"] = "node\\7"
        write_json(self.stats_path(pid), document)
        result = run_report_in(self, "--prometheus", self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn('exe="/opt/a \\"quoted\\"\\\\dir/new\\nline/train"', result.stdout)
        samples = samples_of(parse_exposition(result.stdout))
        self.assertEqual(sample(samples, "pinshim_process_registrations_total",
                                stats_dir=self.stats, host="node\\7", pid=pid,
                                exe=document["exe"]), 1)

    def test_file_written_atomically(self):
        self.ended(2)
        path = os.path.join(self.directory, "textfile", "pinshim.prom")
        os.mkdir(os.path.dirname(path))
        write_json(path, {"stale": True})
        before = os.stat(path)
        result = run_report_in(self, "--prometheus-file", path, self.stats)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "", "the file is the output")
        with open(path, encoding="utf-8") as handle:
            written = handle.read()
        self.assertEqual(written, run_report_in(self, "--prometheus", self.stats).stdout)
        # Renamed over the old file, not written into it; nothing left beside.
        self.assertNotEqual(os.stat(path).st_ino, before.st_ino)
        self.assertEqual(os.listdir(os.path.dirname(path)), ["pinshim.prom"])
        # Both at once: the file, and the same on standard output.
        result = run_report_in(self, "--prometheus", "--prometheus-file", path, self.stats)
        with open(path, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), result.stdout)

    def test_file_replaced_even_when_nothing_is_read(self):
        """A job whose files went: the old metrics must not stay."""
        path = os.path.join(self.directory, "pinshim.prom")
        pid = self.ended(1)
        self.assertEqual(run_report_in(self, "--prometheus-file", path, self.stats).returncode, 0)
        os.unlink(self.stats_path(pid))
        result = run_report_in(self, "--prometheus-file", path, self.stats)
        self.assertEqual(result.returncode, 1)
        self.assertIn("no stats file could be read", result.stderr)
        with open(path, encoding="utf-8") as handle:
            samples = samples_of(parse_exposition(handle.read()))
        self.assertEqual(list(samples), [("pinshim_report_skipped_files", frozenset())])
        self.assertEqual(sample(samples, "pinshim_report_skipped_files"), 1)

    def test_bad_values(self):
        self.ended(1)
        missing = os.path.join(self.directory, "missing", "pinshim.prom")
        cases = {("--prometheus-file", missing):
                 f"argument --prometheus-file: {missing}: no such directory "
                 f"{os.path.dirname(missing)}",
                 ("--prometheus-file", self.directory):
                 f"argument --prometheus-file: {self.directory} is a directory",
                 ("--prometheus-file", ""): "argument --prometheus-file: an empty path",
                 ("--json", "--prometheus"): "--json and --prometheus both print"}
        for arguments, message in cases.items():
            with self.subTest(arguments=arguments):
                result = run_report_in(self, *arguments, self.stats)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"pinshim-report: error: {message}", result.stderr)
                self.assertEqual(result.stdout, "")
        # A file that cannot be made: named, with the temporary name tried.
        result = run_report_in(self, "--prometheus-file", "/proc/pinshim.prom", self.stats)
        self.assertEqual(result.returncode, 1)
        self.assertRegex(result.stderr, r"pinshim-report: --prometheus-file /proc/pinshim.prom: "
                                        r"/proc/pinshim.prom.tmp.\d+: ")


if __name__ == "__main__":
    if not REPORT:
        print("PINSHIM_REPORT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
