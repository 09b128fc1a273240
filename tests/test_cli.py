"""The command line: every argument error of every command is one ``error:``
line (exit status 1, no traceback, no usage text), ``--help`` is not an
error, and a bad argument to one nox session does not end the others."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import TWO_CONFLICTS, cli_caller, make_series, rev

from conftest import add_release, make_root
from serieskit import cli
from serieskit.series import apply

REPO = Path(__file__).resolve().parent.parent

ARGUMENT_ERRORS = [
    [],
    ["bogus"],
    ["--bogus"],
    ["apply", "--bogus"],
    ["apply", "extra"],
    ["apply", "--force=yes"],
    ["apply", "--continue", "--force"],
    ["apply", "--continue", "extra"],
    ["apply", "--abort"],
    ["export", "--bogus"],
    ["export", "extra"],
    ["status", "--force"],
    ["status", "extra"],
    ["rebase"],
    ["rebase", "--bogus"],
    ["rebase", "vllm==0.0.2", "--continue"],
    ["rebase", "vllm==0.0.2", "--abort"],
    ["rebase", "--continue", "--abort"],
    ["rebase", "vllm==0.0.2", "vllm==0.0.3"],
    ["rebase", "vllm==not a version"],
    ["rebase", "neither-a-release-nor-a-ref"],
    ["build", "--arch", "80"],
    ["build", "--arch"],
    ["build", "--bogus"],
    ["build", "extra"],
    ["docs", "--bogus"],
    ["docs", "extra"],
    ["test", "--bogus"],
    ["lint", "--bogus"],
    ["overlay", "--bogus"],
    ["pr", "--bogus"],
    ["pr", "--version", "two"],
]


def one_error_line(rc: int, out: str, err: str) -> str:
    assert "Traceback" not in out + err, out + err
    assert rc == 1, (rc, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), err
    assert sum(line.startswith("error: ") for line in lines) == 1, err
    assert all(line.startswith("  ") for line in lines[1:]), err
    assert "usage:" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", ARGUMENT_ERRORS, ids=lambda a: " ".join(a) or "(none)")
def test_argument_error_is_one_error_line(root, capsys, argv):
    try:
        rc = cli.run(argv, root)
    except SystemExit as e:
        pytest.fail(f"cli.run({argv}) raised SystemExit({e.code}): it must return")
    out, err = capsys.readouterr()
    one_error_line(rc, out, err)
    assert not (root / ".work" / "vllm").exists()  # nothing was applied


TWO_MODES = [
    ["rebase", "vllm==0.0.3", "--continue"],
    ["rebase", "vllm==0.0.3", "--abort"],
    ["rebase", "--continue", "--abort"],
    ["rebase", "vllm==0.0.3", "--continue", "--abort"],
]


@pytest.fixture
def sk(capsys, root):
    return cli_caller(capsys, root)


def test_two_rebase_modes_at_once_are_refused_during_a_stopped_rebase(sk, root, cache, capsys):
    """Where each mode alone would do something, two together do nothing."""
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    assert cli.run(["rebase", "vllm==0.0.2"], root) == 1
    stopped = rev(repo, "HEAD")
    assert (repo / ".git" / "rebase-merge").exists()
    for argv in TWO_MODES:
        capsys.readouterr()
        rc = cli.run(argv, root)
        out, err = capsys.readouterr()
        line = one_error_line(rc, out, err)
        assert "nothing to" not in line, (argv, line)
        assert (repo / ".git" / "rebase-merge").exists(), argv  # still stopped
        assert rev(repo, "HEAD") == stopped, argv
    assert cli.run(["rebase", "--abort"], root) == 0
    assert rev(repo, "HEAD") == head


def test_argument_error_names_the_bad_argument(root, capsys):
    assert cli.run(["build", "--arch", "80"], root) == 1
    line = capsys.readouterr().err.splitlines()[0]
    assert "--arch" in line and "80" in line, line
    assert cli.run(["apply", "--bogus"], root) == 1
    assert "--bogus" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["apply", "--help"], ["rebase", "-h"]])
def test_help_is_not_an_error(root, capsys, argv):
    try:
        rc = cli.run(argv, root)
    except SystemExit as e:
        pytest.fail(f"cli.run({argv}) raised SystemExit({e.code}): it must return")
    out, err = capsys.readouterr()
    assert rc == 0 and "usage:" in out and "error" not in err, (rc, out, err)


def run_module(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """``python -m serieskit`` as a real process (on ``root``)."""
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {str(REPO)!r})\n"
        f"from serieskit import cli; sys.exit(cli.run(sys.argv[1:], Path({str(root)!r})))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "argv", [["bogus"], ["build", "--arch", "80"], ["rebase", "vllm==0.0.2", "--continue"]]
)
def test_argument_error_in_a_real_process(root, argv):
    proc = run_module(root, *argv)
    one_error_line(proc.returncode, proc.stdout, proc.stderr)


def test_python_dash_m_serieskit_argument_error():
    proc = subprocess.run(
        [sys.executable, "-m", "serieskit", "--bogus"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_error_line(proc.returncode, proc.stdout, proc.stderr)


# --- nox -------------------------------------------------------------------


class SessionFailed(Exception):
    pass


class FakeSession:
    """What the toolkit sessions use of nox.Session."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs

    def error(self, *args) -> None:
        raise SessionFailed(" ".join(str(a) for a in args))


