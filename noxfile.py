"""Sessions of the vLLM Turing / no-P2P prefill series toolkit.

Each session only calls the toolkit (package ``serieskit``); the logic and
its tests live there. ``nox -s apply build test`` is the main job; ``nox -s
ci`` is what CI runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from serieskit import cli  # noqa: E402
from serieskit.checks import pipeline, runner  # noqa: E402
from serieskit.checks.lint import REQUIREMENTS as LINT  # noqa: E402 (`lint`: a session)
from serieskit.errors import ToolkitError  # noqa: E402
from serieskit.series import series, target  # noqa: E402

nox.options.sessions = ["apply"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
# Nox looks for uv (an optional backend these sessions never ask for) and says
# "uv binary not found." at every session: noise with no way on for a user.
logging.getLogger("nox").addFilter(lambda r: r.getMessage() != "uv binary not found.")

PYTEST = "pytest==9.0.3"
PRE_COMMIT = "pre-commit==4.7.0"
# What `python -m serieskit` needs in a session's own environment (the
# sessions without one run in nox's, which has it through virtualenv).
TOOLKIT = "filelock>=3.12"
GITPYTHON = "GitPython==3.2.1"  # the pr session reads commits, trailers and refs with it
MATPLOTLIB = "matplotlib==3.11.2"  # bench/plots.py (its test draws the committed results)
# tests/test_layout.py runs the toolkit's import-layer contract (pyproject.toml),
# as the import-linter hook of .pre-commit-config.yaml does, at the same pin.
IMPORT_LINTER = "import-linter==2.17"
# The toolkit's tests run on a worker per core in CI (ci/pipeline.toml).
XDIST = "pytest-xdist==3.8.0"


def _install(
    session: nox.Session | _InTorchEnv, what: str, requirements: list[str], large: bool = False
) -> None:
    """pip install into the session's environment, saying first what (and, for
    torch and vLLM's requirements, that it takes minutes); pip's own lines
    (collecting, downloading) are its progress. The large installs skip pip's
    byte-compiling of every module (--no-compile): it was half of their install
    time here, while the tests import a small part of torch and its
    dependencies, compiled on first import and kept (under .work/pycache where
    PYTHONDONTWRITEBYTECODE is set: serieskit/checks/runner.py, bytecode_env).
    They also keep nothing in pip's cache (--no-cache-dir): downloaded from
    PyPI, torch's wheels and its CUDA libraries' are about 3 GB, kept there a
    second time beside the environment that nox reuses."""
    took = " (minutes on a first run: torch and its CUDA libraries are large)"
    session.log(f"installing {what}: {' '.join(requirements)}" + (took if large else ""))
    large_only = ["--no-compile", "--no-cache-dir"] if large else []
    session.install(*large_only, *requirements, silent=False)


def _toolkit(session: nox.Session, command: str) -> None:
    if cli.run([command, *session.posargs], ROOT) != 0:
        session.error(f"{command} failed")


def _target(session: nox.Session, version: str | None = None) -> target.Target:
    """The pin's series, or the port that ``-- --port VERSION`` (or ``version``) names."""
    try:
        return target.resolve(ROOT, version or cli.port_of(session.posargs))
    except ToolkitError as e:
        session.error(str(e))


def _ports(session: nox.Session) -> list[target.Target]:
    try:
        return target.ports(ROOT)
    except ToolkitError as e:
        session.error(str(e))


@nox.session(venv_backend="none")
def apply(session: nox.Session) -> None:
    """Make .work/vllm the pinned vLLM base plus one commit per patch
    (-- --continue: the rest of the series after a stopped patch finished by hand)."""
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
def carry(session: nox.Session) -> None:
    """Carry the pin's changed patches to a port: -- VERSION [--check|--record|--continue]."""
    _toolkit(session, "carry")


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Compile the series' native code for sm_70 / sm_75 (-- --ptx, --link)."""
    _toolkit(session, "build")


@nox.session(venv_backend="none")
def overlay(session: nox.Session) -> None:
    """overlays/vllm-VERSION from the work tree; -- --gpu packs the GPU machine's loads."""
    _toolkit(session, "overlay")


