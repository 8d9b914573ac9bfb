"""Generate the configuration reference ``docs/configuration.md`` from the schema itself.

Run ``python -m fastfs.config.docgen > docs/configuration.md`` after changing a setting. Everything
in the page comes from the code, so it cannot say what the code does not do:

- sections and settings, in schema order, with their types and defaults: the dataclasses of
  :mod:`fastfs.config.schema` (defaults rendered as ``--print-config`` writes them,
  :func:`fastfs.config.render.format_value`);
- each setting's text: the docstring under its field (read from the module's source with :mod:`ast`,
  since field docstrings are not kept at run time), and each section's class docstring;
- the short ``-o`` names: :data:`fastfs.config.loader.ALIASES`, and the standard mount options that
  change nothing (``NO_OP_OPTIONS``) or are refused (``REFUSED_OPTIONS``);
- which settings a reload applies: :data:`fastfs.config.reload.LIVE`;
- the profiles, each setting with its value and reason: :data:`fastfs.config.profiles.PROFILES` (a
  value computed at load, such as the checkpoint budget, is shown by its function's docstring, so the
  page does not depend on the machine that generates it).

``tests/unit/test_docgen.py`` fails when ``docs/configuration.md`` differs from what this prints, so a
new field (or a changed default, docstring, alias or profile) must come with a regenerated page.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

from fastfs.config import loader, reload, render, schema
from fastfs.config.profiles import PROFILES, Setting
from fastfs.config.values import ConfigError

# Where the page is written in the repository (relative to its root), for the header and the test.
DOC_PATH = "docs/configuration.md"
COMMAND = "python -m fastfs.config.docgen > docs/configuration.md"

# What a schema type name means to someone writing a value (the loader's parsing of that type).
TYPE_NAMES = {
    "int": "integer or size",
    "float": "number",
    "bool": "boolean",
    "str": "string",
    "Mode": "octal mode",
    "Uid": "user id or name",
    "Gid": "group id or name",
}


def field_docstrings(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass: the string literal right under each annotated field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def one_paragraph(text: str) -> str:
    """A docstring as one markdown paragraph (line breaks of the source joined)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def aliases_of(key: str) -> list[str]:
    return [name for name, dotted in loader.ALIASES.items() if dotted == key]


def profile_values(key: str) -> list[tuple[str, Setting]]:
    return [(name, s) for name, p in PROFILES.items() for s in p.settings if s.key == key]


def show_value(setting: Setting, type_name: str) -> str:
    """A profile value as a config file would write it; a computed one by its function's docstring."""
    if callable(setting.value):
        doc = one_paragraph(inspect.getdoc(setting.value) or setting.value.__name__).rstrip(".")
        return doc[:1].lower() + doc[1:]
    return f"`{render.format_value(setting.value, type_name)}`"


# Values tried on a setting to make its section's validate() say what it accepts (one far below, one
# far above any valid value; for strings one that no rule accepts: relative, with a space and a comma).
PROBES: dict[str, tuple[Any, ...]] = {
    "int": (-(10**15), 10**15),
    "float": (-1e15, 1e15),
    "Mode": (-2, 0o7777),
    "Uid": (-2, 2**40),
    "Gid": (-2, 2**40),
    "str": ("not valid, x",),
}
# The tail of a validation message that repeats the value tried (", got 'x'" / " (got 1 B)").
_GOT_RE = re.compile(r",? \(?got .*$")


def validation_rules(key: str, type_name: str) -> list[str]:
    """What the schema's validate() says of bad values of *key* (its own messages, value left out)."""
    section, _, name = key.rpartition(".")
    if not section:
        return []
    base = getattr(schema.Config(), section)
    rules: list[str] = []
    for probe in PROBES.get(type_name, ()):
        try:
            dataclasses.replace(base, **{name: probe}).validate()
        except (ConfigError, ValueError, TypeError) as e:  # ConfigValueError is a ValueError
            if getattr(e, "key", None) not in (None, key) or not str(e).startswith(key):
                continue
            rule = _GOT_RE.sub("", str(e).removeprefix(f"{key}:").strip())
            if rule and rule not in rules:
                rules.append(rule)
    return rules


def settings() -> Iterator[tuple[str, str, Any, str, str]]:
    """``(section or "", dotted key, default, type name, docstring)`` of every setting, schema order."""
    defaults = schema.Config()
    top_docs = field_docstrings(schema.Config)
    for f in dataclasses.fields(schema.Config):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            docs = field_docstrings(type(value))
            for g in dataclasses.fields(value):
                yield f.name, f"{f.name}.{g.name}", getattr(value, g.name), str(g.type), docs.get(g.name, "")
        else:
            yield "", f.name, value, str(f.type), top_docs.get(f.name, "")


