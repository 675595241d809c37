#!/usr/bin/env python3
"""The pinshim command, from the build tree: help, version, --print-env, the
environment it passes on, usage errors, --stats, exit statuses and signals,
and the warnings for static and setuid targets.

Environment (set by meson): PINSHIM_CLI, PINSHIM_LIB, PINSHIM_VERSION,
CLI_TARGET (a dynamic program), CLI_TARGET_STATIC ('' when libc.a is absent).
"""

import json
import os
import re
import shutil
import signal
import subprocess
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


CLI = os.environ.get("PINSHIM_CLI", "")
LIBRARY = os.environ.get("PINSHIM_LIB", "")


def clean_environment(**extra):
    """The caller's environment without anything of the shim's."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PINSHIM_", "FAKE_CUDART")) and name != "LD_PRELOAD"
    }
    environment.update(extra)
    return environment


def run(arguments, environment=None, **options):
    return subprocess.run(
        [CLI, *arguments],
        env=environment if environment is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        **options,
    )


class HelpAndVersion(unittest.TestCase):
    def test_help_lists_every_option_and_variable(self):
        result = run(["--help"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        self.assertTrue(result.stdout.startswith("usage: pinshim "), result.stdout[:200])
        for expected in ("--no-register", "--min-bytes SIZE", "--flags LIST", "--cudart LIB",
                         "--stats[=FILE]", "--stats-all", "--log LEVEL", "--print-env",
                         "--version", "report [--all] [--json] [--prune]",
                         "top [--once] [--bytes] [--interval SECONDS] [DIR...]"):
            self.assertIn(expected, result.stdout)
        markdown = run(["--help-options-markdown"]).stdout
        variables = re.findall(r"^\| `(PINSHIM_[A-Z_]+)`", markdown, re.MULTILINE)
        self.assertGreaterEqual(len(variables), 6, markdown)
        for variable in variables:
            self.assertIn(f"env {variable};", result.stdout)

    def test_version(self):
        result = run(["--version"])
        self.assertEqual(result.returncode, 0)
        self.assertEqual(result.stdout, f"pinshim {os.environ['PINSHIM_VERSION']}\n")


class Subcommands(unittest.TestCase):
    """report and top run the scripts as the first argument only: after --,
    or after an option, they are the names of programs to run."""

    def test_report_and_top_run_the_scripts(self):
        for subcommand, script in (("report", "pinshim-report"), ("top", "pinshim-top")):
            with self.subTest(subcommand=subcommand):
                result = run([subcommand, "--help"])
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertTrue(result.stdout.startswith(f"usage: {script} "),
                                result.stdout[:200])
                result = run([subcommand, "--frobnicate"])
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"usage: {script} ", result.stderr)

    @unittest.skipIf(EMULATOR, foreign("sh"))
    def test_after_double_dash_they_are_programs(self):
        with tempfile.TemporaryDirectory() as directory:
            for name in ("top", "report"):
                program = os.path.join(directory, name)
                with open(program, "w", encoding="utf-8") as handle:
                    handle.write(f'#!/bin/sh\necho "the program {name} ran: $*"\n')
                os.chmod(program, 0o755)
            environment = clean_environment(PATH=directory + ":" + os.environ.get("PATH", ""))
            for arguments, expected in ((["--", "top", "--once"], "the program top ran: --once"),
                                        (["--log", "quiet", "top"], "the program top ran: "),
                                        (["--", "report", "x"], "the program report ran: x")):
                with self.subTest(arguments=arguments):
                    result = run(arguments, environment)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    self.assertEqual(result.stdout, expected + "\n")


class SourceCheckoutWrapper(unittest.TestCase):
    """scripts/pinshim runs the built command from a source checkout."""

    def test_wrapper_runs_the_built_command(self):
        wrapper = os.path.join(os.environ["SOURCE_SCRIPTS"], "pinshim")
        environment = clean_environment(BUILD_DIR=os.environ["BUILD_ROOT"])
        result = subprocess.run([wrapper, "--print-env", "--stats"], env=environment,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"LD_PRELOAD={LIBRARY}", result.stdout.splitlines())
        self.assertIn("PINSHIM_STATS=1", result.stdout.splitlines())

    def test_wrapper_says_what_to_build(self):
        wrapper = os.path.join(os.environ["SOURCE_SCRIPTS"], "pinshim")
        with tempfile.TemporaryDirectory() as empty:
            result = subprocess.run([wrapper, "--version"],
                                    env=clean_environment(BUILD_DIR=empty),
                                    capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 127)
        self.assertIn("is not built yet", result.stderr)


class PrintEnv(unittest.TestCase):
    def parse(self, stdout):
        return [tuple(line.split("=", 1)) for line in stdout.splitlines()]

    def test_library_alone_when_no_preload(self):
        result = run(["--print-env"])
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = self.parse(result.stdout)
        self.assertEqual(len(lines), 1, result.stdout)
        name, value = lines[0]
        self.assertEqual(name, "LD_PRELOAD")
        self.assertTrue(os.path.isabs(value), value)
        self.assertTrue(os.path.samefile(value, LIBRARY), f"{value} is not {LIBRARY}")

    def test_prepends_to_existing_preload_and_prints_what_options_set(self):
        environment = clean_environment(LD_PRELOAD="/opt/other/libother.so:libm.so.6",
                                        PINSHIM_FLAGS="portable", KEEP_ME="1")
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "ran")
            result = run(["--print-env", "--min-bytes", "1M", "--log=info", "--no-register",
                          "--stats", "--", "touch", marker], environment)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertFalse(os.path.exists(marker), "--print-env ran the command")
        lines = self.parse(result.stdout)
        name, value = lines[0]
        self.assertEqual(name, "LD_PRELOAD")
        library, rest = value.split(":", 1)
        self.assertTrue(os.path.isabs(library) and os.path.samefile(library, LIBRARY), library)
        self.assertEqual(rest, "/opt/other/libother.so:libm.so.6")
        # Only what the options set; PINSHIM_FLAGS and KEEP_ME pass through untouched.
        self.assertEqual(sorted(lines[1:]), sorted([("PINSHIM_MIN_BYTES", "1M"),
                                                   ("PINSHIM_LOG", "info"),
                                                   ("PINSHIM_REGISTER", "0"),
                                                   ("PINSHIM_STATS", "1")]))


class Environment(unittest.TestCase):
    @unittest.skipIf(EMULATOR, foreign("sh"))
    def test_command_gets_shim_options_and_the_rest_of_the_environment(self):
        environment = clean_environment(LD_PRELOAD="libm.so.6", PINSHIM_FLAGS="portable",
                                        KEEP_ME="kept value")
        script = ('printf "%s\\n" "$LD_PRELOAD" "$PINSHIM_MIN_BYTES" "$PINSHIM_LOG" '
                  '"$PINSHIM_FLAGS" "$KEEP_ME"; grep -c libpinshim /proc/$$/maps')
        result = run(["--min-bytes", "2M", "--log", "quiet", "--", "sh", "-c", script],
                     environment)
        self.assertEqual(result.returncode, 0, result.stderr)
        preload, min_bytes, log, flags, kept, mapped = result.stdout.splitlines()
        library, rest = preload.split(":", 1)
        self.assertTrue(os.path.samefile(library, LIBRARY))
        self.assertEqual(rest, "libm.so.6")
        self.assertEqual((min_bytes, log, flags, kept), ("2M", "quiet", "portable", "kept value"))
        self.assertGreaterEqual(int(mapped), 1, "libpinshim.so is not mapped in the command")


class UsageErrors(unittest.TestCase):
    CASES = [
        (["--min-bytes", "12Q"], "--min-bytes"),
        (["--log", "loud"], "--log"),
        (["--flags", "portable,pinned"], "--flags"),
        (["--stats=out.%x.json"], "--stats"),
        (["--no-register=1"], "--no-register"),
        (["--stats-all=1"], "--stats-all"),
        (["--frobnicate"], "--frobnicate"),
    ]

    def test_bad_options_exit_2_with_usage_and_run_nothing(self):
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "ran")
            for arguments, named in self.CASES:
                with self.subTest(arguments=arguments):
                    result = run([*arguments, "--", "touch", marker])
                    self.assertEqual(result.returncode, 2, result.stderr)
                    self.assertIn(named, result.stderr)
                    self.assertIn("usage: pinshim", result.stderr)
                    self.assertEqual(result.stdout, "")
                    self.assertFalse(os.path.exists(marker))

    def test_invalid_value_names_what_is_accepted(self):
        result = run(["--log", "loud", "true"])
        self.assertIn('--log "loud" is not valid', result.stderr)
        self.assertIn("accepted: quiet, warn, info, debug", result.stderr)

    def test_missing_value_and_missing_command(self):
        for arguments in (["--log"], [], ["--stats"], ["--"]):
            with self.subTest(arguments=arguments):
                result = run(arguments)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("usage: pinshim", result.stderr)


class Stats(unittest.TestCase):
    # cli_target and env lock nothing and get no warning: the shim has nothing
    # to say about them, so only --stats-all makes them print a summary.
    def test_bare_stats_is_a_summary_and_never_takes_the_command(self):
        # The word after a bare --stats is the command, not a file.
        result = run(["--stats", "--stats-all", os.environ["CLI_TARGET"], "0"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "cli_target ran\n")
        self.assertRegex(result.stderr, r"(?m)^pinshim: pid \d+ on .*: registered 0")

    def test_no_summary_from_a_process_with_nothing_to_say(self):
        result = run(["--stats", os.environ["CLI_TARGET"], "0"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "cli_target ran\n")
        self.assertEqual(result.stderr, "")

    def test_a_warning_is_something_to_say(self):
        result = run(["--stats", os.environ["CLI_TARGET"], "0"],
                     clean_environment(PINSHIM_MIN_BYTES="lots"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn('pinshim: PINSHIM_MIN_BYTES="lots" is not valid', result.stderr)
        self.assertRegex(result.stderr, r"(?m)^pinshim: pid \d+ on .*: registered 0")

    def test_stats_all_sets_its_variable(self):
        result = run(["--print-env", "--stats-all", "--", "true"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("PINSHIM_STATS_ALL=1", result.stdout.splitlines())

    # GNU coreutils (env, cat, ls, ...) close stdout and stderr in their exit
    # handlers (gnulib close_stdout), before the shim's destructor writes the
    # summary: the shim keeps a copy of stderr for that (regression test).
    @unittest.skipIf(EMULATOR, foreign("env"))
    def test_summary_when_the_program_closes_stderr_at_exit(self):
        result = run(["--stats", "--stats-all", "env"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("PINSHIM_STATS=1", result.stdout.splitlines())
        self.assertRegex(result.stderr, r"(?m)^pinshim: pid \d+ on .*: registered 0")

    @unittest.skipIf(EMULATOR, foreign("true"))
    def test_stats_file_is_written_by_the_command_itself(self):
        with tempfile.TemporaryDirectory() as directory:
            template = os.path.join(directory, "stats.%h.%p.json")
            process = subprocess.Popen([CLI, f"--stats={template}", "--stats-all", "--", "true"],
                                       env=clean_environment(), stderr=subprocess.PIPE,
                                       text=True)
            _, stderr = process.communicate(timeout=60)
            self.assertEqual(process.returncode, 0, stderr)
            self.assertEqual(stderr, "")
            files = os.listdir(directory)
            self.assertEqual(len(files), 1, files)
            # pinshim execs the command: the stats carry pinshim's own pid.
            self.assertTrue(files[0].endswith(f".{process.pid}.json"), files)
            with open(os.path.join(directory, files[0]), encoding="utf-8") as handle:
                stats = json.load(handle)
            self.assertEqual(stats["pid"], process.pid)
            self.assertEqual(os.path.basename(stats["exe"]), "true")
            self.assertEqual(stats["config"]["STATS"], template)


class ExitStatus(unittest.TestCase):
    def test_exit_status_is_the_commands(self):
        for status in (0, 1, 7, 255):
            with self.subTest(status=status):
                result = run(["--", "sh", "-c", f"exit {status}"])
                self.assertEqual(result.returncode, status, result.stderr)

    def test_signal_is_seen_by_the_parent(self):
        result = run(["--", "sh", "-c", "kill -TERM $$"])
        self.assertEqual(result.returncode, -signal.SIGTERM)

    def test_command_not_found_or_not_executable(self):
        result = run(["--", "/nonexistent/program"])
        self.assertEqual(result.returncode, 127)
        self.assertIn("cannot run /nonexistent/program", result.stderr)
        with tempfile.NamedTemporaryFile(suffix=".txt") as not_executable:
            result = run(["--", not_executable.name])
            self.assertEqual(result.returncode, 126, result.stderr)

    def test_library_not_found(self):
        result = run(["--", "true"], clean_environment(PINSHIM_LIBRARY="/nonexistent/lib.so"))
        self.assertEqual(result.returncode, 127)
        self.assertIn("cannot find libpinshim.so", result.stderr)


class Targets(unittest.TestCase):
    def test_dynamic_target_gets_no_warning(self):
        result = run(["--", os.environ["CLI_TARGET"], "5"])
        self.assertEqual(result.returncode, 5)
        self.assertEqual(result.stdout, "cli_target ran\n")
        self.assertEqual(result.stderr, "")

    @unittest.skipUnless(os.environ.get("CLI_TARGET_STATIC"),
                         "no static C library (libc.a, Debian libc6-dev) to build a static target")
    def test_static_target_is_named_and_still_runs(self):
        target = os.environ["CLI_TARGET_STATIC"]
        result = run(["--", target, "3"])
        self.assertEqual(result.returncode, 3)
        self.assertEqual(result.stdout, "cli_target ran\n")
        self.assertIn(f"pinshim: {target} is statically linked", result.stderr)

    def test_setuid_and_setgid_targets_are_named_and_still_run(self):
        with tempfile.TemporaryDirectory() as directory:
            for mode, word in ((0o4755, "setuid"), (0o2755, "setgid")):
                with self.subTest(word=word):
                    copy = os.path.join(directory, f"target_{word}")
                    shutil.copyfile(os.environ["CLI_TARGET"], copy)
                    os.chmod(copy, mode)
                    if not os.stat(copy).st_mode & (0o4000 if word == "setuid" else 0o2000):
                        self.skipTest(f"this file system does not keep the {word} bit")
                    result = run(["--", copy, "4"])
                    self.assertEqual(result.returncode, 4, result.stderr)
                    self.assertEqual(result.stdout, "cli_target ran\n")
                    self.assertIn(f"pinshim: {copy} is {word}", result.stderr)
                    self.assertIn("ignores LD_PRELOAD", result.stderr)

    def test_target_found_on_path(self):
        directory = os.path.dirname(os.environ["CLI_TARGET"])
        environment = clean_environment(PATH=directory + ":" + os.environ.get("PATH", ""))
        result = run(["cli_target", "6"], environment)
        self.assertEqual(result.returncode, 6, result.stderr)


if __name__ == "__main__":
    if not CLI or not os.access(CLI, os.X_OK):
        print("PINSHIM_CLI is not set to the pinshim command (run through meson test)")
        raise SystemExit(1)
    unittest.main(verbosity=2)