@nox.session(venv_backend="none")
def evidence(session: nox.Session) -> None:
    """The single-GPU evidence in one sitting of the GPU machine: -- --plan prints the
    device calls (after overlay -- --gpu), -- --collect FOLDER... writes results/."""
    _toolkit(session, "evidence")


@nox.session(venv_backend="none")
def wheel(session: nox.Session) -> None:
    """dist/vllm-VERSION+series.gCOMMIT-*.whl: the released wheel's compiled modules,
    the series' Python tree, vllm._sm7x_C (-- --no-module, --ptx, --verify, --tree,
    --release). Linking the module needs nvcc and torch with CUDA in this Python."""
    _toolkit(session, "wheel")


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Regenerate the runtime reference and amend it into its patch (-- --check)."""
    _toolkit(session, "docs")


@nox.session(venv_backend="none")
def figures(session: nox.Session) -> None:
    """Rewrite the figures blocks of README.md and docs/ from results/ (-- --check, --record-ci)."""
    _toolkit(session, "figures")


@nox.session
def pr(session: nox.Session) -> None:
    """Pull requests from the series: -- --signoff "Name <mail>" [--others DIR] [--check]."""
    # LINT: the target tree's pre-commit check
    _install(session, "the pr session's tools", [TOOLKIT, GITPYTHON, *LINT])
    session.run("python", "-m", "serieskit", "pr", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """The linted tree's own pre-commit hooks on what the series changes."""
    _install(session, "the lint session's tools", [TOOLKIT, *LINT])
    session.run("python", "-m", "serieskit", "lint", *session.posargs)


@nox.session
def lint_toolkit(session: nox.Session) -> None:
    """The toolkit's own code through its .pre-commit-config.yaml (ruff, mypy, import layers)."""
    _install(session, "pre-commit", [PRE_COMMIT])
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure", *session.posargs)


# --- the one environment with the series' torch ---------------------------------------
# torch and its CUDA libraries take gigabytes (the README's timing block gives
# .nox as measured: results/timing_*.json). `test` and `ci` (and the
# wheel check inside ci, which lays the wheel over this environment's packages:
# serieskit/build/wheel_verify.py) need the same torch, so they share one
# environment instead of one each. Nox gives every session an environment of its
# own and has no option to share one (wntrblm/nox#167, #286): the environment
# belongs to the session `torch_env`, which `test` and `ci` name in `requires`
# (nox runs it first, once), and they run in that one, with none of their own.
# ci_port keeps its own: a port may pin another torch.
_TORCH_ENV: list[str] = []  # its bin directory, once torch_env has run


@nox.session(default=False)
def torch_env(session: nox.Session) -> None:
    """The environment that test and ci share (the series' torch), made and kept by nox."""
    _TORCH_ENV[:] = [session.bin]
    session.log(f"the shared environment of test and ci: {Path(session.bin).parent}")


class _InTorchEnv:
    """What test and ci use of a session, run in torch_env's environment: ``run``
    finds programs in its bin directory first, ``install`` is its pip."""

    def __init__(self, session: nox.Session) -> None:
        made = ROOT / ".nox" / "torch_env" / "bin"  # where nox made it on an earlier run
        if not _TORCH_ENV and not made.is_dir():
            session.error(
                f"{session.name} runs in torch_env's environment, which is not made yet: "
                "run it without --no-dependencies"
            )
        self.session, self.bin = session, _TORCH_ENV[0] if _TORCH_ENV else str(made)
        path = os.pathsep.join([self.bin, os.environ.get("PATH", "")])
        self.env = {"PATH": path, "VIRTUAL_ENV": str(Path(self.bin).parent)}
        self.posargs, self.log, self.error = session.posargs, session.log, session.error

    def run(self, program: str, *args: str, **kw) -> None:
        here = Path(self.bin, program)
        program = str(here) if here.is_file() else program
        self.session.run(program, *args, env=self.env, external=True, **kw)

    def install(self, *requirements: str, silent: bool = True) -> None:
        self.run("python", "-m", "pip", "install", *requirements, silent=silent)