def setting_block(key: str, default: Any, type_name: str, doc: str) -> list[str]:
    facts = [f"default `{render.format_value(default, type_name)}`", TYPE_NAMES.get(type_name, type_name)]
    names = aliases_of(key)
    facts.append(", ".join(f"`-o {n}=`" for n in names or [key]))
    facts.append("a reload applies it" if key in reload.LIVE else "needs a remount")
    lines = [f"### `{key}`", "", "; ".join(facts) + ".", "", one_paragraph(doc) or "(no description)"]
    rules = validation_rules(key, type_name)
    if rules:
        lines += ["", "Accepted: " + "; ".join(rules) + "."]
    presets = [f"`{name}` {show_value(s, type_name)} ({s.why})" for name, s in profile_values(key)]
    if presets:
        lines += ["", "Profiles: " + "; ".join(presets) + "."]
    return [*lines, ""]


def profiles_section() -> list[str]:
    types = {key: type_name for _, key, _, type_name, _ in settings()}
    lines = [
        "## Profiles",
        "",
        "`--profile NAME`, `profile: NAME` in the file or `-o profile=NAME`: a preset applied under the file and",
        "the command line (defaults < profile < config file < `-o`). Source: `config/profiles.py`.",
        "",
    ]
    for name, p in PROFILES.items():
        lines += [f"### `{name}`: {p.summary}", "", "| setting | value | why |", "|---|---|---|"]
        lines += [f"| `{s.key}` | {show_value(s, types[s.key])} | {s.why} |" for s in p.settings]
        lines.append("")
    return lines


def mount_options_section() -> list[str]:
    lines = [
        "## Standard mount options",
        "",
        "Besides the settings above (whose short names are listed with each), `-o`, `$FASTFS_OPTIONS` and",
        "the `mount.fuse.fastfs` helper accept these standard options:",
        "",
    ]
    lines += [f"- `{name}`: accepted, changes nothing ({why})." for name, why in loader.NO_OP_OPTIONS.items()]
    lines += [f"- `{name}`: refused: {why}." for name, why in loader.REFUSED_OPTIONS.items()]
    lines += [
        "- `NAME` alone sets a boolean setting to true, `noNAME` to false (`noatime` is the setting",
        "  `fuse.noatime`; `no_open` is the setting `fuse.no_open`).",
        "",
    ]
    return lines


def generate() -> str:
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{COMMAND}` from config/schema.py, config/loader.py, config/reload.py",
        "and config/profiles.py. Do not edit: change the code and regenerate (tests/unit/test_docgen.py",
        "fails when this file is out of date). -->",
        "",
        "Where settings come from, lowest first: the schema defaults below < a profile < the YAML file",
        f"(`--config FILE`, or `{loader.DEFAULT_PATH}` when it exists) < `${loader.ENV_OPTIONS}` < `-o",
        "key=value[,key=value]` on the command line. In the file, settings are nested by section",
        "(`cache:` then `  budget: 2G`); on the command line they are dotted (`-o cache.budget=2G`) or use",
        "the short names listed with each setting (`-o budget=2G`). Sizes are bytes and may be written",
        "`64M`, `4G`, `512KiB`; booleans `true`/`false` (also `yes`/`no`, `on`/`off`, `1`/`0`); modes in",
        "octal (`0644`, `644`). Unknown keys and bad values are refused with one line before anything",
        f"mounts; so is a `cache.budget` above the machine's memory (above {loader.BUDGET_WARN_SHARE:.0%} of it, a",
        "warning). `fastfs mount SRC MNT --print-config` prints the effective configuration, each value that",
        "is not a default marked with where it came from; its output loads back as a config file, and",
        "`fastfs mount --config FILE --print-config` validates FILE. `config/fastfs.example.yaml` is an",
        "annotated example file. A reload (`systemctl reload fastfs@NAME`, SIGHUP) applies the settings marked so",
        "below; the others wait for the next mount.",
        "",
    ]
    section_docs = {
        f.name: inspect.getdoc(type(getattr(schema.Config(), f.name)))
        for f in dataclasses.fields(schema.Config)
        if dataclasses.is_dataclass(getattr(schema.Config(), f.name))
    }
    current: str | None = None
    for section, key, default, type_name, doc in settings():
        if section != current:
            current = section
            title = f"`{section}`: {section_docs.get(section, '')}" if section else "Top level"
            lines += [f"## {title}".rstrip(": "), ""]
        lines += setting_block(key, default, type_name, doc)
    lines += profiles_section()
    lines += mount_options_section()
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.write(generate())
    return 0


if __name__ == "__main__":
    sys.exit(main())
