#!/usr/bin/env python3
"""pinshim-report on live records (src/live_record.h) written by
live_record_writer.py: how each process ended (exit, _exit, exec, killed,
running, exiting, unknown), a JSON and a record of the same process merged,
records that are not ones skipped, the arrays (devices, errors) in the JSON's
shapes, the totals' ended, read-only and left-out lines, and --prune. The
writer's header layout is checked against the C header with a C program.

Environment (set by meson): PINSHIM_REPORT, PINSHIM_SOURCE_ROOT, CC_COMMAND.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import live_record_writer as writer  # noqa: E402
from test_report import run_report, stats_document, table_rows, totals_block  # noqa: E402
from test_report import write_json  # noqa: E402

REPORT = os.environ.get("PINSHIM_REPORT", "")
HOST = socket.gethostname()


class Layout(unittest.TestCase):
    """The writer's offsets are those of the C structs (and so the reader's,
    which tests below read back)."""

    def test_offsets_match_the_c_header(self):
        compiler = shlex.split(os.environ.get("CC_COMMAND", ""))
        source_root = os.environ.get("PINSHIM_SOURCE_ROOT", "")
        if not compiler or not source_root:
            self.skipTest("CC_COMMAND or PINSHIM_SOURCE_ROOT not set (run through meson test)")
        members = list(writer.HEADER_OFFSETS)
        lines = ["#include \"live_record.h\"", "#include <stdio.h>", "int main(void)", "{"]
        for member in members:
            lines.append(f'    printf("header {member} %zu\\n", '
                         f"offsetof(struct live_record_header, {member}));")
        for member in writer.FIELD_OFFSETS:
            lines.append(f'    printf("field {member} %zu\\n", '
                         f"offsetof(struct live_record_field, {member}));")
        lines += ['    printf("sizeof header %zu\\n", sizeof(struct live_record_header));',
                  '    printf("sizeof field %zu\\n", sizeof(struct live_record_field));',
                  '    printf("magic %s version %d order %x\\n", LIVE_RECORD_MAGIC, '
                  "LIVE_RECORD_VERSION, LIVE_RECORD_BYTE_ORDER);",
                  "    return 0;", "}"]
        with tempfile.TemporaryDirectory() as directory:
            source = os.path.join(directory, "offsets.c")
            program = os.path.join(directory, "offsets")
            with open(source, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
            build = subprocess.run([*compiler, "-std=c11", "-D_GNU_SOURCE", "-I",
                                    os.path.join(source_root, "src"), "-I",
                                    os.path.join(source_root, "include"), "-o", program, source],
                                   capture_output=True, text=True, timeout=120)
            self.assertEqual(build.returncode, 0, build.stderr)
            try:
                output = subprocess.run([program], capture_output=True, text=True,
                                        timeout=60).stdout.splitlines()
            except OSError as error:  # a cross compiler's program, and no emulator for it
                self.skipTest(f"cannot run the program {compiler[0]} built: {error}")
        expected = [f"header {member} {writer.HEADER_OFFSETS[member][0]}" for member in members]
        expected += [f"field {member} {offset}" for member, offset in writer.FIELD_OFFSETS.items()]
        expected += [f"sizeof header {writer.HEADER_SIZE}", f"sizeof field {writer.FIELD_SIZE}",
                     f"magic {writer.MAGIC.decode()} version 1 order {writer.BYTE_ORDER:x}"]
        self.assertEqual(output, expected)
        # The sizes of the char arrays: each member ends where the next starts.
        ordered = sorted(writer.HEADER_OFFSETS.items(), key=lambda item: item[1][0])
        for (_, (offset, code)), (_, (following, _)) in zip(ordered, ordered[1:]):
            size = int(code[:-1]) if code.endswith("s") else {"I": 4, "q": 8, "Q": 8}[code]
            self.assertEqual(offset + size, following, code)


class LiveCase(writer.RecordsCase):
    prefix = "pinshim-live-"

    def report_json(self, *arguments):
        result = run_report("--json", "--all", *arguments)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout), result


class EndedBy(LiveCase):
    def write_every_ending(self):
        """One record (or JSON) per way to end; returns {file name: (ended_by,
        record_state, source)}."""
        pid, ticks = self.running_child()
        own_ticks = writer.start_ticks(os.getpid())
        values = writer.busy_values()
        writer.write_record(self.path("running.live"), values, pid=pid, ticks=ticks)
        writer.write_record(self.path("exiting.live"), values, state=writer.EXITING,
                            pid=os.getpid(), ticks=own_ticks)
        writer.write_record(self.path("gone.live"), values, pid=writer.gone_pid(), ticks=own_ticks)
        # The pid runs, but it is another process now (other start ticks).
        writer.write_record(self.path("recycled.live"), values, pid=os.getpid(),
                            ticks=own_ticks + 1)
        writer.write_record(self.path("recycled_exiting.live"), values, state=writer.EXITING,
                            pid=pid, ticks=ticks + 1)
        # Same pid and ticks, but made before the machine last started.
        writer.write_record(self.path("other_boot.live"), values, pid=pid, ticks=ticks,
                            boot="00000000-0000-0000-0000-000000000000")
        writer.write_record(self.path("elsewhere.live"), values, host="elsewhere.example",
                            pid=pid, ticks=ticks)
        writer.write_record(self.path("exited.live"), values, state=writer.EXITED,
                            ended_by="exit", pid=writer.gone_pid(), ticks=1)
        writer.write_record(self.path("underscore.live"), values, state=writer.EXITED,
                            ended_by="_exit", pid=writer.gone_pid(), ticks=1)
        writer.write_record(self.path("exec.live"), values, state=writer.REPLACED,
                            ended_by="exec", pid=pid, ticks=ticks)
        write_json(self.path("old.json"), stats_document(11))
        document = stats_document(12)
        document["ended_by"] = "_exit"
        write_json(self.path("underscore.json"), document)
        return {
            "running.live": ("running", "running", "live"),
            "exiting.live": ("exiting", "exiting", "live"),
            "gone.live": ("killed", "running", "live"),
            "recycled.live": ("killed", "running", "live"),
            "recycled_exiting.live": ("killed", "exiting", "live"),
            "other_boot.live": ("killed", "running", "live"),
            "elsewhere.live": ("unknown", "running", "live"),
            "exited.live": ("exit", "exited", "live"),
            "underscore.live": ("_exit", "exited", "live"),
            "exec.live": ("exec", "replaced", "live"),
            "old.json": ("exit", None, "json"),
            "underscore.json": ("_exit", None, "json"),
        }

    def test_every_ending_in_json(self):
        expected = self.write_every_ending()
        document, result = self.report_json(self.directory)
        self.assertEqual(result.stderr, "")
        self.assertEqual(document["pinshim_report"], 5)
        rows = {os.path.basename(row["file"]): row for row in document["processes"]}
        self.assertEqual(set(rows), set(expected))
        for name, (ended_by, record_state, source) in expected.items():
            with self.subTest(file=name):
                row = rows[name]
                self.assertEqual((row["ended_by"], row["record_state"], row["source"]),
                                 (ended_by, record_state, source))
        self.assertEqual(document["totals"]["ended"],
                         {"exit": 2, "_exit": 2, "exec": 1, "killed": 4, "running": 1,
                          "exiting": 1, "unknown": 1})
        # The numbers of a record, as the JSON document has them.
        running = rows["running.live"]
        self.assertEqual((running["registrations"], running["bytes"], running["live_ranges"],
                          running["live_bytes"], running["locks"]),
                         (3, 96 << 20, 2, 64 << 20, 3))
        self.assertAlmostEqual(running["register_seconds"], 0.002)
        self.assertEqual((running["host"], running["exe"], running["exe_name"]),
                         (HOST, "/usr/bin/train", "train"))

    def test_every_ending_in_text(self):
        self.write_every_ending()
        result = run_report("--all", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        totals = totals_block(result.stdout)
        self.assertEqual(totals["ended"], "2 exited, 2 _exit, 1 replaced by exec, 4 killed, "
                                          "1 still running, 1 exiting, 1 unknown")
        self.assertEqual(totals["processes"], "12 reported on 3 hosts, all did something")
        header = next(line for line in result.stdout.splitlines() if line.startswith("host "))
        self.assertEqual(header.split()[:4], ["host", "pid", "exe", "ended"])
        ended = sorted(row[3] for row in table_rows(result.stdout))
        self.assertEqual(ended, sorted(["running", "exiting", "killed", "killed",
                                        "killed while exiting", "killed", "unknown", "exit",
                                        "_exit", "exec", "exit", "_exit"]))

    def test_the_report_itself_is_running(self):
        """The test's own process: running while it runs."""
        writer.write_record(self.path("self.live"), writer.busy_values())
        document, _ = self.report_json(self.path("self.live"))
        self.assertEqual(document["processes"][0]["ended_by"], "running")

    def test_a_child_that_ends_turns_killed(self):
        pid, ticks = self.running_child()
        writer.write_record(self.path("child.live"), writer.busy_values(), pid=pid, ticks=ticks)
        document, _ = self.report_json(self.directory)
        self.assertEqual(document["processes"][0]["ended_by"], "running")
        child = self.children.pop()
        child.kill()
        child.wait()
        document, _ = self.report_json(self.directory)
        self.assertEqual(document["processes"][0]["ended_by"], "killed")

    def test_big_endian_record(self):
        pid, ticks = self.running_child()
        writer.write_record(self.path("big.live"), writer.busy_values(), order=">", pid=pid,
                            ticks=ticks, devices=[(1, 2, 8192)],
                            errors=[(2, 1, "cudaErrorMemoryAllocation")])
        document, result = self.report_json(self.directory)
        self.assertEqual(result.stderr, "")
        row = document["processes"][0]
        self.assertEqual((row["pid"], row["ended_by"], row["bytes"], row["live_bytes"]),
                         (pid, "running", 96 << 20, 64 << 20))
        self.assertEqual(row["devices"], [{"device": 1, "registrations": 2, "bytes": 8192}])
        self.assertEqual(row["errors"], {"cudaErrorMemoryAllocation": 1})