@nox.session(venv_backend="none", requires=["torch_env"])
def test(session: nox.Session) -> None:
    """Run the series' test files in the patched tree, one pytest process each, a
    file per core at once (-- --upstream: also upstream's tests of the touched files
    against patches/upstream-baseline.json, as CI does; --record-upstream-baseline;
    --jobs N; --port V; --coverage: a report per machine for the pr session)."""
    shared = _InTorchEnv(session)
    requirements = [TOOLKIT, PYTEST, runner.COVERAGE, *series.test_requirements(_target(session))]
    # pip takes seconds to find vLLM's requirements all present, longer than a
    # quick file's tests (nox -s test -- 0004): it runs only when they changed.
    stamp = Path(shared.bin).parent / "series-test-requirements.txt"
    if not stamp.is_file() or stamp.read_text() != _requirements_text(requirements):
        _install(shared, "the series' test requirements", requirements, large=True)
        stamp.write_text(_requirements_text(requirements))
    shared.run("python", "-m", "serieskit", "test", *session.posargs)


def _requirements_text(requirements: list[str]) -> str:
    """The requirements as pip reads them: the lines of each ``-r`` file (and
    of the files those name) in place of its name."""
    lines: list[str] = []
    for before, item in zip(["", *requirements], requirements, strict=False):
        if before == "-r":
            path = Path(item)
            for line in path.read_text().splitlines() if path.is_file() else []:
                words = line.split("#", 1)[0].split()
                if words[:1] == ["-r"] and len(words) > 1:
                    lines += _requirements_text(["-r", str(path.parent / words[1])]).splitlines()
                else:
                    lines.append(line)
        elif item != "-r":
            lines.append(item)
    return "\n".join(lines) + "\n"


@nox.session(venv_backend="none", requires=["torch_env"])
def ci(session: nox.Session) -> None:
    """What CI runs (.ci/run): the stages of ci/pipeline.toml, each timed against
    its budget: the toolkit's own checks and tests, the docs' figures, apply,
    export round-trip, build, the wheel, docs --check, lint, the series' CPU tests
    and upstream's tests of the touched files against their recorded baseline."""
    shared = _InTorchEnv(session)
    installs = {
        "ci": lambda: [
            TOOLKIT,
            GITPYTHON,
            PYTEST,
            XDIST,
            PRE_COMMIT,
            runner.COVERAGE,
            MATPLOTLIB,
            IMPORT_LINTER,
            *LINT,
        ],
        "series": lambda: series.test_requirements(ROOT),
    }

    def install(what: str) -> None:
        if requirements := installs[what]():
            _install(shared, f"{what!r} requirements", requirements, large=what == "series")

    try:
        stages = pipeline.load(ROOT, installs)
        pipeline.run(
            ROOT,
            stages,
            command=shared.run,
            install=install,
            posargs=session.posargs,
            log=session.log,
        )
    except ToolkitError as e:
        session.error(str(e))
    for port in _ports(session):  # each in an environment of its own (its torch)
        session.notify("ci_port", posargs=[port.version])


@nox.session
def ci_port(session: nox.Session) -> None:
    """CI for one port (-- VERSION): apply, export round-trip, carried changes and
    kernels against the pin's series, docs --check, lint and the series' CPU tests on
    the port's torch. No build: carry --check holds csrc/sm7x/ to the pin's, built by
    ci. Upstream's tests of the touched files are left to
    `nox -s test -- --upstream --port VERSION` (after recording the port's baseline
    with `-- --record-upstream-baseline --port VERSION`)."""
    if len(session.posargs) != 1:
        session.error("ci_port takes the port's release: nox -s ci_port -- VERSION")
    version = session.posargs[0]
    _install(session, "the ci_port session's tools", [TOOLKIT, PYTEST, *LINT])
    port = ["--port", version]
    session.run("python", "-m", "serieskit", "apply")  # carry --check reads the pin's tree
    session.run("python", "-m", "serieskit", "apply", *port)
    if requirements := series.test_requirements(_target(session, version)):
        _install(session, f"the port's test requirements ({version})", requirements, large=True)
    for step in (
        ["export", "--check", *port],
        ["carry", version, "--check"],
        ["docs", "--check", *port],
        ["lint", *port],
        ["test", *port],
    ):
        session.run("python", "-m", "serieskit", *step)
