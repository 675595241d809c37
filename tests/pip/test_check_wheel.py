#!/usr/bin/env python3
"""scripts/check-wheel (issue 28), on wheels made here around this build's own
binaries (libpinshim.so and the pinshim command, whatever glibc built them):

  - it reads the same GLIBC_x.y needs as binutils' readelf -V (the newest one
    is the glibc the binaries need);
  - a wheel tagged with exactly that glibc keeps its tags; one tagged one
    minor version older is refused, naming the file and the symbol version,
    also under the manylinux2014 name (2.17) where the binaries need more;
  - a binary of another architecture than the tag's, a file name whose tags
    are not the WHEEL file's, a wheel without binaries and a file that is no
    wheel are refused, each with one 'check-wheel: ...' line;
  - the shim imports no getrandom (glibc 2.25), which the 2.17 wheels cannot
    have: stats.c makes the system call.

Environment (set by meson): PINSHIM_SOURCE_ROOT, PINSHIM_LIB, PINSHIM_CLI.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.environ.get("PINSHIM_SOURCE_ROOT", "")
CHECKER = os.path.join(ROOT, "scripts", "check-wheel")
PRIVATE = ".pinshim.mesonpy.libs"
MACHINES = {"AArch64": "aarch64", "Advanced Micro Devices X86-64": "x86_64"}


def readelf(*arguments):
    return subprocess.run(["readelf", *arguments], capture_output=True, text=True,
                          check=True).stdout


def glibc_needs(path):
    """The GLIBC_x.y versions readelf -V lists under .gnu.version_r."""
    text = readelf("-V", "--wide", path)
    needs = text[text.find(".gnu.version_r"):] if ".gnu.version_r" in text else ""
    found = {tuple(int(part) for part in match.groups())
             for match in re.finditer(r"Name: GLIBC_(\d+)\.(\d+)", needs)}
    return found


def machine(path):
    match = re.search(r"Machine:\s+(.+)", readelf("-h", path))
    return MACHINES.get(match.group(1).strip(), match.group(1).strip())


def make_wheel(directory, platforms, files, wheel_tags=None):
    """pinshim-0.0.0-py3-none-PLATFORMS.whl holding files ({name: path})."""
    name = f"pinshim-0.0.0-py3-none-{platforms}.whl"
    tags = wheel_tags or [f"py3-none-{platform}" for platform in platforms.split(".")]
    path = os.path.join(directory, name)
    with zipfile.ZipFile(path, "w") as wheel:
        for member, source in files.items():
            wheel.write(source, member)
        wheel.writestr("pinshim-0.0.0.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                       + "".join(f"Tag: {tag}\n" for tag in tags))
        wheel.writestr("pinshim-0.0.0.dist-info/RECORD", "")
    return path


def run_checker(*wheels):
    return subprocess.run([sys.executable, CHECKER, *wheels], capture_output=True, text=True,
                          timeout=60)


class CheckWheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("readelf") is None:
            raise unittest.SkipTest("readelf (binutils) is not installed")
        cls.library = os.environ["PINSHIM_LIB"]
        cls.command = os.environ["PINSHIM_CLI"]
        cls.arch = machine(cls.library)
        needs = glibc_needs(cls.library) | glibc_needs(cls.command)
        if not needs:
            raise unittest.SkipTest("the build's binaries need no GLIBC_x.y version")
        cls.newest = max(needs)
        if cls.newest <= (2, 0):
            raise unittest.SkipTest(f"the binaries need glibc {cls.newest}: none older")
        cls.files = {f"{PRIVATE}/libpinshim.so": cls.library, f"{PRIVATE}/pinshim": cls.command}
        cls.directory = tempfile.mkdtemp(prefix="pinshim-check-wheel-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)

    def wheel(self, platforms, files=None, **options):
        directory = tempfile.mkdtemp(dir=self.directory)
        return make_wheel(directory, platforms, self.files if files is None else files, **options)

    def tag(self, version):
        return f"manylinux_{version[0]}_{version[1]}_{self.arch}"

    def test_reads_what_readelf_reads(self):
        result = run_checker(self.wheel(self.tag(self.newest)))
        for member, path in self.files.items():
            newest = max(glibc_needs(path))
            with self.subTest(member=member):
                self.assertIn(f"  {member}: {self.arch}, needs glibc {newest[0]}.{newest[1]} (",
                              result.stdout)
                listed = re.search(re.escape(member) + r": \S+, needs glibc \S+ \((.*)\)\n",
                                   result.stdout)
                self.assertEqual({tuple(int(p) for p in m.groups()) for m in
                                  re.finditer(r"GLIBC_(\d+)\.(\d+)", listed.group(1))},
                                 glibc_needs(path))

    def test_the_glibc_the_binaries_need_is_accepted(self):
        result = run_checker(self.wheel(self.tag(self.newest)))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"\.whl: keeps its tags\n")

    def test_an_older_glibc_is_refused(self):
        older = (self.newest[0], self.newest[1] - 1)
        result = run_checker(self.wheel(self.tag(older)))
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        newest = f"GLIBC_{self.newest[0]}.{self.newest[1]}"
        self.assertRegex(result.stdout,
                         rf"check-wheel: [^\n]*\.whl: {re.escape(PRIVATE)}/\S+ needs [^\n]*"
                         rf"{re.escape(newest)} \([^\n]*newer than glibc "
                         rf"{older[0]}\.{older[1]}\n")
        self.assertRegex(result.stdout, r"\.whl: refused\n")

    def test_the_manylinux2014_name_promises_2_17(self):
        if self.newest <= (2, 17):
            self.skipTest(f"the build's binaries need glibc {self.newest}, which 2.17 has")
        both = f"manylinux_2_17_{self.arch}.manylinux2014_{self.arch}"
        for platforms in (f"manylinux2014_{self.arch}", both):
            with self.subTest(platforms=platforms):
                result = run_checker(self.wheel(platforms))
                self.assertEqual(result.returncode, 1, result.stdout)
                self.assertIn("newer than glibc 2.17", result.stdout)

    def test_another_architecture_is_refused(self):
        other = "x86_64" if self.arch == "aarch64" else "aarch64"
        result = run_checker(self.wheel(f"manylinux_{self.newest[0]}_{self.newest[1]}_{other}"))
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn(f"is built for {self.arch}, the tags say {other}", result.stdout)

    def test_tags_of_the_name_and_of_the_wheel_file_must_agree(self):
        platforms = self.tag(self.newest)
        wheel = self.wheel(platforms, wheel_tags=[f"py3-none-manylinux_2_5_{self.arch}"])
        result = run_checker(wheel)
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertRegex(result.stdout, r"^check-wheel: \S+\.whl: the file name's tags .* are "
                                        r"not the WHEEL file's")

    def test_a_wheel_without_binaries_is_refused(self):
        result = run_checker(self.wheel(self.tag(self.newest),
                                        files={"pinshim/__init__.py": __file__}))
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("holds no ELF file", result.stdout)

    def test_a_file_that_is_no_wheel(self):
        path = os.path.join(self.directory, "pinshim-0.0.0-py3-none-linux_x86_64.whl")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("not a zip\n")
        result = run_checker(path)
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertEqual(result.stdout.count("\n"), 1, result.stdout)
        self.assertTrue(result.stdout.startswith(f"check-wheel: {path}: cannot read it as a "
                                                 "wheel"), result.stdout)

    def test_linux_tags_promise_no_glibc(self):
        result = run_checker(self.wheel(f"linux_{self.arch}"))
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("glibc at most none", result.stdout)


class OldGlibc(unittest.TestCase):
    """What the glibc 2.17 wheels need of the source, whatever glibc built it."""

    def test_the_shim_imports_no_getrandom(self):
        # glibc has getrandom() since 2.25: stats.c makes the system call itself.
        if shutil.which("readelf") is None:
            self.skipTest("readelf (binutils) is not installed")
        symbols = readelf("--dyn-syms", "--wide", os.environ["PINSHIM_LIB"])
        undefined = {line.split()[7].split("@")[0] for line in symbols.splitlines()
                     if len(line.split()) >= 8 and line.split()[6] == "UND"}
        self.assertTrue("syscall" in undefined, "libpinshim.so imports no syscall")
        self.assertFalse("getrandom" in undefined, "libpinshim.so imports getrandom, which "
                         "glibc has only since 2.25: the wheels promise 2.17")


if __name__ == "__main__":
    if not ROOT:
        print("PINSHIM_SOURCE_ROOT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
