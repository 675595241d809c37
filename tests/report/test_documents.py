#!/usr/bin/env python3
"""The documents (issue 21): README.md stays a page for users, at most 300
lines, and names no package registry's host; every relative link of the
Markdown documents (README.md, tests/README.md, tests/deepspeed/README.md,
bench/README.md) leads to a file of the tree (anchors are not checked); the
generated option table is there once, between its markers.

Environment (set by meson): PINSHIM_SOURCE_ROOT.
"""

import os
import re
import sys
import unittest

ROOT = os.environ.get("PINSHIM_SOURCE_ROOT", "")
README_MAX_LINES = 300
DOCUMENTS = ("README.md", "tests/README.md", "tests/deepspeed/README.md", "bench/README.md")
# Package registries' hosts: the README says "the package index" or "PyPI".
REGISTRY_HOSTS = ("pypi.org", "pythonhosted.org", "pypi.python.org", "registry.npmjs.org",
                  "npmjs.com", "crates.io", "proxy.golang.org", "pkg.go.dev", "rubygems.org",
                  "repo.maven.apache.org", "repo1.maven.org", "anaconda.org", "conda-forge.org",
                  "download.pytorch.org", "deb.debian.org", "archive.ubuntu.com",
                  "security.debian.org", "hub.docker.com")

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as handle:
        return handle.read()


def link_targets(text):
    """(line number, target) of every link outside code blocks and code spans."""
    targets, in_fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = INLINE_CODE.sub("", line)
        targets += [(number, match.group(1)) for match in INLINE_LINK.finditer(line)]
        reference = REFERENCE_LINK.match(line)
        if reference:
            targets.append((number, reference.group(1)))
    return targets


def is_relative(target):
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith(("#", "//"))


class Readme(unittest.TestCase):
    def test_at_most_300_lines(self):
        lines = read("README.md").count("\n")
        self.assertLessEqual(lines, README_MAX_LINES,
                             f"README.md has {lines} lines; it is the users' page (at most "
                             f"{README_MAX_LINES}): move evidence to tests/README.md or "
                             "bench/README.md, design to man/pinshim.7")

    def test_names_no_registry_host(self):
        text = read("README.md").lower()
        for host in REGISTRY_HOSTS:
            with self.subTest(host=host):
                self.assertNotIn(host, text,
                                 f"README.md names {host}: say 'the package index' or 'PyPI'")

    def test_option_table_markers_once(self):
        text = read("README.md")
        for marker in ("<!-- options:begin -->", "<!-- options:end -->"):
            with self.subTest(marker=marker):
                self.assertEqual(text.count(marker), 1, f"README.md must hold {marker} once")
        self.assertLess(text.index("<!-- options:begin -->"), text.index("<!-- options:end -->"))


class Links(unittest.TestCase):
    def test_link_parser(self):
        text = ("see [a](x.md#part) and ![c](img.png \"t\")\n"
                "`[not](code.md)`\n```\n[not](fenced.md)\n```\n[ref]: ref.md\n")
        self.assertEqual([target for _, target in link_targets(text)],
                         ["x.md#part", "img.png", "ref.md"])
        self.assertFalse(is_relative("https://example.org/x"))
        self.assertFalse(is_relative("#anchor"))
        self.assertTrue(is_relative("man/pinshim.7"))

    def test_every_relative_link_resolves(self):
        for document in DOCUMENTS:
            base = os.path.dirname(os.path.join(ROOT, document))
            targets = [(n, t) for n, t in link_targets(read(document)) if is_relative(t)]
            with self.subTest(document=document):
                self.assertTrue(targets or document != "README.md", "README.md links nothing")
            for number, target in targets:
                path = target.split("#", 1)[0].split("?", 1)[0]
                if not path:
                    continue
                resolved = os.path.normpath(os.path.join(base, path))
                with self.subTest(document=document, line=number, target=target):
                    self.assertTrue(os.path.realpath(resolved).startswith(os.path.realpath(ROOT)),
                                    f"{document}:{number}: {target} leads out of the tree")
                    self.assertTrue(os.path.exists(resolved),
                                    f"{document}:{number}: {target} does not exist")


if __name__ == "__main__":
    if not ROOT:
        print("PINSHIM_SOURCE_ROOT is not set (run through meson test)")
        sys.exit(1)
    unittest.main(verbosity=2)