class RuntimeDirectory(LiveCase):
    """A job's processes keep their records in the per-user runtime
    directory (the default); the report of the job's directory reads those
    that would have written their statistics there, and no others."""

    def test_the_jobs_records_from_the_runtime_directory(self):
        runtime = self.path("run")
        records = os.path.join(runtime, "pinshim")
        job = self.path("job")
        other = self.path("other-job")
        for directory in (runtime, records, job, other):
            os.mkdir(directory, 0o700)
        killed = writer.gone_pid()
        writer.write_record(os.path.join(records, f"{HOST}.{killed}.live"),
                            writer.busy_values(), pid=killed, ticks=1,
                            stats_path=os.path.join(job, f"stats.{HOST}.{killed}.json"))
        writer.write_record(os.path.join(records, f"{HOST}.{killed + 1}.live"),
                            writer.busy_values(), pid=killed + 1, ticks=1,
                            stats_path=os.path.join(other, "stats.json"))
        writer.write_record(os.path.join(records, f"{HOST}.{killed + 2}.live"),
                            writer.busy_values(), pid=killed + 2, ticks=1)
        with open(os.path.join(records, "not-a-record.live"), "wb") as handle:
            handle.write(b"junk")
        write_json(os.path.join(job, "stats.json"), stats_document(killed + 3, host=HOST))
        environment = dict(os.environ, XDG_RUNTIME_DIR=runtime)
        result = run_report("--json", "--all", job, environment=environment)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "", "records of other jobs are passed over silently")
        document = json.loads(result.stdout)
        self.assertEqual(sorted((row["pid"], row["source"], row["job"])
                                for row in document["processes"]),
                         [(killed, "live", job), (killed + 3, "json", job)])
        self.assertEqual(document["totals"]["ended"], {"exit": 1, "killed": 1})
        # Only the files named, when asked.
        result = run_report("--json", "--all", "--no-runtime-records", job,
                            environment=environment)
        self.assertEqual([row["pid"] for row in json.loads(result.stdout)["processes"]],
                         [killed + 3])


