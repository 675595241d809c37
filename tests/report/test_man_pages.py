#!/usr/bin/env python3
"""The man pages: groff formats them without a warning, and they cannot fall
behind the code: every variable of the option table (pinshim
--help-options-markdown, the README's table) is in pinshim.7 with the same
values, default and meaning, every option of pinshim --help, pinshim-report
--help and pinshim-top --help is in pinshim.1, and so is every Prometheus
metric pinshim-report can print; and every key of the JSON statistics that libpinshim.so writes is
described in the STATISTICS section of pinshim.7.

Environment (set by meson): PINSHIM_CLI, PINSHIM_MAN_DIR, PINSHIM_VERSION,
PINSHIM_LIB, PINSHIM_REPORT, PINSHIM_TOP.
"""

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
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


MAN_DIR = os.environ.get("PINSHIM_MAN_DIR", "")
CLI = os.environ.get("PINSHIM_CLI", "")

# Alternating-font macros join their arguments; the others space them.
JOINING_MACROS = {"BR", "RB", "BI", "IB", "IR", "RI"}
SPACING_MACROS = {"B", "I", "SM", "SB", "SH", "SS", "TH", "TP"}


def roff_arguments(text):
    """Splits a macro line's arguments as troff does (double quotes group)."""
    return [quoted if quoted or not bare else bare
            for quoted, bare in re.findall(r'"((?:[^"]|"")*)"|(\S+)', text)]


def unescape(text):
    text = re.sub(r"\\f(\[[^]]*\]|\(..|.)", "", text)  # font changes
    text = re.sub(r"\\s[-+]?\d", "", text)  # size changes
    replacements = {r"\-": "-", r"\(em": "\u2014", r"\(en": "\u2013", r"\(bu": "\u2022",
                    r"\(lq": "\u201c", r"\(rq": "\u201d", r"\(dq": '"', r"\e": "\\",
                    r"\&": "", r"\%": "", r"\|": "", r"\^": "", r"\ ": " ", r"\c": ""}
    for escape, replacement in replacements.items():
        text = text.replace(escape, replacement)
    return text


def page_text(path):
    """The words of a roff page, markup removed, whitespace collapsed."""
    with open(path, encoding="utf-8") as handle:
        return roff_text(handle.read().splitlines())


def roff_text(lines):
    """The words of roff source lines, markup removed, whitespace collapsed."""
    words = []
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            macro, _, rest = line[1:].partition(" ")
            arguments = roff_arguments(rest)
            if macro in JOINING_MACROS:
                words.append("".join(arguments))
            elif macro == "IP":  # the tag; the indent is not text
                words.append(arguments[0] if arguments else "")
            elif macro in SPACING_MACROS:
                words.append(" ".join(arguments))
            # Other requests (.PP, .br, .nf, ...) carry no text.
            continue
        words.append(line)
    # A \c at the end of a line joins it to the next one.
    text = "\n".join(words).replace("\\c\n", "")
    return " ".join(unescape(text).split())


