#!/usr/bin/env python3
"""The installed tree: meson install into a temporary DESTDIR, then everything
is used from there: the command (which finds the library relative to itself),
the library on a real program, pinshim-report, the header, the pkg-config
file and the man pages.

Environment (set by meson): MESON_BUILD_ROOT, MESON_COMMAND, PINSHIM_VERSION,
INSTALL_PREFIX, INSTALL_BINDIR, INSTALL_LIBDIR, INSTALL_INCLUDEDIR,
INSTALL_MANDIR (absolute, as configured), FAKE_CUDART, MEMTESTER ('' when
absent), CC_COMMAND.
"""

import json
import os
import resource
import shlex
import shutil
import stat
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


VERSION = os.environ.get("PINSHIM_VERSION", "")


def staged(path):
    """Where an absolute install path lands under the DESTDIR."""
    return os.path.join(Installed.destdir, os.path.relpath(path, "/"))


def clean_environment(**extra):
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PINSHIM_", "FAKE_CUDART", "PKG_CONFIG")) and name != "LD_PRELOAD"
    }
    environment.update(extra)
    return environment


class Installed(unittest.TestCase):
    destdir = ""
    temporary = None

    @classmethod
    def setUpClass(cls):
        cls.temporary = tempfile.TemporaryDirectory(prefix="pinshim-install-")
        cls.destdir = os.path.join(cls.temporary.name, "destdir")
        meson = os.environ.get("MESON_COMMAND") or shutil.which("meson")
        if not meson:
            raise unittest.SkipTest("meson is not on PATH")
        # meson test has built everything; do not start a second build here.
        command = [meson, "install", "-C", os.environ["MESON_BUILD_ROOT"], "--no-rebuild",
                   "--quiet", "--destdir", cls.destdir]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise AssertionError(f"{shlex.join(command)} failed:\n{result.stdout}{result.stderr}")
        cls.bindir = staged(os.environ["INSTALL_BINDIR"])
        cls.libdir = staged(os.environ["INSTALL_LIBDIR"])
        cls.includedir = staged(os.environ["INSTALL_INCLUDEDIR"])
        cls.mandir = staged(os.environ["INSTALL_MANDIR"])
        cls.command = os.path.join(cls.bindir, "pinshim")
        cls.library = os.path.join(cls.libdir, "libpinshim.so")

    @classmethod
    def tearDownClass(cls):
        if cls.temporary is not None:
            cls.temporary.cleanup()

    def run_installed(self, arguments, environment=None, **options):
        return subprocess.run([self.command, *arguments],
                              env=environment or clean_environment(),
                              capture_output=True, text=True, timeout=60, **options)

    def test_files_are_installed(self):
        for path, executable in ((self.command, True),
                                 (os.path.join(self.bindir, "pinshim-report"), True),
                                 (os.path.join(self.bindir, "pinshim-top"), True),
                                 (self.library, False),
                                 (os.path.join(self.includedir, "pinshim.h"), False),
                                 (os.path.join(self.libdir, "pkgconfig", "pinshim.pc"), False),
                                 (os.path.join(self.mandir, "man1", "pinshim.1"), False),
                                 (os.path.join(self.mandir, "man1", "pinshim-report.1"), False),
                                 (os.path.join(self.mandir, "man1", "pinshim-top.1"), False),
                                 (os.path.join(self.mandir, "man7", "pinshim.7"), False)):
            with self.subTest(path=path):
                self.assertTrue(os.path.isfile(path), f"{path} is not installed")
                if executable:
                    mode = os.stat(path).st_mode
                    self.assertEqual(mode & 0o755, 0o755, f"{path} mode {stat.filemode(mode)}")

    def test_command_finds_the_library_relative_to_itself(self):
        result = self.run_installed(["--print-env"])
        self.assertEqual(result.returncode, 0, result.stderr)
        name, value = result.stdout.splitlines()[0].split("=", 1)
        self.assertEqual(name, "LD_PRELOAD")
        self.assertTrue(os.path.isabs(value), value)
        self.assertTrue(os.path.samefile(value, self.library),
                        f"installed pinshim preloads {value}, not {self.library}")
        self.assertEqual(self.run_installed(["--version"]).stdout, f"pinshim {VERSION}\n")

    @unittest.skipUnless(os.environ.get("MEMTESTER"), "memtester is not installed (scripts/deps)")
    @unittest.skipIf(EMULATOR, foreign("memtester"))
    def test_installed_command_on_memtester_then_report(self):
        # memtester locks its 4 MiB; without the lock nothing is registered.
        # memtester never initialises CUDA, so with PINSHIM_CONTEXT=program
        # (the default) its lock waits for a context that never comes; the
        # fake runtime stands in for a program that wants it pinned anyway.
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
            soft = hard
        if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and soft < 5 * 1048576:
            self.skipTest(f"RLIMIT_MEMLOCK is {soft} bytes, memtester locks 4 MiB (ulimit -l)")
        with tempfile.TemporaryDirectory() as directory:
            stats_path = os.path.join(directory, "memtester.%p.json")
            log_path = os.path.join(directory, "fake.log")
            result = self.run_installed(
                [f"--cudart={os.environ['FAKE_CUDART']}", "--context", "create", "--async", "off",
                 f"--stats={stats_path}", "--",
                 os.environ["MEMTESTER"], "4M", "1"],
                clean_environment(FAKE_CUDART_LOG=log_path))
            self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr)
            files = [name for name in os.listdir(directory) if name.endswith(".json")]
            self.assertEqual(len(files), 1, files)
            stats_file = os.path.join(directory, files[0])
            with open(stats_file, encoding="utf-8") as handle:
                stats = json.load(handle)
            self.assertEqual(os.path.basename(stats["exe"]), "memtester")
            self.assertGreaterEqual(stats["register"]["ok"], 1, stats)
            self.assertEqual(stats["register"]["failed"], 0, stats)
            self.assertTrue(stats["cudart"]["usable"], stats["cudart"])
            with open(log_path, encoding="utf-8") as handle:
                log = handle.read()
            self.assertNotIn("violation", log)
            self.assertIn("register ", log)

            for command in ([os.path.join(self.bindir, "pinshim-report"), "--json", directory],
                            [self.command, "report", "--json", stats_file]):
                with self.subTest(command=command[0]):
                    report = subprocess.run(command, capture_output=True, text=True, timeout=60)
                    self.assertEqual(report.returncode, 0, report.stderr)
                    document = json.loads(report.stdout)
                    self.assertEqual(document["totals"]["processes"], 1)
                    self.assertEqual(document["processes"][0]["exe_name"], "memtester")
                    self.assertEqual(document["totals"]["registrations"],
                                     stats["register"]["ok"])
            table = subprocess.run([self.command, "report", directory], capture_output=True,
                                   text=True, timeout=60)
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("memtester", table.stdout)
            self.assertRegex(table.stdout, r"(?m)^  slowest +\S+ pid \d+ \(memtester\)")

    def test_installed_top_finds_its_reader(self):
        """pinshim-top loads pinshim-report from beside itself, in bindir."""
        with tempfile.TemporaryDirectory() as directory:
            for command in ([os.path.join(self.bindir, "pinshim-top"), "--once", directory],
                            [self.command, "top", "--once", directory]):
                with self.subTest(command=command[0]):
                    result = subprocess.run(command, env=clean_environment(),
                                            capture_output=True, text=True, timeout=60)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    self.assertEqual(result.stderr, "")
                    self.assertIn(f"no running process has a live record in {directory}",
                                  result.stdout)
            self.assertFalse(os.path.exists(os.path.join(self.bindir, "__pycache__")))

    def test_header_compiles(self):
        compiler = shlex.split(os.environ["CC_COMMAND"])
        with tempfile.TemporaryDirectory() as directory:
            source = os.path.join(directory, "use_header.c")
            with open(source, "w", encoding="utf-8") as handle:
                handle.write(
                    "#include <pinshim.h>\n"
                    "int main(void)\n{\n"
                    "    struct pinshim_counters counters;\n"
                    "    (void)pinshim_get_counters(&counters, sizeof(counters));\n"
                    "    return pinshim_is_registered(&counters) + (pinshim_version() == 0);\n"
                    "}\n")
            result = subprocess.run([*compiler, "-std=c11", "-Wall", "-Wextra", "-Werror",
                                     "-pedantic", "-fsyntax-only", "-I", self.includedir, source],
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)

    def test_pkg_config(self):
        pkg_config = shutil.which("pkg-config")
        if pkg_config is None:
            self.skipTest("pkg-config is not installed")
        environment = clean_environment(PKG_CONFIG_PATH=os.path.join(self.libdir, "pkgconfig"))
        result = subprocess.run([pkg_config, "--cflags", "--libs", "pinshim"], env=environment,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("-lpinshim", result.stdout.split())
        version = subprocess.run([pkg_config, "--modversion", "pinshim"], env=environment,
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(version.stdout.strip(), VERSION)

        # The .pc names the real prefix; pointed at the DESTDIR it builds and
        # links a program against the installed header and library.
        prefix = os.environ["INSTALL_PREFIX"]
        flags = subprocess.run([pkg_config, f"--define-variable=prefix={staged(prefix)}",
                                "--cflags", "--libs", "pinshim"], env=environment,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(flags.returncode, 0, flags.stderr)
        compiler = shlex.split(os.environ["CC_COMMAND"])
        with tempfile.TemporaryDirectory() as directory:
            source = os.path.join(directory, "print_version.c")
            program = os.path.join(directory, "print_version")
            with open(source, "w", encoding="utf-8") as handle:
                handle.write("#include <pinshim.h>\n#include <stdio.h>\n"
                             "int main(void)\n{\n    puts(pinshim_version());\n    return 0;\n}\n")
            build = subprocess.run([*compiler, "-o", program, source,
                                    *shlex.split(flags.stdout)],
                                   capture_output=True, text=True, timeout=60)
            self.assertEqual(build.returncode, 0, build.stderr)
            ran = subprocess.run([program], env=clean_environment(LD_LIBRARY_PATH=self.libdir),
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            self.assertEqual(ran.stdout, f"{VERSION}\n")

    def test_man_pages_render(self):
        groff = shutil.which("groff")
        if groff is None:
            self.skipTest("groff is not installed (Debian groff-base)")
        # From the man directory, as man does: pinshim-report.1 and pinshim-top.1
        # are ".so man1/pinshim.1".
        for page in ("man1/pinshim.1", "man1/pinshim-report.1", "man1/pinshim-top.1",
                     "man7/pinshim.7"):
            with self.subTest(page=page):
                result = subprocess.run([groff, "-man", "-Tutf8", "-ww", page], cwd=self.mandir,
                                        capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stderr, "")
                self.assertIn("pinshim", result.stdout)


if __name__ == "__main__":
    if "MESON_BUILD_ROOT" not in os.environ:
        print("MESON_BUILD_ROOT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