class Merge(LiveCase):
    def test_json_written_after_the_record_counts_alone(self):
        """Killed after writing its JSON (or its record could not go): one row."""
        pid = writer.gone_pid()
        writer.write_record(self.path(f"stats.{HOST}.{pid}.json.live"), writer.busy_values(),
                            pid=pid, ticks=1, created_ns=time.time_ns() - 10 * 10**9)
        write_json(self.path(f"stats.{HOST}.{pid}.json"), stats_document(pid, host=HOST))
        document, _ = self.report_json(self.directory)
        rows = document["processes"]
        self.assertEqual([(row["source"], row["pid"]) for row in rows], [("json", pid)])
        self.assertEqual(document["totals"]["ended"], {"exit": 1})
        self.assertEqual(document["totals"]["processes"], 1)

    def test_json_older_than_the_record_is_another_process(self):
        """The pid came back: the JSON is an earlier process's, both count."""
        pid = writer.gone_pid()
        json_path = self.path(f"stats.{HOST}.{pid}.json")
        write_json(json_path, stats_document(pid, host=HOST))
        hour_ago = time.time() - 3600
        os.utime(json_path, (hour_ago, hour_ago))
        writer.write_record(self.path(f"stats.{HOST}.{pid}.json.live"), writer.busy_values(),
                            pid=pid, ticks=1)
        document, _ = self.report_json(self.directory)
        self.assertEqual(sorted(row["source"] for row in document["processes"]),
                         ["json", "live"])
        self.assertEqual(document["totals"]["ended"], {"exit": 1, "killed": 1})

    def test_other_host_or_pid_is_not_merged(self):
        pid = writer.gone_pid()
        created = time.time_ns() - 10 * 10**9
        writer.write_record(self.path("a.live"), writer.busy_values(), pid=pid, ticks=1,
                            host="node7", created_ns=created)
        writer.write_record(self.path("b.live"), writer.busy_values(), pid=pid + 1, ticks=1,
                            created_ns=created)
        write_json(self.path("c.json"), stats_document(pid, host=HOST))
        document, _ = self.report_json(self.directory)
        self.assertEqual(len(document["processes"]), 3)

    def test_an_exec_record_is_the_earlier_image(self):
        """exec leaves the old image's record: its work counts beside the JSON
        that the last image wrote with the same pid."""
        pid = writer.gone_pid()
        writer.write_record(self.path(f"{HOST}.{pid}.live"), writer.busy_values(),
                            state=writer.REPLACED, ended_by="exec", pid=pid, ticks=1,
                            created_ns=time.time_ns() - 10 * 10**9)
        write_json(self.path(f"stats.{HOST}.{pid}.json"), stats_document(pid, host=HOST))
        document, _ = self.report_json(self.directory)
        self.assertEqual(document["totals"]["ended"], {"exit": 1, "exec": 1})
        self.assertEqual(document["totals"]["registrations"], 3 + 3)

    def test_record_in_another_directory_merges_too(self):
        """PINSHIM_LIVE=DIR puts records apart from the stats files."""
        live = self.path("live")
        stats = self.path("stats")
        os.mkdir(live)
        os.mkdir(stats)
        pid = writer.gone_pid()
        writer.write_record(os.path.join(live, f"{HOST}.{pid}.live"), writer.busy_values(),
                            pid=pid, ticks=1, created_ns=time.time_ns() - 10 * 10**9)
        write_json(os.path.join(stats, "s.json"), stats_document(pid, host=HOST))
        document, _ = self.report_json(live, stats)
        self.assertEqual([row["source"] for row in document["processes"]], ["json"])


