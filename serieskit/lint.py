"""ruff and mypy on the files the series changes, with vLLM's own settings.

Versions are those vLLM 0.26.0's .pre-commit-config.yaml pins (ruff 0.14.0,
mypy 1.20.2); the nox session installs them once into its own environment,
after which lint runs offline. mypy runs with ``--follow-imports=skip`` on the
changed files only (vLLM's pyproject otherwise applies), so it needs neither
torch nor the rest of vLLM installed; an error fails only when the base's
version of the same file does not have it (upstream's own errors are not the
series').
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError

RUFF = "ruff==0.14.0"
MYPY = ("mypy==1.20.2", "pydantic", "types-cachetools", "types-setuptools",
        "types-PyYAML", "types-requests", "regex")
MYPY_PYTHON = "3.10"  # vLLM's lowest supported Python, its first mypy hook


def changed_python_files(tree: Path, base: str) -> list[str]:
    out = git.git(tree, "diff", "--name-only", "--diff-filter=ACMR", base, "HEAD", "--", "*.py")
    return [f for f in out.split() if (tree / f).is_file()]


def run_tool(tree: Path, args: list[str], log=print) -> bool:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=tree, capture_output=True, text=True)
    ok = proc.returncode == 0
    text = (proc.stdout + proc.stderr).strip()
    if text and not ok:
        log(text)
    return ok


def lint(tree: Path, base: str, log=print) -> list[str]:
    """Run ruff check, ruff format --check and mypy; return the failed ones."""
    files = changed_python_files(tree, base)
    if not files:
        log("lint: the series changes no Python files")
        return []
    log(f"lint: {len(files)} Python file(s) changed by the series")
    failed = []
    checks = {
        "ruff check": ["ruff", "check", "--no-cache", *files],
        "ruff format": ["ruff", "format", "--check", "--no-cache", *files],
    }
    for name, args in checks.items():
        ok = run_tool(tree, args, log)
        log(f"  {name}: {'passed' if ok else 'FAILED'}")
        if not ok:
            failed.append(name)
    package = [f for f in files if f.startswith("vllm/")]
    if package:  # vLLM type-checks its package; tools/ and tests/ are not in its mypy run
        new = mypy_errors(tree, package) - _base_mypy_errors(tree, base, package)
        for error in sorted(new):
            log(f"    {error[0]}: {error[1]}")
        log(f"  mypy: {'FAILED' if new else 'passed'} ({len(new)} new error(s))")
        if new:
            failed.append("mypy")
    return failed


MYPY_ARGS = ["--python-version", MYPY_PYTHON, "--follow-imports", "skip", "--no-incremental",
             "--show-error-codes", "--no-error-summary", "--no-pretty"]
_ERROR = re.compile(r"^(?P<path>[^:]+):\d+: error: (?P<msg>.*)$")


def mypy_errors(root: Path, files: list[str]) -> set[tuple[str, str]]:
    """(path, message) of each mypy error, without line numbers: lines move
    between the base and the series, the errors do not."""
    proc = subprocess.run([sys.executable, "-m", "mypy", *MYPY_ARGS, *files], cwd=root,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise ToolkitError(f"mypy failed to run: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return {(m["path"], m["msg"]) for line in proc.stdout.splitlines()
            if (m := _ERROR.match(line))}


def _exists(tree: Path, base: str, path: str) -> bool:
    return git.run(tree, "cat-file", "-e", f"{base}:{path}").returncode == 0


def package_inits(files: list[str]) -> list[str]:
    """The ``__init__.py`` of every package that holds one of ``files``."""
    inits = {str(Path(*Path(f).parts[:i], "__init__.py"))
             for f in files for i in range(1, len(Path(f).parts))}
    return sorted(inits - set(files))


def _base_mypy_errors(tree: Path, base: str, files: list[str]) -> set[tuple[str, str]]:
    """The same files' errors on the base: upstream's own are not the series'.

    The files are checked inside their packages, as in the tree: without the
    packages' ``__init__.py`` mypy resolves them as namespace packages and
    reports fewer of upstream's errors, which the tree's run then counted as
    new."""
    existing = [f for f in files if _exists(tree, base, f)]
    if not existing:
        return set()
    from serieskit.series import materialize

    inits = [f for f in package_inits(existing) if _exists(tree, base, f)]
    with tempfile.TemporaryDirectory() as tmp:
        materialize(tree, base, Path(tmp), "pyproject.toml", *existing, *inits)
        return mypy_errors(Path(tmp), existing)


def require_tools() -> None:
    for mod in ("ruff", "mypy"):
        if subprocess.run([sys.executable, "-m", mod, "--version"],
                          capture_output=True).returncode != 0:
            raise ToolkitError(f"lint needs {mod}: run it through `nox -s lint`")


def session(root: Path, log=print) -> None:
    """``nox -s lint``: ruff, mypy and check-layering of the work tree's series."""
    from serieskit import base, layering, series
    from serieskit.state import State

    tree = series.applied_tree(root)
    state = State.load(root)
    assert state.base
    require_tools()
    script = tree / "tools/pre_commit/check_layering.py"
    failed = lint(tree, state.base, log=log)
    if script.is_file():
        pin = base.read_pin(root)
        # On a rebased work tree (a fork's ref, say) the pinned upstream base
        # is the reference: increases that the work tree's base has too are
        # reported as "base reports the same" and do not fail.
        ref = pin.commit if pin.commit and pin.commit != state.base else None
        if not layering.check_series(tree, state.base, script,
                                     series.layering_acknowledged(root), ref):
            failed.append("check-layering")
    if failed:
        raise ToolkitError(f"lint failed: {', '.join(failed)}")
