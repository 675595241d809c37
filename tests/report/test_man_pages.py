#!/usr/bin/env python3
"""The man pages: groff formats them without a warning, and they cannot fall
behind the code: every variable of the option table (pinshim
--help-options-markdown, the README's table) is in pinshim.7 with the same
values, default and meaning, and every option of pinshim --help is in
pinshim.1.

Environment (set by meson): PINSHIM_CLI, PINSHIM_MAN_DIR, PINSHIM_VERSION.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

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
    words = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
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
        self.assertTrue("pinshim report [--all] [--json] FILE..." in self.section1,
                        "pinshim.1 lacks the report synopsis")

    def test_version_in_title_lines(self):
        version = os.environ["PINSHIM_VERSION"]
        for name, text in (("pinshim.1", self.section1), ("pinshim.7", self.section7)):
            with self.subTest(page=name):
                self.assertTrue(f"pinshim {version}" in text,
                                f"{name} does not say pinshim {version}")

    def test_report_page_points_to_pinshim_1(self):
        with open(os.path.join(MAN_DIR, "pinshim-report.1"), encoding="utf-8") as handle:
            self.assertEqual(handle.read(), ".so man1/pinshim.1\n")


if __name__ == "__main__":
    if not MAN_DIR or not CLI:
        print("PINSHIM_MAN_DIR and PINSHIM_CLI are not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
