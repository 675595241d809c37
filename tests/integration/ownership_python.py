#!/usr/bin/env python3
"""Issue 12 from Python: a program that registers memory itself through
ctypes, the two ways Python code reaches cudaHostRegister.

Through the global symbol scope (ctypes.CDLL(None), as PyTorch's compiled
torch.cuda.cudart() binding and any C extension linked with -lcudart do):
the shim's exported cudaHostRegister/cudaHostUnregister come first, so the
program gets exactly what it gets without the shim, and the shim gives the
pages up while the program owns them and takes them back after.

Through the runtime's own handle (ctypes.CDLL(path).cudaHostRegister): the
shim cannot see the call. What happens then is what the README says:
the program's register of memory the shim registered gets 712, its
unregister removes the shim's registration (any caller may), and the shim's
own unregister later finds it gone (713: counted as unregister.gone, no
warning).

Run by meson (env PINSHIM_LIB, FAKE_CUDART); the program part runs in child
processes with and without the shim.
"""

import ctypes
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


SIZE = 1 << 20


def program(how):
    """The program: prints one line per call (what it returned, what
    cudaGetLastError said) and "state:"/"shim:" lines that differ with the
    shim and are left out of the comparison."""
    runtime = ctypes.CDLL(os.environ["PINSHIM_CUDART"], mode=ctypes.RTLD_GLOBAL)
    scope = ctypes.CDLL(None)
    calls = scope if how == "scope" else runtime
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    for function in (libc.mlock, libc.munlock):
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    calls.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    calls.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    runtime.cudaPointerGetAttributes.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]
    try:
        shim_is_registered = scope.pinshim_is_registered
        shim_is_registered.argtypes = [ctypes.c_void_p]
        shim_drain = scope.pinshim_drain
    except AttributeError:
        shim_is_registered = shim_drain = None

    buffer = ctypes.c_void_p()
    if libc.posix_memalign(ctypes.byref(buffer), 4096, SIZE) != 0:
        raise SystemExit("posix_memalign failed")
    ctypes.memset(buffer, 1, SIZE)

    def step(name, result):
        print(f"{name}: returned {result}, last error {runtime.cudaGetLastError()}", flush=True)

    def query(name):
        if shim_drain is not None:
            shim_drain()
        kind = ctypes.c_int(-1)
        error = runtime.cudaPointerGetAttributes(ctypes.byref(kind), buffer)
        print(f"state: {name}: pointer type {kind.value if error == 0 else -error}")
        if shim_is_registered is not None:
            print(f"shim: {name}: the shim holds it: {shim_is_registered(buffer)}", flush=True)

    step("lock", libc.mlock(buffer, SIZE))
    query("after lock")
    step("program registers", calls.cudaHostRegister(buffer, SIZE, 0))
    query("after the program's register")
    step("program unregisters", calls.cudaHostUnregister(buffer))
    query("after the program's unregister")
    step("unlock", libc.munlock(buffer, SIZE))
    query("at the end")
    libc.free(buffer)


def run(how, with_shim, directory, **extra):
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PINSHIM_", "FAKE_CUDA")) and name != "LD_PRELOAD"}
    environment.update(PINSHIM_CUDART=os.environ["FAKE_CUDART"],
                       PINSHIM_STATS=os.path.join(directory, "stats.json"))
    if with_shim:
        environment["LD_PRELOAD"] = os.environ["PINSHIM_LIB"]
    environment.update(extra)
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--program", how],
                            env=environment, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"the program failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    stats = None
    path = os.path.join(directory, "stats.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            stats = json.load(handle)
    return result.stdout, result.stderr, stats


def program_lines(out):
    return [line for line in out.splitlines() if not line.startswith(("state: ", "shim: "))]


# PINSHIM_CONTEXT=create: the program's first CUDA call here is its own
# cudaHostRegister, so in program mode the shim would hold nothing yet at the
# first query; create mode registers at the lock, the case where the program
# meets the shim's registration.
SETTINGS = [
    {"PINSHIM_CONTEXT": "create", "PINSHIM_ASYNC": "off"},
    {"PINSHIM_CONTEXT": "program", "PINSHIM_ASYNC": "off"},
    {"PINSHIM_CONTEXT": "create", "PINSHIM_ASYNC": "on"},
    {"PINSHIM_CONTEXT": "program", "PINSHIM_ASYNC": "on"},
]


class ThroughTheGlobalScope(unittest.TestCase):
    def test_the_program_sees_what_it_sees_without_the_shim(self):
        for settings in SETTINGS:
            with self.subTest(**settings), tempfile.TemporaryDirectory() as directory:
                without, _, _ = run("scope", False, directory, **settings)
                out, err, stats = run("scope", True, directory, **settings)
                self.assertEqual(program_lines(out), program_lines(without))
                self.assertIn("program registers: returned 0, last error 0", out)
                self.assertIn("program unregisters: returned 0, last error 0", out)
                self.assertNotIn("pinshim:", err)
                self.assertIn("shim: after the program's register: the shim holds it: 0", out)
                self.assertIn("state: after the program's register: pointer type 1", out)
                # Still locked after the program's unregister: the shim's again.
                self.assertIn("shim: after the program's unregister: the shim holds it: 1", out)
                self.assertIn("state: after the program's unregister: pointer type 1", out)
                self.assertIn("state: at the end: pointer type 0", out)
                self.assertEqual(stats["program"]["registrations"], 1)
                self.assertEqual(stats["program"]["unregistrations"], 1)
                # Its registration was one the shim would make: kept as the
                # shim's, without a call (issue 17).
                self.assertEqual(stats["program"]["kept"], 1)
                self.assertEqual(stats["program"]["taken_back"], 0)
                if settings == {"PINSHIM_CONTEXT": "create", "PINSHIM_ASYNC": "off"}:
                    # Registered in mlock: the program's register is handed
                    # the shim's registration.
                    self.assertEqual(stats["program"]["handed_over"], 1)
                self.assertEqual(stats["live"]["ranges"], 0)
                self.assertEqual(stats["warnings"], 0)


class ThroughTheRuntimesOwnHandle(unittest.TestCase):
    def test_what_the_readme_says_happens(self):
        settings = {"PINSHIM_CONTEXT": "create", "PINSHIM_ASYNC": "off"}
        with tempfile.TemporaryDirectory() as directory:
            without, _, _ = run("handle", False, directory, **settings)
            self.assertIn("program registers: returned 0, last error 0", without)
            out, err, stats = run("handle", True, directory, **settings)
            # The shim registered at the lock; the program's own register,
            # unseen, meets it.
            self.assertIn("program registers: returned 712, last error 712", out)
            # Any caller may unregister: the program removes the shim's.
            self.assertIn("program unregisters: returned 0, last error 0", out)
            self.assertIn("state: after the program's unregister: pointer type 0", out)
            # The shim's own unregister at munlock finds it gone: counted,
            # not warned about, nothing left.
            self.assertNotIn("pinshim:", err)
            self.assertEqual(stats["unregister"]["gone"], 1)
            self.assertEqual(stats["program"]["registrations"], 0)
            self.assertEqual(stats["live"]["ranges"], 0)


if __name__ == "__main__":
    if EMULATOR:
        print(f"SKIP: {foreign('python3')}")
        sys.exit(77)
    if len(sys.argv) > 2 and sys.argv[1] == "--program":
        program(sys.argv[2])
    else:
        unittest.main(verbosity=2)
