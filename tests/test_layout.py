"""The toolkit's own layout: subpackages by job, each module saying its job in
one line and staying small, and the import-layer contract (import-linter,
run by the toolkit's pre-commit hooks) covering every part of it and
failing on an import that goes up a layer."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "serieskit"
MAX_LINES = 550  # "none much above 500"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_each_module_opens_with_one_line_saying_its_job(path):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    assert doc, f"{path.relative_to(REPO)} has no docstring"
    first, _, rest = doc.partition("\n")
    assert first.rstrip().endswith((".", "?")), f"its first line is not a sentence: {first!r}"
    assert not rest or rest.startswith("\n"), "the summary line is followed by a blank line"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_much_above_500_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_layers_contract_names_every_part_of_the_package():
    """A new subpackage or top-level module is placed in a layer, not left out
    of the contract (where import-linter would let it import anything)."""
    named = {
        name.strip() for layer in _contracts()["layers"]["layers"] for name in layer.split("|")
    }
    parts = {
        "serieskit." + (p.name if p.is_dir() else p.stem)
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file())
        or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert parts == named


@pytest.mark.parametrize("container", ["series", "pr", "upstream", "checks", "build"])
def test_each_subpackage_contract_names_its_modules(container):
    contract = _contracts()[container]
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    modules = {p.stem for p in (PACKAGE / container).glob("*.py") if p.name != "__init__.py"}
    assert modules == named


def test_pre_commit_runs_the_contract_with_the_pin_ci_installs():
    """`nox -s lint_toolkit` and `nox -s ci` run the toolkit's pre-commit
    hooks; the import-linter hook is one of them, pinned as the ci session
    pins the package for the test below."""
    config = (REPO / ".pre-commit-config.yaml").read_text()
    hook = re.search(
        r"- id: import-linter\n(?:\s+\w+:.*\n)*?\s+entry: (lint-imports[^\n]*)\n"
        r"(?:\s+\w+:.*\n)*?\s+additional_dependencies: \[\"(import-linter==[^\"]+)\"\]",
        config,
    )
    assert hook, "no import-linter hook in .pre-commit-config.yaml"
    noxfile = (REPO / "noxfile.py").read_text()
    assert f'IMPORT_LINTER = "{hook.group(2)}"' in noxfile


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter", reason="import-linter is installed by `nox -s ci`")
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            "--no-logo",
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )


def test_the_contract_holds():
    proc = _lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("serieskit/errors.py", "from serieskit import cli"),  # the bottom imports the top
        ("serieskit/series/base.py", "from serieskit.series import apply"),  # within series
        ("serieskit/build/build.py", "from serieskit.checks import lint"),  # between siblings
    ],
)
def test_the_contract_fails_on_an_import_up_a_layer(tmp_path, module, upward):
    shutil.copytree(PACKAGE, tmp_path / "serieskit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    text = path.read_text()
    path.write_text(text.replace("from __future__ import annotations\n", f"{upward}\n", 1))
    assert upward in path.read_text()
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0
    importer = module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in proc.stdout and f"- {importer} -> " in proc.stdout


def _scripts() -> list[Path]:
    return sorted(
        p for d in ("bench", "gpu", "e2e") for p in (REPO / d).glob("*.py") if p.is_file()
    )


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_import_what_the_toolkit_has(path):
    """The GPU machine's and the benches' scripts import the toolkit's names
    only inside functions at times: a module that moved shows only on the
    machine that runs them. Every ``from serieskit... import`` must resolve."""
    import importlib

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("serieskit"):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"{path.name}: from {node.module} import {alias.name}"
