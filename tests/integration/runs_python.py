#!/usr/bin/env python3
"""Issue 34 from Python: Python's mmap.mmap objects are separate mappings,
which the kernel places side by side for consecutive calls. Locked one by
one (ctypes.CDLL(None).mlock, through the shim), each is a registration of
its own; releasing one registers none of the others again. One mmap.mmap
locked in pieces, on the other hand, is one run: one registration.

The shim's counters come from pinshim_get_counters (include/pinshim.h),
found in the global scope as any program finds them. Run by meson (env
PINSHIM_LIB, FAKE_CUDART); the program part runs in a child process under
the shim, in create mode, on the fake CUDA runtime.
"""

import ctypes
import json
import mmap
import os
import subprocess
import sys
import unittest

EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")
SIZE = 1 << 20
COUNT = 8


class Counters(ctypes.Structure):
    """The first fields of struct pinshim_counters."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "register_ok", "register_failed", "register_already_registered",
        "register_skipped_small", "register_bytes", "register_nanoseconds",
        "unregister_ok", "unregister_failed", "unregister_munlock", "unregister_free",
        "unregister_realloc", "unregister_munmap", "unregister_mremap",
        "unregister_mmap_fixed", "unregister_exit", "unregister_nanoseconds",
        "live_ranges", "live_bytes")]


def program():
    """Locks COUNT mmap.mmap objects one by one, then one in pieces, and
    prints what the shim's counters said at each step, as JSON."""
    libc = ctypes.CDLL(None)
    for function in (libc.mlock, libc.munlock):
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.pinshim_get_counters.argtypes = [ctypes.POINTER(Counters), ctypes.c_size_t]

    def counters():
        out = Counters()
        libc.pinshim_get_counters(ctypes.byref(out), ctypes.sizeof(out))
        return {name: getattr(out, name) for name, _ in Counters._fields_}

    def address(mapping):
        return ctypes.addressof(ctypes.c_char.from_buffer(mapping))

    maps = [mmap.mmap(-1, SIZE) for _ in range(COUNT)]
    starts = sorted(address(m) for m in maps)
    adjacent = sum(1 for a, b in zip(starts, starts[1:]) if b - a == SIZE)
    for mapping in maps:
        if libc.mlock(address(mapping), SIZE) != 0:
            print(json.dumps({"skip": "mlock refused (RLIMIT_MEMLOCK?)"}))
            return
    locked = counters()
    libc.munlock(address(maps[COUNT // 2]), SIZE)
    after_one = counters()
    pieces = mmap.mmap(-1, 4 * SIZE)
    for offset in range(0, 4 * SIZE, SIZE // 2):
        libc.mlock(address(pieces) + offset, SIZE // 2)
    after_pieces = counters()
    print(json.dumps({"adjacent": adjacent, "locked": locked, "after_one": after_one,
                      "after_pieces": after_pieces}))


class MmapObjects(unittest.TestCase):
    def test_side_by_side_mmap_objects_are_registered_apart(self):
        if EMULATOR:
            self.skipTest(f"under {EMULATOR}: python3 is the build machine's and cannot load "
                          "the shim")
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("PINSHIM_")}
        env.update(LD_PRELOAD=os.environ["PINSHIM_LIB"], PINSHIM_CUDART=os.environ["FAKE_CUDART"],
                   PINSHIM_CONTEXT="create")
        done = subprocess.run([sys.executable, __file__, "program"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "", "the shim stays quiet")
        result = json.loads(done.stdout)
        if "skip" in result:
            self.skipTest(result["skip"])
        # How many of the objects the kernel put side by side (7 of 7 where
        # this was written): said, so that a layout with none shows.
        print(f"{result['adjacent']} of {COUNT - 1} neighbours side by side", file=sys.stderr)
        self.assertEqual(result["locked"]["register_ok"], COUNT)
        self.assertEqual(result["locked"]["live_ranges"], COUNT)
        self.assertEqual(result["locked"]["unregister_ok"], 0)
        # Releasing one: one unregistration, and nothing registered again.
        self.assertEqual(result["after_one"]["unregister_ok"], 1)
        self.assertEqual(result["after_one"]["register_ok"], COUNT)
        self.assertEqual(result["after_one"]["live_ranges"], COUNT - 1)
        # One object locked in eight pieces: one registration in the end.
        self.assertEqual(result["after_pieces"]["live_ranges"], COUNT)
        self.assertEqual(result["after_pieces"]["live_bytes"], (COUNT - 1) * SIZE + 4 * SIZE)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "program":
        program()
    else:
        unittest.main()
