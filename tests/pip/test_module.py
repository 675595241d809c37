#!/usr/bin/env python3
"""The pinshim Python module (python/pinshim), from the source tree: its
Counters mirror struct pinshim_counters of include/pinshim.h field by field;
without the shim it says so (is_loaded False, clear errors); with the build's
libpinshim.so preloaded and the fake CUDA runtime it sees a Python program's
registrations (lock_program.py); it parses as Python 3.8.

Environment (set by meson): PINSHIM_SOURCE_ROOT, PINSHIM_LIB, FAKE_CUDART,
PINSHIM_VERSION.
"""

import ast
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import unittest

SOURCE_ROOT = os.environ.get("PINSHIM_SOURCE_ROOT", "")
PYTHON_DIR = os.path.join(SOURCE_ROOT, "python")
sys.path.insert(0, PYTHON_DIR)

import pinshim  # noqa: E402  (from the source tree, the path above)

# Under a cross build's emulator (tests/meson.build sets PINSHIM_TEST_EMULATOR)
# the build machine's programs (python3 itself, true, sh) cannot load the shim,
# which is another architecture's.
EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")


def foreign(program):
    """Why a test that runs program under the shim skips under EMULATOR."""
    return (f"under {EMULATOR}: {program} is the build machine's program, of another "
            "architecture than the shim, and cannot load it")


# C types the counters may use, and their ctypes.
C_TYPES = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
           "size_t": ctypes.c_size_t, "double": ctypes.c_double}


def header_counter_fields():
    """(type, name) of each field of struct pinshim_counters in include/pinshim.h."""
    with open(os.path.join(SOURCE_ROOT, "include", "pinshim.h"), encoding="utf-8") as handle:
        text = handle.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", "", text)
    body = re.search(r"struct\s+pinshim_counters\s*\{(.*?)\}\s*;", text, re.DOTALL)
    if body is None:
        raise AssertionError("struct pinshim_counters not found in include/pinshim.h")
    fields = []
    for declaration in body.group(1).split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_ ]*?)\s+([A-Za-z_][A-Za-z0-9_]*)", declaration)
        if match is None:
            raise AssertionError(f"cannot read the field declaration '{declaration}'")
        fields.append((match.group(1), match.group(2)))
    return fields


def clean_environment(**extra):
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PINSHIM_", "FAKE_CUDART", "PYTHON")) and name != "LD_PRELOAD"
    }
    environment.update(extra)
    return environment


class CountersMirrorTheHeader(unittest.TestCase):
    def test_fields_match_include_pinshim_h(self):
        header = header_counter_fields()
        python = [(name, field_type) for name, field_type in pinshim.Counters._fields_]
        header_names = [name for _, name in header]
        python_names = [name for name, _ in python]
        missing = header_names[len(python_names):] if header_names[:len(python_names)] == \
            python_names else None
        hint = (f"append to pinshim.Counters (python/pinshim/__init__.py), in this order: "
                f"{', '.join(f'{name}: int' for name in missing)}" if missing else
                "struct pinshim_counters and pinshim.Counters must list the same fields in the "
                "same order (fields are only ever appended)")
        self.assertEqual(python_names, header_names, hint)
        for (c_type, name), (_, field_type) in zip(header, python):
            with self.subTest(field=name):
                self.assertIn(c_type, C_TYPES, f"{name}: no ctypes for the C type {c_type}")
                self.assertIs(field_type, C_TYPES[c_type],
                              f"{name} is {c_type} in pinshim.h but {field_type.__name__} in "
                              "pinshim.Counters (its fields are all c_uint64: give this one "
                              "its own type)")

    def test_size_is_what_the_header_says(self):
        self.assertEqual(ctypes.sizeof(pinshim.Counters),
                         sum(ctypes.sizeof(C_TYPES[c_type]) for c_type, _ in
                             header_counter_fields()))

    def test_as_dict_keeps_only_filled_fields(self):
        counters = pinshim.Counters(register_ok=3, register_failed=4)
        self.assertEqual(len(counters.as_dict()), len(pinshim.Counters._fields_))
        counters.filled = 8  # as from a shim that knew only the first field
        self.assertEqual(counters.as_dict(), {"register_ok": 3})


class Metadata(unittest.TestCase):
    def test_version_is_the_project_version(self):
        self.assertEqual(pinshim.__version__, os.environ["PINSHIM_VERSION"])

    def test_sources_parse_as_python_3_8(self):
        for name in ("__init__.py", "__main__.py"):
            path = os.path.join(PYTHON_DIR, "pinshim", name)
            with self.subTest(file=name), open(path, encoding="utf-8") as handle:
                ast.parse(handle.read(), filename=path, feature_version=(3, 8))

    def test_typed(self):
        self.assertTrue(os.path.isfile(os.path.join(PYTHON_DIR, "pinshim", "py.typed")))


