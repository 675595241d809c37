"""Writes live records as libpinshim.so makes them (src/live_record.h, version
1), for the tests of pinshim-report and pinshim-top.

The header is packed member by member at the offsets a C compiler gives
struct live_record_header (HEADER_OFFSETS; test_live_records.py checks them
against the header with a C program), not with the reader's format string,
so that a mistake in the reader's layout shows.
"""

import os
import socket
import struct
import subprocess
import tempfile
import time
import unittest

MAGIC = b"PSHMLIVE"
BYTE_ORDER = 0x01020304
RUNNING, EXITING, EXITED, REPLACED = 1, 2, 3, 4
COUNT, NANOSECONDS, TIME, INT32, TEXT = 1, 2, 3, 4, 5

# offsetof(struct live_record_header, member), its struct code and size.
HEADER_OFFSETS = {
    "magic": (0, "8s"), "version": (8, "I"), "byte_order": (12, "I"),
    "header_bytes": (16, "I"), "field_count": (20, "I"), "field_bytes": (24, "I"),
    "data_offset": (28, "I"), "data_bytes": (32, "I"), "state": (36, "I"), "pid": (40, "q"),
    "start_ticks": (48, "Q"), "ticks_per_second": (56, "Q"), "created_ns": (64, "Q"),
    "ended_ns": (72, "Q"), "fork_child": (80, "I"), "pid_namespace": (84, "I"),
    "ended_by": (88, "16s"), "boot_id": (104, "40s"), "version_text": (144, "24s"),
    "context_mode": (168, "16s"), "host": (184, "256s"), "exe": (440, "1024s"),
    "stats_path": (1464, "1024s"),
}
HEADER_SIZE = 2488  # sizeof(struct live_record_header)
# offsetof(struct live_record_field, member); sizeof is 64.
FIELD_OFFSETS = {"name": 0, "offset": 48, "kind": 52, "count": 56, "stride": 60}
FIELD_SIZE = 64

# The plain fields of the engine's counters, by kind (the names of the brief
# for issue 19: the dotted keys of the JSON document).
COUNT_FIELDS = [
    "register.ok", "register.failed", "register.already_registered", "register.skipped_small",
    "register.skipped_no_runtime", "register.skipped_runtime_library", "register.by_pieces",
    "register.read_only", "register.skipped_read_only_unsupported", "register.skipped_io",
    "register.skipped_no_access", "register.skipped_shared_file", "register.skipped_unmapped",
    "register.skipped_address", "register.skipped_onfault_pages", "register.bytes",
    "unregister.ok", "unregister.failed", "unregister.munlock", "unregister.free",
    "unregister.realloc", "unregister.munmap", "unregister.mremap", "unregister.mmap_fixed",
    "unregister.exit", "unregister.program", "unregister.mprotect",
    "unregister.exit_unloading", "unregister.gone", "deferred.ranges",
    "deferred.registered_later", "deferred.dropped", "deferred.pending_ranges_at_exit",
    "deferred.pending_bytes_at_exit", "thread.queued_at_exit", "thread.cancelled",
    "program.registrations", "program.unregistrations", "program.handed_over",
    "program.kept", "program.taken_back", "calls.lock", "calls.unlock", "calls.mlockall",
    "live.ranges", "live.bytes", "live.peak_bytes",
]
NANOSECOND_FIELDS = ["register.seconds", "unregister.seconds", "thread.wait_seconds",
                     "thread.background_seconds"]
TIME_FIELDS = ["last_change"]
DEVICES = 4
ERROR_SLOTS = 4
ERROR_STRIDE = 56  # {int32_t code; uint64_t count; char name[40];}


def boot_id():
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
        return handle.read().strip()


