"""docs/configuration.md is generated from the schema (fastfs.config.docgen) and kept in step with it."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fastfs.config import docgen, loader, reload
from fastfs.config.profiles import PROFILES
from fastfs.config.schema import Config, FuseConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / docgen.DOC_PATH


def test_configuration_md_is_what_the_generator_prints():
    """Fails when a setting, default, docstring, alias, profile or rule changed without regenerating."""
    assert DOC.read_text() == docgen.generate(), f"{docgen.DOC_PATH} is out of date: run `{docgen.COMMAND}`"


def test_the_module_runs_as_the_command_the_page_names():
    out = subprocess.run([sys.executable, "-m", "fastfs.config.docgen"], capture_output=True, text=True, check=True)
    assert out.stdout == docgen.generate()


def test_every_setting_has_its_heading_default_aliases_and_reload_rule():
    text = docgen.generate()
    blocks = dict(re.findall(r"^### `([a-z_.]+)`\n\n(.*)$", text, re.MULTILINE))
    for key in loader.schema_keys():
        assert key in blocks, f"{key} missing from the page"
        facts = blocks[key]
        for alias in docgen.aliases_of(key):
            assert f"`-o {alias}=`" in facts, (key, alias)
        assert ("a reload applies it" in facts) == (key in reload.LIVE), key
    for name, profile in PROFILES.items():
        assert f"### `{name}`: {profile.summary}" in text
        for s in profile.settings:
            assert f"| `{s.key}` |" in text and s.why in text


def test_defaults_and_docstrings_come_from_the_schema():
    text = docgen.generate()
    assert "### `cache.block_size`\n\ndefault `4M`; integer or size; `-o block_size=`; needs a remount." in text
    assert "Accepted: must be a power of two between 64K and 64M." in text
    assert "0 picks min(25% of available memory, 4 GiB)" in text  # cache.budget's docstring
    # the checkpoint budget depends on the machine: shown by its rule, never by a number of bytes
    assert "half of the available memory, at most 16 GiB" in text


@dataclass(frozen=True)
class _Sample:
    """A section."""

    plain: int = 1
    """First line
    and a second line."""
    undocumented: str = ""
    other: bool = False
    """Third."""


def test_field_docstrings_reads_the_literal_under_each_field():
    assert docgen.field_docstrings(_Sample) == {"plain": "First line\nand a second line.", "other": "Third."}
    assert docgen.one_paragraph("First line\nand a second line.") == "First line and a second line."


@dataclass(frozen=True)
class _NewFuse(FuseConfig):
    """Kernel-facing options of the mount."""

    brand_new: float = 2.5
    """Seconds of something new."""


@dataclass(frozen=True)
class _NewConfig(Config):
    fuse: _NewFuse = field(default_factory=_NewFuse)


def test_a_new_field_appears_in_the_page(monkeypatch):
    """What the other helpers' new fields (fuse.revalidate ...) rely on: the page follows whatever the schema holds."""
    assert "brand_new" not in docgen.generate()
    monkeypatch.setattr(docgen.schema, "Config", _NewConfig)
    text = docgen.generate()
    assert "### `fuse.brand_new`\n\ndefault `2.5`; number; `-o fuse.brand_new=`; needs a remount." in text
    assert "Seconds of something new." in text
    assert text.index("### `fuse.nonempty`") < text.index("### `fuse.brand_new`") < text.index("## `cache`")
