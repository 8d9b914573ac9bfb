"""README.md and docs/: issue 26's shape targets, and names that the code has.

The README stays short (<= 2,500 words) with the install in its first 60 lines, gives ``make demo``
and ``make test`` (what CI runs), shows the generated figure and links every page of docs/. Every
relative link of README.md and docs/*.md leads to a file of the repository; every setting named
(``cache.budget``), every ``-o`` option and every option of a ``fastfs`` command line in a code
block exists. (Metric names are checked against a real scrape in tests/engine/test_dashboard.py.)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fastfs.config import loader
from fastfs.daemon.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
# Issue 26's targets for the README.
MAX_WORDS = 2500
INSTALL_WITHIN = 60
# Dotted words that are not settings: /etc/fuse.conf and the mount type fuse.fastfs.
NOT_SETTINGS = {"fuse.conf", "fuse.fastfs"}
# Misspelt on purpose: the examples of fastfs's "did you mean" messages.
MISSPELT = {"cache.bugdet", "budgt"}

LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
SETTING_RE = re.compile(r"`[^`]*?\b((?:fuse|cache|readahead|log|stats|state)\.[a-z_]+)")
CODE_SPAN_RE = re.compile(r"`([^`]+)`")
FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
OPTION_RE = re.compile(r"(?:^|[ ])-o[ ]+([^\s`]+)", re.MULTILINE)
# Scripts whose -o is not fastfs's (an output file).
OTHER_O = ("figure.py", "manpage")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def test_readme_is_short_and_installs_early():
    text = _text(README)
    assert len(text.split()) <= MAX_WORDS, f"README.md has {len(text.split())} words (target <= {MAX_WORDS})"
    head = "\n".join(text.splitlines()[:INSTALL_WITHIN])
    assert "## Install" in head and "pip install ." in head and "apt-get install fuse3" in head
    assert "make demo" in text and "make test" in text  # the example and test commands (.ci/run runs make test)
    assert "](docs/speedup.svg)" in text
    for page in DOCS:
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    """The README's two commands on a fresh machine: the test one is what .ci/run executes, and no other
    code block of the README looks like a test command (a pip line naming pytest was taken for one)."""
    text = README.read_text()
    section = text[text.index("### Two commands on a fresh machine") :]
    block = FENCE_RE.search(section)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci[-1] == "make test" and not any("pytest" in line for line in ci)
    blocks = FENCE_RE.findall(text)
    assert not [b for b in blocks if "pytest" in b], "a README code block names pytest"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page: Path):
    for target in LINK_RE.findall(_text(page)):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        assert path.exists(), f"{page.name}: link to {target}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_settings_exist(page: Path):
    keys = loader.schema_keys()
    named = set(SETTING_RE.findall(_text(page)))
    unknown = sorted(k for k in named - NOT_SETTINGS - MISSPELT if k not in keys)
    assert not unknown, f"{page.name} names settings the schema does not have: {unknown}"


def _option_words(text: str) -> set[str]:
    """Option names given to ``-o`` in code (``-o budget=8G,allow_other`` -> budget, allow_other)."""
    prose = FENCE_RE.sub("", text)
    spans = [span.replace("\n", " ") for span in CODE_SPAN_RE.findall(prose)]  # a span may wrap
    code = "\n".join(spans + FENCE_RE.findall(text))
    lines = [line for line in code.splitlines() if not any(o in line for o in OTHER_O)]
    words = set()
    for group in OPTION_RE.findall("\n".join(lines)):
        for part in group.split(","):
            name = part.split("=", 1)[0]
            if name and name.islower() and name not in ("key", "k", "...") and not name.startswith("["):
                words.add(name)
    return words


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_o_options_exist(page: Path):
    keys = loader.schema_keys()
    known = {*keys, *loader.ALIASES, *loader.NO_OP_OPTIONS, *loader.REFUSED_OPTIONS}
    words = _option_words(_text(page)) - MISSPELT
    unknown = sorted(w for w in words if w not in known and not (w.startswith("no") and w[2:] in known))
    assert not unknown, f"{page.name}: -o options fastfs does not take: {unknown}"


def _command_options() -> dict[str, set[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()}


def test_fastfs_command_lines_use_existing_options():
    commands = _command_options()
    seen = 0
    for page in PAGES:
        for block in FENCE_RE.findall(_text(page)):
            for line in block.splitlines():
                words = line.split("#", 1)[0].split()
                while words and (words[0] in ("sudo",) or "=" in words[0]):
                    words = words[1:]  # sudo, FASTFS_OPTIONS=... before the command
                if len(words) < 2 or words[0] != "fastfs" or words[1] not in commands:
                    continue
                seen += 1
                for word in words[2:]:
                    flag = word.split("=", 1)[0]
                    if flag.startswith("-") and flag not in ("-", "--"):
                        assert flag in commands[words[1]], f"{page.name}: `{line.strip()}`: {flag} unknown"
    assert seen >= 10, "the docs lost their fastfs examples"