def start_ticks(pid):
    """Field 22 of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read()
    return int(text[text.rfind(b")") + 2:].split()[22 - 3])


def default_layout():
    """[(name, kind, count, stride, offset)]: the field table, 8-byte words
    one after the other, then the device and error arrays."""
    layout = []
    offset = 0
    for kind, names in ((COUNT, COUNT_FIELDS), (NANOSECONDS, NANOSECOND_FIELDS),
                        (TIME, TIME_FIELDS)):
        for name in names:
            layout.append((name, kind, 1, 8, offset))
            offset += 8
    layout.append(("devices[].registrations", COUNT, DEVICES, 16, offset))
    layout.append(("devices[].bytes", COUNT, DEVICES, 16, offset + 8))
    offset += 16 * DEVICES
    layout.append(("errors[].code", INT32, ERROR_SLOTS, ERROR_STRIDE, offset))
    layout.append(("errors[].count", COUNT, ERROR_SLOTS, ERROR_STRIDE, offset + 8))
    layout.append(("errors[].name", TEXT, ERROR_SLOTS, ERROR_STRIDE, offset + 16))
    offset += ERROR_STRIDE * ERROR_SLOTS
    return layout, offset


def record_bytes(values=None, devices=(), errors=(), *, state=RUNNING, pid=None,
                 ticks=None, host=None, boot=None, ended_by="", exe="/usr/bin/train",
                 fork_child=False, created_ns=None, ended_ns=0, order="<", version=1,
                 magic=MAGIC, byte_order=BYTE_ORDER, extra_fields=(), header_padding=8,
                 stats_path=""):
    """A whole record. values: {field name: value} (seconds for the
    nanosecond fields, seconds since the epoch for the time ones);
    devices: [(device, registrations, bytes)]; errors: [(code, count, name)];
    extra_fields: more (name, kind, count, stride, offset) entries, with
    their offset past the default data (raw bytes come from values[name];
    an array's elements from a list there)."""
    values = dict(values or {})
    pid = os.getpid() if pid is None else pid
    host = socket.gethostname() if host is None else host
    layout, data_bytes = default_layout()
    layout = layout + list(extra_fields)
    for _, _, count, stride, offset in extra_fields:
        data_bytes = max(data_bytes, offset + max(count - 1, 0) * stride + 8)
    header_bytes = HEADER_SIZE + header_padding
    data_offset = header_bytes + FIELD_SIZE * len(layout)
    data_offset = (data_offset + 63) // 64 * 64
    buffer = bytearray(data_offset + data_bytes)
    header = {
        "magic": magic, "version": version, "byte_order": byte_order,
        "header_bytes": header_bytes, "field_count": len(layout), "field_bytes": FIELD_SIZE,
        "data_offset": data_offset, "data_bytes": data_bytes, "state": state, "pid": pid,
        "start_ticks": start_ticks(pid) if ticks is None else ticks,
        "ticks_per_second": os.sysconf("SC_CLK_TCK"),
        "created_ns": time.time_ns() if created_ns is None else created_ns,
        "ended_ns": ended_ns, "fork_child": 1 if fork_child else 0, "pid_namespace": 0,
        "ended_by": ended_by.encode(), "boot_id": (boot_id() if boot is None else boot).encode(),
        "version_text": b"0.3.0", "context_mode": b"program", "host": host.encode(),
        "exe": exe.encode(), "stats_path": stats_path.encode(),
    }
    for name, (offset, code) in HEADER_OFFSETS.items():
        struct.pack_into(order + code, buffer, offset, header[name])
    for index, (name, kind, count, stride, offset) in enumerate(layout):
        at = header_bytes + index * FIELD_SIZE
        struct.pack_into(order + "48s", buffer, at + FIELD_OFFSETS["name"], name.encode())
        for member, value in (("offset", offset), ("kind", kind), ("count", count),
                              ("stride", stride)):
            struct.pack_into(order + "I", buffer, at + FIELD_OFFSETS[member], value)
        if name not in values:
            continue
        # An array's values: a list, element i at offset + i * stride.
        elements = values[name] if isinstance(values[name], list) else [values[name]]
        for index, value in enumerate(elements[:count]):
            where = data_offset + offset + index * stride
            if kind == COUNT:
                struct.pack_into(order + "Q", buffer, where, value)
            elif kind in (NANOSECONDS, TIME):
                struct.pack_into(order + "Q", buffer, where, round(value * 1e9))
            elif kind == INT32:
                struct.pack_into(order + "i", buffer, where, value)
            elif isinstance(value, bytes):
                buffer[where:where + len(value)] = value
    devices_at = next(offset for name, _, _, _, offset in layout
                      if name == "devices[].registrations")
    for device, registrations, size in devices:
        struct.pack_into(order + "QQ", buffer, data_offset + devices_at + 16 * device,
                         registrations, size)
    errors_at = next(offset for name, _, _, _, offset in layout if name == "errors[].code")
    for slot, (code, count, name) in enumerate(errors):
        where = data_offset + errors_at + ERROR_STRIDE * slot
        struct.pack_into(order + "i", buffer, where, code)
        struct.pack_into(order + "Q", buffer, where + 8, count)
        struct.pack_into(order + "40s", buffer, where + 16, name.encode())
    return bytes(buffer)


def write_record(path, *arguments, **options):
    with open(path, "wb") as handle:
        handle.write(record_bytes(*arguments, **options))
    return path


def busy_values(live_bytes=64 << 20, live_ranges=2, **more):
    """The values of a process that registered something."""
    values = {"register.ok": 3, "register.bytes": 96 << 20, "register.seconds": 0.002,
              "calls.lock": 3, "unregister.ok": 1, "live.ranges": live_ranges,
              "live.bytes": live_bytes, "live.peak_bytes": 96 << 20}
    values.update(more)
    return values


def gone_pid():
    """The pid of a process that has ended (and been waited for)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


class RecordsCase(unittest.TestCase):
    """A test with a directory of its own for records, and sleeping child
    processes that stand for running ones (killed at the end)."""

    prefix = "pinshim-records-"

    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory(prefix=self.prefix)
        self.directory = self.temporary.name
        self.children = []

    def tearDown(self):
        for child in self.children:
            child.kill()
            child.wait()
        self.temporary.cleanup()

    def path(self, name):
        return os.path.join(self.directory, name)

    def running_child(self):
        """A process that runs until the test ends: (its pid, its start ticks)."""
        child = subprocess.Popen(["sleep", "300"])
        self.children.append(child)
        return child.pid, start_ticks(child.pid)