class BadRecords(LiveCase):
    def test_bad_records_are_named_and_skipped(self):
        good = writer.record_bytes(writer.busy_values(), ticks=1)
        cases = {
            "magic.live": (b"NOTLIVE!" + good[8:], "not a pinshim live record (bad magic)"),
            "truncated.live": (good[:-8], "truncated live record"),
            "header_only.live": (good[:100], "truncated live record (100 bytes"),
            "version2.live": (writer.record_bytes(version=2, ticks=1),
                              "unsupported live record version 2"),
            "order.live": (writer.record_bytes(byte_order=0x05060708, ticks=1),
                           "byte order mark 0x05060708"),
            "empty.live": (b"", "empty file"),
            "state.live": (writer.record_bytes(state=9, ticks=1), "unknown state 9"),
        }
        # A field that ends past the data: register.ok, the table's first
        # entry, moved to 4 bytes before the data's end.
        data = bytearray(good)
        data_bytes = int.from_bytes(data[32:36], "little")
        field_at = writer.HEADER_SIZE + 8  # the table's first entry (header_padding 8)
        data[field_at + 48:field_at + 52] = (data_bytes - 4).to_bytes(4, "little")
        cases["outside.live"] = (bytes(data), f"field register.ok (bytes {data_bytes - 4} to "
                                              f"{data_bytes + 4}) lies outside the data "
                                              f"({data_bytes} bytes)")
        for name, (content, _) in cases.items():
            with open(self.path(name), "wb") as handle:
                handle.write(content)
        # A JSON file that holds a record is read as one.
        with open(self.path("record.json"), "wb") as handle:
            handle.write(writer.record_bytes(version=2, ticks=1))
        cases["record.json"] = (None, "unsupported live record version 2")
        writer.write_record(self.path("good.live"), writer.busy_values(), ticks=1)
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        for name, (_, reason) in cases.items():
            with self.subTest(name=name):
                prefix = f"pinshim-report: {self.path(name)}: "
                lines = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertIn(reason, lines[0])
                self.assertTrue(lines[0].endswith("; skipped"), lines[0])
        self.assertEqual(len(result.stderr.splitlines()), len(cases), result.stderr)
        self.assertIn("1 reported on 1 host", result.stdout)

    def test_a_truncated_record_says_where_its_data_ends(self):
        good = writer.record_bytes(writer.busy_values(), ticks=1)
        with open(self.path("cut.live"), "wb") as handle:
            handle.write(good[:-1])
        result = run_report(self.path("cut.live"))
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"truncated live record ({len(good) - 1} bytes, its data ends at byte "
                      f"{len(good)}); skipped", result.stderr)

    def test_unknown_kinds_and_names_are_left_out(self):
        """A field of a kind this reader does not know is skipped, the rest read."""
        extra = [("future.thing", 99, 1, 8, 4096), ("register.ok.deeper", writer.COUNT, 1, 8,
                                                    4096), ("", writer.COUNT, 1, 8, 4096),
                 ("odd[]x", writer.COUNT, 1, 8, 4096), ("scalars[]", writer.COUNT, 2, 8, 4096)]
        writer.write_record(self.path("a.live"), writer.busy_values(), ticks=1,
                            extra_fields=extra)
        document, result = self.report_json(self.directory)
        self.assertEqual(result.stderr, "")
        self.assertEqual(document["processes"][0]["registrations"], 3)


