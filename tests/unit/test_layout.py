"""The test command works wherever the repository is cloned (issue 17).

The repository root doubles as the package ``fastfs`` (``package-dir`` in pyproject.toml), so a
tool that derives module names from folders sees the clone's folder name. These tests copy the
repository's files (as they are in the working tree) into a folder named ``fastfs-main`` and run
the lint of ``make test`` there, and collect a test module there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Seconds the lint of the whole tree may take.
LINT_TIMEOUT = 300


def _copy_repository(dest: Path) -> None:
    """The tracked files (working-tree contents) of the repository, or the whole tree without git."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", ".*_cache", "*.egg-info"))
        return
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def hyphenated_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clone = tmp_path_factory.mktemp("clone") / "fastfs-main"
    _copy_repository(clone)
    assert (clone / "pyproject.toml").is_file() and (clone / "__init__.py").is_file()
    return clone


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_lint_passes_in_a_clone_whose_folder_is_not_an_identifier(hyphenated_clone: Path, command: list[str]) -> None:
    pytest.importorskip("ruff")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache"],
        cwd=hyphenated_clone,
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "N999" not in result.stdout


def test_invalid_module_names_are_still_reported(hyphenated_clone: Path, tmp_path: Path) -> None:
    """The lint exemption covers package files only: a badly named module still fails."""
    pytest.importorskip("ruff")
    bad = hyphenated_clone / "fsio" / "Bad-Name.py"
    bad.write_text('"""A module nobody can import."""\n')
    try:
        result = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "fsio"],
            cwd=hyphenated_clone,
            capture_output=True,
            text=True,
            timeout=LINT_TIMEOUT,
        )
    finally:
        bad.unlink()
    assert result.returncode != 0
    assert "N999" in result.stdout and "Bad-Name" in result.stdout


def test_tests_collect_in_a_hyphenated_clone(hyphenated_clone: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/unit/test_config.py"],
        cwd=hyphenated_clone,
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_config.py::test_defaults_are_valid_and_frozen" in result.stdout


# -- imports: no circles, the daemon apart from the client commands (issue 25) ------------------------
# Packages whose import graph must have no circle (fsio/ is the engine helpers' own).
ACYCLIC_PACKAGES = ("fastfs.config", "fastfs.daemon")
CLI_PACKAGE = "fastfs.daemon.cli"


def _module_files() -> dict[str, Path]:
    """Every module of the package ``fastfs`` (outside tests and benchmarks) -> its file."""
    out: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "scripts", "build") or rel.parts[0].startswith("."):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(["fastfs", *parts])] = path
    return out


def _imports(path: Path, known: set[str], name: str) -> set[str]:
    """The fastfs modules *path* imports, at any depth of the code (function-level imports too),
    except under ``if TYPE_CHECKING:``."""
    import ast

    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in known else node.module)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    files = _module_files()
    known = set(files)
    return {name: _imports(path, known, name) for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_config_and_daemon_have_no_import_circles() -> None:
    """Not even one hidden by a function-level import (config loader/profiles/schema and daemon
    mount/statscli were two)."""
    graph = _graph()
    inside = {m: {w for w in deps if w.startswith(ACYCLIC_PACKAGES)} for m, deps in graph.items()}
    inside = {m: deps for m, deps in inside.items() if m.startswith(ACYCLIC_PACKAGES)}
    assert _cycles(inside) == []


def test_the_daemon_never_imports_the_client_commands() -> None:
    graph = _graph()
    offenders = {
        m: sorted(d for d in deps if d == CLI_PACKAGE or d.startswith(CLI_PACKAGE + "."))
        for m, deps in graph.items()
        if not (m == CLI_PACKAGE or m.startswith(CLI_PACKAGE + ".")) and m != "fastfs.__main__"
    }
    assert {m: d for m, d in offenders.items() if d} == {}
    assert any(d.startswith(CLI_PACKAGE) for d in graph["fastfs.__main__"])  # python -m fastfs runs the CLI


def test_console_scripts_and_packages_of_pyproject_exist() -> None:
    """`fastfs` and `mount.fuse.fastfs` name functions that exist; every package is listed and mapped."""
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = project["project"]["scripts"]
    assert set(scripts) == {"fastfs", "mount.fuse.fastfs"}
    for target in scripts.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    setuptools = project["tool"]["setuptools"]
    packages = {".".join(["fastfs", *p.parent.relative_to(ROOT).parts]) for p in ROOT.rglob("__init__.py")}
    packages = {p for p in packages if not p.startswith(("fastfs.tests", "fastfs.benchmarks", "fastfs.build"))}
    assert packages <= set(setuptools["packages"])
    for package in setuptools["packages"]:
        assert (ROOT / setuptools["package-dir"][package]).is_dir(), package


# -- docs drift (issue 24 item 10) --------------------------------------------------------------------
def test_paths_of_tests_named_in_the_code_exist() -> None:
    """fsio/api.py named tests/test_api.py long after it moved to tests/unit/test_api.py."""
    import re

    missing = []
    for path in _module_files().values():
        for ref in re.findall(r"\btests/[\w/]+\.py\b", path.read_text(encoding="utf-8")):
            if not (ROOT / ref).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert missing == []


def test_no_module_speaks_of_the_libfuse_binding_that_is_gone() -> None:
    """The daemon speaks the kernel's protocol itself (daemon/kernel/); docstrings of the controller,
    caller, CLI and stats still spoke of libfuse, its threads and "the binding", and logsetup configured
    the binding's logger. libfuse may be named where it describes what daemon/kernel/ replaces, or
    other file systems (sources made with it)."""
    allowed = {"fastfs.fsio.disktier", "fastfs.fsio.disk.tier"}  # FUSE sources made with libfuse (its old and new home)
    offenders = []
    for name, path in _module_files().items():
        text = path.read_text(encoding="utf-8")
        libfuse = "libfuse" in text and not name.startswith("fastfs.daemon.kernel") and name not in allowed
        if libfuse or "binding" in text or 'getLogger("fuse")' in text:
            offenders.append(name)
    assert offenders == []


def test_the_cli_docstring_names_every_command() -> None:
    """daemon/cli.py's docstring listed five of eight commands."""
    from fastfs.daemon.cli import main
    from fastfs.daemon.cli.completion import model
    from fastfs.daemon.cli.parser import build_parser

    commands, _ = model(build_parser())
    assert [c.name for c in commands if c.name not in (main.__doc__ or "")] == []
