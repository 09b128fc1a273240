"""Sessions of the vLLM Turing / no-P2P prefill series toolkit.

Each session only calls the toolkit (package ``serieskit``); the logic and
its tests live there. ``nox -s apply build test`` is the main job; ``nox -s
ci`` is what CI runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from serieskit import cli  # noqa: E402

nox.options.sessions = ["apply"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PYTEST = "pytest==9.0.3"


def _toolkit(session: nox.Session, command: str) -> None:
    if cli.run([command, *session.posargs], ROOT) != 0:
        session.error(f"{command} failed")


@nox.session(venv_backend="none")
def apply(session: nox.Session) -> None:
    """Make .work/vllm the pinned vLLM base plus one commit per patch."""
    _toolkit(session, "apply")


@nox.session(venv_backend="none")
def export(session: nox.Session) -> None:
    """Write the work tree's commits back to patches/ (byte-stable)."""
    _toolkit(session, "export")


@nox.session(venv_backend="none")
def status(session: nox.Session) -> None:
    """Show the base, the applied commits, differences and uncommitted files."""
    _toolkit(session, "status")


@nox.session(venv_backend="none")
def rebase(session: nox.Session) -> None:
    """Move the series: -- vllm==X.Y.Z | REPO@REF [--update-pin] | --continue | --abort."""
    _toolkit(session, "rebase")


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Compile the series' native code for sm_70 / sm_75 (-- --ptx, --link)."""
    _toolkit(session, "build")


@nox.session(venv_backend="none")
def test(session: nox.Session) -> None:
    """Run the series' test files in the patched tree, one pytest process each."""
    _toolkit(session, "test")


@nox.session
def ci(session: nox.Session) -> None:
    """What CI runs: the toolkit's own tests, then the series checks."""
    session.install(PYTEST)
    session.run("python", "-m", "pytest", "-q", "tests", *session.posargs)