class Shapes(LiveCase):
    def test_devices_and_errors_as_in_the_json(self):
        values = writer.busy_values(**{
            "register.failed": 2, "unregister.failed": 1, "register.read_only": 2,
            "register.skipped_read_only_unsupported": 1, "register.skipped_io": 2,
            "register.skipped_no_access": 3, "register.skipped_shared_file": 4,
            "register.skipped_unmapped": 5, "deferred.ranges": 3,
            "deferred.pending_ranges_at_exit": 1, "deferred.pending_bytes_at_exit": 4096,
            "thread.wait_seconds": 0.25, "thread.background_seconds": 1.5})
        writer.write_record(
            self.path("a.live"), values, ticks=1,
            devices=[(0, 2, 2 << 20), (3, 1, 1 << 20)],
            errors=[(2, 2, "cudaErrorMemoryAllocation"), (999, 0, "cudaErrorUnknown"),
                    (1, 1, "cudaErrorInvalidValue"), (42, 1, "")])
        document, _ = self.report_json(self.directory)
        row = document["processes"][0]
        self.assertEqual(row["devices"], [{"device": 0, "registrations": 2, "bytes": 2 << 20},
                                          {"device": 3, "registrations": 1, "bytes": 1 << 20}])
        self.assertEqual(row["errors"], {"cudaErrorInvalidValue": 1,
                                         "cudaErrorMemoryAllocation": 2, "error 42": 1})
        self.assertEqual((row["failures"], row["register_failed"], row["unregister_failed"]),
                         (3, 2, 1))
        self.assertEqual(row["read_only"], 2)
        self.assertEqual(row["skipped_pieces"], {"read_only_unsupported": 1, "io": 2,
                                                 "no_access": 3, "shared_file": 4,
                                                 "unmapped": 5})
        self.assertEqual(row["deferred"], {"ranges": 3, "pending_ranges": 1,
                                           "pending_bytes": 4096})
        self.assertAlmostEqual(row["wait_seconds"], 0.25)
        self.assertAlmostEqual(row["background_seconds"], 1.5)
        totals = document["totals"]
        self.assertEqual(totals["devices"], row["devices"])
        self.assertEqual((totals["read_only"], totals["skipped_pieces"]["unmapped"]), (2, 5))

    def test_read_only_and_left_out_lines(self):
        writer.write_record(self.path("a.live"), writer.busy_values(**{
            "register.read_only": 2, "register.skipped_io": 1,
            "register.skipped_unmapped": 3}), ticks=1)
        document = stats_document(5)
        document["register"].update(read_only=1, skipped_read_only_unsupported=1,
                                    skipped_io=0, skipped_no_access=2, skipped_shared_file=0,
                                    skipped_unmapped=0)
        write_json(self.path("b.json"), document)
        result = run_report(self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        totals = totals_block(result.stdout)
        self.assertEqual(totals["read-only"], "3 pieces registered read-only")
        self.assertEqual(totals["left out"], "7 pieces not registered: read-only "
                                             "unsupported 1, I/O or PFN mapping 1, no access 2, "
                                             "unmapped 3")
        self.assertEqual(totals["ended"], "1 exited, 1 killed")
        self.assertEqual(totals["live at end"], "3 (65.0 MiB)")

    def test_no_read_only_no_line(self):
        writer.write_record(self.path("a.live"), writer.busy_values(), ticks=1)
        totals = totals_block(run_report(self.directory).stdout)
        self.assertNotIn("read-only", totals)
        self.assertNotIn("left out", totals)

    def test_fork_child_and_names(self):
        writer.write_record(self.path("a.live"), writer.busy_values(), ticks=1,
                            fork_child=True, exe="/opt/bin/worker")
        result = run_report(self.directory)
        self.assertRegex(result.stdout, rf"(?m)^{re.escape(HOST)}\s+\d+\s+worker \(fork\)\s+"
                                        r"killed\s")


class Prune(LiveCase):
    def test_prune_removes_only_records_of_ended_processes(self):
        pid, ticks = self.running_child()
        values = writer.busy_values()
        keep = {
            "running.live": dict(pid=pid, ticks=ticks),
            "exiting.live": dict(pid=pid, ticks=ticks, state=writer.EXITING),
            "elsewhere.live": dict(host="elsewhere.example", pid=pid, ticks=1),
        }
        remove = {
            "killed.live": dict(pid=writer.gone_pid(), ticks=1),
            "exited.live": dict(pid=writer.gone_pid(), ticks=1, state=writer.EXITED,
                                ended_by="exit"),
            "exec.live": dict(pid=pid, ticks=ticks, state=writer.REPLACED, ended_by="exec"),
        }
        for name, options in {**keep, **remove}.items():
            writer.write_record(self.path(name), values, **options)
        # Described by a JSON too: the record of a process that ended.
        merged_pid = writer.gone_pid()
        writer.write_record(self.path("merged.live"), values, pid=merged_pid, ticks=1,
                            created_ns=time.time_ns() - 10 * 10**9)
        write_json(self.path("merged.json"), stats_document(merged_pid, host=HOST))
        remove["merged.live"] = {}
        with open(self.path("bad.live"), "wb") as handle:
            handle.write(b"PSHMLIVE")
        # Without --prune nothing goes.
        run_report(self.directory)
        self.assertEqual(len(os.listdir(self.directory)), 9)
        result = run_report("--json", "--prune", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.path.basename(path)
                                for path in json.loads(result.stdout)["pruned"]),
                         sorted(remove))
        self.assertEqual(sorted(os.listdir(self.directory)),
                         sorted([*keep, "merged.json", "bad.live"]))
        # Text: each removal named on stderr.
        writer.write_record(self.path("killed.live"), values, pid=writer.gone_pid(), ticks=1)
        result = run_report("--prune", self.directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"pinshim-report: removed {self.path('killed.live')}, the live record "
                      "of a process that ended", result.stderr)
        self.assertFalse(os.path.exists(self.path("killed.live")))
        self.assertIn("killed", result.stdout)  # reported before it went

    def test_without_prune_no_pruned_key(self):
        writer.write_record(self.path("a.live"), writer.busy_values(), ticks=1)
        document, _ = self.report_json(self.directory)
        self.assertNotIn("pruned", document)


if __name__ == "__main__":
    if not REPORT:
        print("PINSHIM_REPORT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
