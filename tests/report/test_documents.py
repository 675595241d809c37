#!/usr/bin/env python3
"""The documents (issue 21): README.md stays a page for users, at most 300
lines; no file of the tree names a package registry's host, and no document
cites a path outside the tree (issue 28); every relative link of the
Markdown documents (README.md, tests/README.md, tests/deepspeed/README.md,
bench/README.md) leads to a file of the tree (anchors are not checked); the
generated option table is there once, between its markers.

Environment (set by meson): PINSHIM_SOURCE_ROOT.
"""

import codecs
import os
import re
import subprocess
import sys
import unittest

ROOT = os.environ.get("PINSHIM_SOURCE_ROOT", "")
README_MAX_LINES = 300
DOCUMENTS = ("README.md", "tests/README.md", "tests/deepspeed/README.md", "bench/README.md")
# Package registries' hosts: the documents say "the package index" or "PyPI",
# and no file of the tree names one (issue 28). Kept encoded (rot13), so that
# this file does not name them either: codecs.decode(host, "rot13") reads one.
REGISTRY_HOSTS = tuple(codecs.decode(host, "rot13") for host in (
    "clcv.bet", "clgubaubfgrq.bet", "clcv.clguba.bet", "ertvfgel.aczwf.bet", "aczwf.pbz",
    "pengrf.vb", "cebkl.tbynat.bet", "cxt.tb.qri", "eholtrzf.bet", "ercb.znira.ncnpur.bet",
    "ercb1.znira.bet", "nanpbaqn.bet", "pbaqn-sbetr.bet", "qbjaybnq.clgbepu.bet",
    "qro.qrovna.bet", "nepuvir.hohagh.pbz", "frphevgl.qrovna.bet", "uho.qbpxre.pbz",
    "nepuvir.qrovna.bet", "cbegf.hohagh.pbz"))
# Where the tree's files are, when it is no git checkout (an sdist): what is
# skipped of it: what .gitignore names (build folders, among them the tools of
# scripts/build-dist, dist/, caches).
NOT_SOURCE = re.compile(r"^(build[^/]*|dist|\.git|\.whl|\.gl|.*__pycache__)(/|$)")
# A path that climbs out of the document's directory: "../x", "../../y".
UPWARD_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*)")

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


def tree_files():
    """The tree's files, relative to ROOT: git's list in a checkout (tracked, and
    untracked ones it does not ignore), else every file but NOT_SOURCE's."""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, timeout=60)
    except OSError:
        listed = None
    if listed is not None and listed.returncode == 0:
        return [path for path in listed.stdout.decode("utf-8", "replace").split("\0")
                if path and os.path.isfile(os.path.join(ROOT, path))]
    found = []
    for directory, directories, files in os.walk(ROOT):
        relative = os.path.relpath(directory, ROOT)
        directories[:] = [d for d in directories
                          if not NOT_SOURCE.match(os.path.normpath(os.path.join(relative, d)))]
        found += [os.path.normpath(os.path.join(relative, name)) for name in files]
    return found


def hosts_named(text):
    lowered = text.lower()
    return [host for host in REGISTRY_HOSTS if host in lowered]


def man_pages():
    return sorted(os.path.join("man", name) for name in os.listdir(os.path.join(ROOT, "man"))
                  if re.fullmatch(r"[\w-]+\.[1-8]", name))


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


class Tree(unittest.TestCase):
    def test_the_host_matcher(self):
        self.assertEqual(hosts_named("fetched from https://" + REGISTRY_HOSTS[0].upper()
                                     + "/simple/pinshim"), [REGISTRY_HOSTS[0]])
        self.assertEqual(hosts_named("from the package index"), [])
        self.assertNotIn(".", [host[0] for host in REGISTRY_HOSTS])

    def test_no_file_names_a_registry_host(self):
        files = tree_files()
        self.assertIn("README.md", files)
        self.assertIn("tests/report/test_documents.py", files)
        for path in files:
            with open(os.path.join(ROOT, path), "rb") as handle:
                text = handle.read(4 << 20).decode("utf-8", "replace")
            named = hosts_named(text)
            with self.subTest(path=path):
                self.assertEqual(named, [], f"{path} names {named}: say 'the package index' "
                                            "(or keep the host encoded, as this test does)")


class Sources(unittest.TestCase):
    def test_the_upward_path_matcher(self):
        self.assertEqual(UPWARD_PATH.findall("the source is in `../shared/reference/`)"),
                         ["../shared/reference/"])
        self.assertEqual(UPWARD_PATH.findall("see bench/x.md and ./a/../b"), [])

    def test_no_document_cites_a_path_outside_the_tree(self):
        for document in DOCUMENTS + tuple(man_pages()):
            base = os.path.dirname(os.path.join(ROOT, document))
            for number, line in enumerate(read(document).splitlines(), 1):
                for path in UPWARD_PATH.findall(line):
                    resolved = os.path.realpath(os.path.normpath(os.path.join(base, path)))
                    with self.subTest(document=document, line=number, path=path):
                        # A man page is read where it is installed: no path
                        # relative to it leads anywhere.
                        self.assertFalse(document.startswith("man/"),
                                         f"{document}:{number}: {path}")
                        self.assertTrue(resolved.startswith(os.path.realpath(ROOT) + os.sep),
                                        f"{document}:{number}: {path} leads out of the tree: "
                                        "name the source instead")

    def test_deepspeed_sources_are_named(self):
        text = " ".join(read("README.md").split())
        for source in ("DeepSpeed PR #8283", "`benchmarks/pin_memory/h2d_d2h_bench.py`"):
            with self.subTest(source=source):
                self.assertTrue(source in text, f"README.md does not name {source}")


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