def statistics_entries(path):
    """The tagged paragraphs (.TP) of pinshim.7's STATISTICS section: a list of
    (keys named in the tag, text of the body)."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    start = lines.index(".SH STATISTICS")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(".SH "))
    entries, current = [], None
    for line in lines[start + 1:end]:
        if line == ".TP" or (line.startswith(".") and line[1:3] in ("PP", "SS")):
            if current is not None:
                entries.append(current)
            current = [] if line == ".TP" else None
        elif current is not None:
            current.append(line)
    if current is not None:
        entries.append(current)
    tagged = []
    for entry in entries:
        if not entry:
            continue
        tag = roff_text(entry[:1])
        tagged.append(([key.strip() for key in tag.split(",")], roff_text(entry[1:])))
    return tagged


def stats_document():
    """The JSON document libpinshim.so writes at exit (PINSHIM_STATS_ALL=1 makes
    a process that locks nothing write it), or None without the library."""
    library = os.environ.get("PINSHIM_LIB", "")
    program = shutil.which("true")
    if EMULATOR or not library or not os.path.exists(library) or program is None:
        return None
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "stats.json")
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("PINSHIM_") and name != "LD_PRELOAD"}
        env.update(LD_PRELOAD=library, PINSHIM_STATS=path, PINSHIM_STATS_ALL="1")
        subprocess.run([program], env=env, check=True, timeout=60)
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)


def run_cli(*arguments):
    result = subprocess.run([CLI, *arguments], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"pinshim {' '.join(arguments)} failed: {result.stderr}")
    return result.stdout


def option_table():
    """The rows of pinshim --help-options-markdown, cells unescaped."""
    rows = []
    for line in run_cli("--help-options-markdown").splitlines()[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        cells = [cell.replace("\\|", "|").strip("`") for cell in cells]
        if len(cells) == 5:
            rows.append(dict(zip(("variable", "option", "values", "default", "meaning"), cells)))
    return rows


class Groff(unittest.TestCase):
    def test_pages_format_without_warnings(self):
        groff = shutil.which("groff")
        if groff is None:
            self.skipTest("groff is not installed (Debian groff-base): pages not formatted")
        for page in ("pinshim.1", "pinshim.7"):
            with self.subTest(page=page):
                # Not -z: some warnings (a line that cannot be broken) only
                # come when output is produced.
                result = subprocess.run([groff, "-man", "-Tutf8", "-ww", page], cwd=MAN_DIR,
                                        capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stderr, "", f"groff warns about {page}")
                # grotty may embolden by overstriking: drop "x\b" pairs.
                self.assertIn("SYNOPSIS", re.sub(".\b", "", result.stdout))


class Coverage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.section1 = page_text(os.path.join(MAN_DIR, "pinshim.1"))
        cls.section7 = page_text(os.path.join(MAN_DIR, "pinshim.7"))
        cls.rows = option_table()

    def test_table_was_read(self):
        self.assertGreaterEqual(len(self.rows), 6)
        self.assertTrue(all(row["variable"].startswith("PINSHIM_") for row in self.rows))

    def test_every_variable_is_in_pinshim_7_as_in_the_table(self):
        for row in self.rows:
            # Each entry reads "VARIABLE Option: ... Values: ... Default: ... meaning".
            expected = {
                "option": f"{row['variable']} Option: {row['option']}.",
                "values": f"Values: {row['values']}. Default: {row['default']}.",
                "meaning": f"Default: {row['default']}. {row['meaning']}",
            }
            for field, text in expected.items():
                with self.subTest(variable=row["variable"], field=field):
                    wanted = " ".join(text.split())
                    self.assertTrue(wanted in self.section7,
                                    f"pinshim.7 lacks the {field} of {row['variable']} as "
                                    f"src/options.c has it: {wanted!r}")

    def test_every_option_of_help_is_in_pinshim_1(self):
        help_text = run_cli("--help")
        options = []
        for line in help_text.splitlines():
            match = re.match(r"^  (--[^\s,]+(?: [A-Z]+)?(?:, --[^\s,]+)*)\s", line)
            if match:
                options += match.group(1).split(", ")
        self.assertIn("--print-env", options)
        self.assertGreaterEqual(len(options), 9, options)
        for option in options:
            with self.subTest(option=option):
                self.assertTrue(option in self.section1, f"pinshim.1 lacks {option}")
        for variable in re.findall(r"env (PINSHIM_[A-Z_]+);", help_text):
            with self.subTest(variable=variable):
                self.assertTrue(variable in self.section1, f"pinshim.1 lacks {variable}")
        # The same synopses as the usage of pinshim --help (which says FILES).
        for synopsis in ("pinshim report [--all] [--json] [--prune] [--no-runtime-records] FILE...",
                         "pinshim report [--prometheus] [--prometheus-file PATH] [--prune] "
                         "[--no-runtime-records] FILE...",
                         "pinshim top [--once] [--bytes] [--interval SECONDS] [DIR...]",
                         "pinshim top [--once] [--prometheus] [--prometheus-file PATH] "
                         "[--interval SECONDS] [DIR...]"):
            with self.subTest(synopsis=synopsis):
                self.assertTrue(synopsis in self.section1, f"pinshim.1 lacks {synopsis}")
                self.assertIn(synopsis.replace("FILE...", "FILES..."), help_text)

    def test_every_option_of_report_and_top_is_in_pinshim_1(self):
        for script in ("PINSHIM_REPORT", "PINSHIM_TOP"):
            result = subprocess.run([sys.executable, os.environ[script], "--help"],
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            options = set(re.findall(r"^  (--[a-z-]+)", result.stdout, re.MULTILINE))
            self.assertIn("--prometheus-file", options)
            for option in sorted(options - {"--help"}):
                with self.subTest(script=script, option=option):
                    self.assertTrue(option in self.section1, f"pinshim.1 lacks {option}")

    def test_every_prometheus_metric_is_in_pinshim_1(self):
        loader = importlib.machinery.SourceFileLoader("pinshim_report",
                                                      os.environ["PINSHIM_REPORT"])
        report = importlib.util.module_from_spec(
            importlib.util.spec_from_loader("pinshim_report", loader))
        loader.exec_module(report)
        # The page names each metric as its job total, pinshim_NAME, and says
        # that every one also comes per process, as pinshim_process_NAME.
        names = [f"pinshim_{name}" for name, *_ in report.PROMETHEUS_JOB_METRICS
                 + report.PROMETHEUS_METRICS]
        names += [f"pinshim_process_{name}" for name, *_ in report.PROMETHEUS_PROCESS_METRICS]
        names.append("pinshim_report_skipped_files")
        self.assertGreaterEqual(len(names), 20)
        section = self.section1[self.section1.index("PROMETHEUS METRICS"):]
        for name in names:
            with self.subTest(metric=name):
                self.assertTrue(re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", section),
                                f"pinshim.1's PROMETHEUS METRICS lacks {name}")

    def test_version_in_title_lines(self):
        version = os.environ["PINSHIM_VERSION"]
        for name, text in (("pinshim.1", self.section1), ("pinshim.7", self.section7)):
            with self.subTest(page=name):
                self.assertTrue(f"pinshim {version}" in text,
                                f"{name} does not say pinshim {version}")

    def test_report_and_top_pages_point_to_pinshim_1(self):
        for page in ("pinshim-report.1", "pinshim-top.1"):
            with self.subTest(page=page), open(os.path.join(MAN_DIR, page),
                                               encoding="utf-8") as handle:
                self.assertEqual(handle.read(), ".so man1/pinshim.1\n")


class StatisticsKeys(unittest.TestCase):
    """Every key of the stats JSON has a tagged entry in pinshim.7's STATISTICS,
    and the keys inside each object are named in its entry (config's are the
    option table's variables, checked above)."""

    @classmethod
    def setUpClass(cls):
        cls.document = stats_document()
        cls.entries = statistics_entries(os.path.join(MAN_DIR, "pinshim.7"))

    def entry(self, key):
        for tags, body in self.entries:
            if key in tags:
                return body
        return None

    @unittest.skipIf(EMULATOR, foreign("true"))
    def test_every_key_is_described(self):
        if self.document is None:
            self.skipTest("libpinshim.so (PINSHIM_LIB) or true(1) missing: no stats document")
        for key, value in self.document.items():
            with self.subTest(key=key):
                body = self.entry(key)
                self.assertIsNotNone(body, f"pinshim.7's STATISTICS has no entry for {key!r}")
                if not isinstance(value, dict) or key in ("config", "errors"):
                    continue
                for inner in value:
                    self.assertRegex(body, rf"(?<![\w.]){re.escape(inner)}(?![\w])",
                                     f"pinshim.7's entry for {key!r} does not name {inner!r}")


if __name__ == "__main__":
    if not MAN_DIR or not CLI:
        print("PINSHIM_MAN_DIR and PINSHIM_CLI are not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