@functools.cache
def _load_noxfile():
    """noxfile.py, imported once (nox registers each session name once)."""
    spec = importlib.util.spec_from_file_location("series_noxfile", REPO / "noxfile.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def noxfile(root, monkeypatch):
    pytest.importorskip("nox")
    module = _load_noxfile()
    monkeypatch.setattr(module, "ROOT", root)
    return module


TOOLKIT_SESSIONS = ["apply", "export", "status", "rebase", "build", "docs", "overlay"]


@pytest.mark.parametrize("name", TOOLKIT_SESSIONS)
def test_bad_argument_fails_only_its_nox_session(noxfile, capsys, name):
    session = getattr(noxfile, name)
    with pytest.raises(SessionFailed):  # session.error, not SystemExit: nox goes on
        session(FakeSession(["--bogus"]))
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: "), err


@pytest.mark.parametrize("name", TOOLKIT_SESSIONS)
def test_help_ends_no_nox_session(noxfile, capsys, name):
    getattr(noxfile, name)(FakeSession(["--help"]))
    assert "usage:" in capsys.readouterr().out


def test_apply_session_passes_continue_on(noxfile, capsys):
    """``nox -s apply -- --continue`` reaches apply --continue (here: nothing stopped)."""
    with pytest.raises(SessionFailed):
        noxfile.apply(FakeSession(["--continue"]))
    err = capsys.readouterr().err
    assert err.startswith("error: no apply is stopped at a patch: nothing to continue"), err


def test_nox_runs_the_next_session_after_a_bad_argument(tmp_path):
    pytest.importorskip("nox")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(REPO / "noxfile.py"),
            "-s",
            "status",
            "apply",
            "--",
            "--bogus",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out
    assert "Running session status" in out and "Running session apply" in out, out
    assert out.count("unrecognized arguments: --bogus") == 2, out
    assert "uv binary not found" not in out  # nox's look for a backend no session uses


# --- from outside the repository root ------------------------------------------


def test_the_root_is_found_by_walking_up(root):
    deep = root / ".work" / "vllm" / "vllm" / "config"
    deep.mkdir(parents=True)
    assert cli.find_root(deep) == root
    assert cli.find_root(root) == root
    assert cli.find_root(root.parent) is None


def _checkout(root: Path) -> Path:
    """``root`` with this toolkit's package, its recipes and noxfile copied in:
    a checkout of its own."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "serieskit", root / "serieskit", ignore=skip)
    shutil.copytree(REPO / "build", root / "build")
    shutil.copy(REPO / "noxfile.py", root / "noxfile.py")
    return root


def test_from_a_subdirectory_serieskit_acts_on_its_checkout_or_names_the_root(
    root, tmp_path, cache
):
    """`python -m serieskit` from inside .work/vllm (where Python finds it
    through PYTHONPATH: it looks in the current folder first) acts on the
    checkout it belongs to; from inside another checkout it refuses, naming
    that checkout's root."""
    apply.apply(_checkout(root).resolve(), log=lambda *a: None)
    work = (root / ".work" / "vllm").resolve()
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "serieskit", "status"],
        cwd=work / "vllm",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"work tree: {work} on the pin's base" in proc.stdout, proc.stdout
    other = make_root(tmp_path / "other", cache).resolve()
    proc = subprocess.run(
        [sys.executable, "-m", "serieskit", "status"],
        cwd=other / "patches",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_error_line(proc.returncode, proc.stdout, proc.stderr)
    assert f"is in the checkout {other}, but this python -m serieskit is {root}'s" in line
    assert line.endswith(f"cd {other} && python3 -m serieskit status"), line


def test_nox_dash_f_takes_the_root_from_the_noxfile_not_the_current_folder(root, tmp_path, cache):
    """Nox looks for noxfile.py in the current folder only (from .work/vllm:
    "Failed to load Noxfile"); `nox -f ROOT/noxfile.py` works from anywhere,
    on ROOT's checkout, even from inside another one."""
    pytest.importorskip("nox")
    _checkout(root)
    other = make_root(tmp_path / "other", cache)
    inside = root / ".work" / "vllm"
    inside.mkdir(parents=True)

    def nox(*args: str, cwd: Path) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "nox", *args, "-s", "status"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"

    out = nox("-f", str(root / "noxfile.py"), cwd=other / "patches")
    assert out.startswith("rc=0\n") and "Session status was successful" in out, out
    assert f"work tree: {root.resolve() / '.work' / 'vllm'} is not a git repository" in out, out
    out = nox(cwd=inside)
    assert out.startswith("rc=2\n"), out
    assert f"Failed to load Noxfile {inside.resolve() / 'noxfile.py'}, no such file exists" in out