@unittest.skipIf("libpinshim" in os.environ.get("LD_PRELOAD", ""), "the shim is preloaded here")
class WithoutTheShim(unittest.TestCase):
    def test_not_loaded(self):
        self.assertFalse(pinshim.is_loaded())
        self.assertIsNone(pinshim.version())

    def test_counters_say_the_shim_is_not_loaded(self):
        with self.assertRaises(pinshim.NotLoadedError) as raised:
            pinshim.counters()
        self.assertIn("libpinshim.so is not loaded in this process", str(raised.exception))
        self.assertIn("pinshim -- python", str(raised.exception))
        self.assertIsInstance(raised.exception, RuntimeError)

    def test_drain_says_the_shim_is_not_loaded(self):
        with self.assertRaises(pinshim.NotLoadedError):
            pinshim.drain()

    def test_is_registered_says_the_shim_is_not_loaded(self):
        for obj in (0x10000, ctypes.create_string_buffer(16)):
            with self.subTest(obj=obj), self.assertRaises(pinshim.NotLoadedError):
                pinshim.is_registered(obj)

    def test_is_registered_rejects_what_is_no_memory(self):
        for obj, error in (("0x1000", TypeError), (1.5, TypeError), (True, TypeError),
                           (None, TypeError), (-1, ValueError), (1 << 64, ValueError)):
            with self.subTest(obj=obj), self.assertRaises(error):
                pinshim.is_registered(obj)

    def test_a_tensor_like_object_does_not_import_torch(self):
        class Storage:
            def data_ptr(self):
                return 0x200000

            def nbytes(self):
                return 4096

        class Tensor:
            def untyped_storage(self):
                return Storage()

        with self.assertRaises(pinshim.NotLoadedError):
            pinshim.is_registered(Tensor())
        self.assertNotIn("torch", sys.modules)

    def test_library_path_outside_an_installation(self):
        with self.assertRaises(FileNotFoundError) as raised:
            pinshim.library_path()
        self.assertIn("not installed from the pinshim wheel", str(raised.exception))

    def test_launcher_outside_an_installation(self):
        for arguments in (["--", "true"], ["report", "x.json"], ["top", "--once"]):
            with self.subTest(arguments=arguments):
                result = subprocess.run([sys.executable, "-m", "pinshim", *arguments],
                                        env=clean_environment(PYTHONPATH=PYTHON_DIR),
                                        capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 127, result.stderr)
                self.assertIn("not installed from the pinshim wheel", result.stderr)


class WithTheShim(unittest.TestCase):
    """lock_program.py with the build tree's library preloaded."""

    def test_lock_program_sees_its_registrations(self):
        def raise_memlock_limit():
            soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))

        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if os.geteuid() != 0 and hard != resource.RLIM_INFINITY and hard < 8 << 20:
            self.skipTest(f"RLIMIT_MEMLOCK is {hard} bytes; the program locks 4 MiB (ulimit -l)")
        with tempfile.TemporaryDirectory() as directory:
            log = os.path.join(directory, "fake.log")
            stats = os.path.join(directory, "stats.json")
            environment = clean_environment(
                LD_PRELOAD=os.environ["PINSHIM_LIB"], PINSHIM_CUDART=os.environ["FAKE_CUDART"],
                PINSHIM_CONTEXT="create", PINSHIM_STATS=stats, FAKE_CUDART_LOG=log,
                PYTHONPATH=PYTHON_DIR)
            if "FAKE_CUDART_CHECK" in os.environ:  # scripts/sanitize's
                environment["FAKE_CUDART_CHECK"] = os.environ["FAKE_CUDART_CHECK"]
            result = subprocess.run(
                [sys.executable, os.path.join(os.path.dirname(__file__), "lock_program.py")],
                env=environment, capture_output=True, text=True, timeout=120,
                preexec_fn=raise_memlock_limit)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            seen = json.loads(result.stdout)
            self.assertEqual(seen["register_ok"], 2, seen)
            with open(stats, encoding="utf-8") as handle:
                document = json.load(handle)
            self.assertEqual(document["register"]["ok"], 2, document)
            self.assertEqual(document["live"]["ranges"], 1, document)
            with open(log, encoding="utf-8") as handle:
                self.assertNotIn("violation", handle.read())


if __name__ == "__main__":
    if EMULATOR:
        print(f"SKIP: {foreign('python3')}")
        sys.exit(77)
    if not SOURCE_ROOT:
        print("PINSHIM_SOURCE_ROOT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
