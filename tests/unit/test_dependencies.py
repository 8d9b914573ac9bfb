"""fastfs runs without mfusepy: it speaks the kernel's FUSE protocol itself (daemon/kernel).

mfusepy (a libfuse binding) serves only the storage emulator that tests and benchmarks mount
(benchmarks/latency_ops.py behind tests/faultfs.py and benchmarks/latency_fs.py), so it is in the
``test`` extra of pyproject.toml, not among the dependencies. These tests import every module of
the package in a fresh interpreter where ``import mfusepy`` fails, and check that nothing in the
package imports it.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Folders beside the package's own (tests, benchmarks, scripts): allowed to use mfusepy.
NOT_PACKAGE = {"tests", "benchmarks", "scripts", "contrib", "build"}
# Seconds the interpreter importing every module may take.
IMPORT_TIMEOUT = 120

# Run in a fresh interpreter: a meta-path finder that refuses mfusepy (and its libfuse loader,
# fuse), then every module of the package imported; prints the module names as JSON.
_IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mfusepy", "fuse"):
                raise ImportError(f"{name} is made unimportable by the test")
            return None

    sys.meta_path.insert(0, Refuse())
    for name in [m for m in sys.modules if m.split(".")[0] in ("mfusepy", "fuse")]:
        del sys.modules[name]
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker failed: mfusepy imported")
    import fastfs

    names = ["fastfs"]
    for info in pkgutil.walk_packages(fastfs.__path__, "fastfs."):
        importlib.import_module(info.name)
        names.append(info.name)
    assert not [m for m in sys.modules if m.split(".")[0] in ("mfusepy", "fuse")]
    print(json.dumps(names))
    """
)


def _package_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in NOT_PACKAGE]


def _extension_files() -> list[Path]:
    """Compiled modules of the package built in the checkout for this interpreter (an editable install)."""
    return [
        p
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        for p in ROOT.rglob(f"*{suffix}")
        if p.relative_to(ROOT).parts[0] not in NOT_PACKAGE
    ]


def test_every_module_imports_without_mfusepy() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT,
        cwd="/",  # (not the checkout: only the package as the tests import it)
    )
    assert result.returncode == 0, result.stderr
    names = set(json.loads(result.stdout.splitlines()[-1]))
    # every module file of the package was imported (the walk found them all)
    expected = {"fastfs"}
    for path in _package_files():
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        expected.add(".".join(["fastfs", *parts]))
    for path in _extension_files():  # the native request loop, where the install built it
        parts = list(path.relative_to(ROOT).parts)
        parts[-1] = parts[-1].split(".")[0]
        expected.add(".".join(["fastfs", *parts]))
    assert names == expected
    assert {"fastfs.daemon.kernel.session", "fastfs.daemon.ops", "fastfs.fsio.engine"} <= names


def test_the_blocker_refuses_mfusepy() -> None:
    """The check above cannot pass by accident: under the blocker, importing mfusepy itself fails."""
    probe = _IMPORT_ALL.split("import fastfs\n")[0].replace("raise SystemExit", "print")
    result = subprocess.run(
        [sys.executable, "-c", probe + "\nimport mfusepy\n"], capture_output=True, text=True, timeout=IMPORT_TIMEOUT
    )
    assert result.returncode != 0 and "made unimportable by the test" in result.stderr


def test_no_package_module_imports_mfusepy() -> None:
    for path in _package_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & {"mfusepy", "fuse"}, f"{path.relative_to(ROOT)}:{node.lineno} imports libfuse"


def test_mfusepy_is_a_test_dependency_not_a_runtime_one() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("mfusepy")]
    assert [d for d in project["optional-dependencies"]["test"] if d.lower().startswith("mfusepy")]
