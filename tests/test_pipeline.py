"""CI's pipeline (ci/pipeline.toml, serieskit.checks.pipeline, `nox -s ci`):
its stages run in order, each duration is printed against its budget and
written down, a stage over its budget warns and one far over it fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import FakeSession, SessionFailed, _load_noxfile

from conftest import commit_file
from serieskit import git
from serieskit.checks import pipeline
from serieskit.errors import ToolkitError

REPO = Path(__file__).resolve().parent.parent
INSTALLS = ("ci", "series")  # what the ci session of noxfile.py knows

TWO = """
[budgets]
fail_factor = 2

[[stage]]
name = "setup"
about = "the tools"
install = "ci"
budget_s = 10

[[stage]]
name = "tests"
about = "the tests"
run = [["pytest", "{posargs}"], ["echo", "done"]]
budget_s = 100
"""


def write(root: Path, text: str) -> Path:
    (root / "ci").mkdir(parents=True, exist_ok=True)
    (root / pipeline.PIPELINE).write_text(text)
    return root


class Clock:
    """Each stage takes what ``took`` says, in order."""

    def __init__(self, *took: float) -> None:
        self.now, self.took, self.started = 0.0, list(took), False

    def __call__(self) -> float:
        if self.started:
            self.now += self.took.pop(0)
        self.started = not self.started
        return self.now


class Recorder:
    """The pipeline run with recorded commands and log lines (kept when it raises)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.calls: list[tuple] = []

    def run(self, root: Path, took: tuple[float, ...], fail: str | None = None, posargs=()):
        def command(*args):
            self.calls.append(args)
            if args[0] == fail:
                raise RuntimeError(f"{fail} failed")

        loads = iter([(0.5, 0.25, 0.75), (1.0, 1.0, 1.0), (2.0, 1.5, 1.0), (3.0, 2.0, 1.0)])
        return pipeline.run(
            root,
            pipeline.load(root, INSTALLS),
            command=command,
            install=lambda what: self.calls.append(("install", what)),
            posargs=list(posargs),
            log=self.lines.append,
            clock=Clock(*took),
            load=lambda: next(loads),
        )


def test_committed_pipeline_runs_what_ci_must():
    """The stages of the real file: the toolkit's checks and tests, then the
    main job on the pinned series, each with a budget."""
    p = pipeline.load(REPO, INSTALLS)
    commands = [" ".join(cmd) for s in p.stages for cmd in s.run]
    assert commands == [
        "pre-commit run --all-files --show-diff-on-failure",
        "python -m pytest -q -n auto --dist worksteal tests {posargs}",
        "python -m serieskit figures --check",
        "python -m serieskit apply",
        "python -m serieskit export --check",
        "python -m serieskit build",
        "python -m serieskit wheel --no-module --verify --dist .work/ci/wheel",
        "python -m serieskit docs --check",
        "python -m serieskit lint",
        "python -m serieskit test",
        "python -m serieskit test --upstream-only",
        "python -m serieskit pr --examples --check",
    ]
    installs = [s.install for s in p.stages if s.install]
    assert installs == ["ci", "series"]
    names = [s.name for s in p.stages]  # the series' requirements after apply makes the tree
    assert names.index("apply") < names.index("test requirements") < names.index("series tests")
    assert names.index("series tests") < names.index("pr examples")  # bodies quote its counts
    # The README's main command is the stages that do what it does.
    assert p.main == pipeline.MainCommand(
        "python3 -m nox -s apply build test",
        ("apply", "build", "test requirements", "series tests"),
    )


def test_the_committed_budgets_add_up_to_the_goals():
    """Issue 24: CI in at most 15 minutes and the main command in at most 6
    on a fresh 2-core machine; every stage within its budget keeps to that."""
    p = pipeline.load(REPO, INSTALLS)
    assert sum(s.budget_s for s in p.stages) <= 15 * 60
    assert p.main is not None
    assert sum(s.budget_s for s in p.stages if s.name in p.main.stages) <= 6 * 60


def test_each_stage_is_timed_against_its_budget(tmp_path):
    root = write(tmp_path, TWO)
    rec = Recorder()
    timings = rec.run(root, (4, 130), posargs=["-x", "-q"])
    lines = rec.lines
    assert rec.calls == [("install", "ci"), ("pytest", "-x", "-q"), ("echo", "done")]
    assert "ci: stage 1/2, setup (budget 10 s): the tools" in lines
    assert "ci: setup took 4 s (budget 10 s)" in lines
    assert "ci: tests took 2 min 10 s, over its budget of 1 min 40 s (warning)" in lines
    assert [t.seconds for t in timings] == [4, 130]
    data = json.loads((root / ".work" / pipeline.TIMINGS).read_text())
    assert data["complete"] is True and data["total_s"] == 134
    assert [(s["name"], s["seconds"], s["budget_s"]) for s in data["stages"]] == [
        ("setup", 4, 10),
        ("tests", 130, 100),
    ]
    assert [s["over_budget"] for s in data["stages"]] == [False, True]
    assert [s["load_at_end"] for s in data["stages"]] == [[1.0, 1.0, 1.0], [2.0, 1.5, 1.0]]
    assert data["ci_machine"]["load_at_start"] == [0.5, 0.25, 0.75]
    assert data["ci_machine"]["cores"] and data["timings_schema"] == pipeline.TIMINGS_SCHEMA
    assert data["budget_total_s"] == 110 and data["main_command"] is None
    assert "ci: load average 0.5 at the start, 2.0 at the end" in "\n".join(lines)


def test_a_stage_far_over_its_budget_fails_ci(tmp_path):
    root = write(tmp_path, TWO)
    rec = Recorder()
    with pytest.raises(ToolkitError, match=r"setup took 25 s, over 2 times its budget of 10 s"):
        rec.run(root, (25, 1))
    assert "ci: setup took 25 s, over 2 times its budget of 10 s" in rec.lines
    assert "ci: tests took 1 s (budget 1 min 40 s)" in rec.lines  # the rest ran


def test_a_failing_command_stops_the_pipeline_after_the_summary(tmp_path):
    last = '\n[[stage]]\nname = "last"\nabout = "x"\nbudget_s = 5\nrun = [["true"]]\n'
    root = write(tmp_path, TWO + last)
    rec = Recorder()
    with pytest.raises(RuntimeError, match="pytest failed"):
        rec.run(root, (1, 7), fail="pytest")
    lines = rec.lines
    assert ("echo", "done") not in rec.calls
    assert "ci: tests failed after 7 s (budget 1 min 40 s)" in lines
    assert any(line.split() == ["last", "not", "run", "budget", "5", "s"] for line in lines)
    data = json.loads((root / ".work" / pipeline.TIMINGS).read_text())
    assert data["complete"] is False
    # Every stage is there with the same keys, the one that did not run too.
    assert [(s["status"], s["ok"], s["seconds"]) for s in data["stages"]] == [
        ("passed", True, 1),
        ("failed", False, 7),
        ("not run", None, None),
    ]
    assert len({tuple(s) for s in data["stages"]}) == 1


MAIN = '\n[main_command]\ncommand = "nox -s tests"\nstages = ["setup", "tests"]\n'


def test_the_main_command_is_the_sum_of_its_stages(tmp_path):
    root = write(tmp_path, TWO + MAIN)
    rec = Recorder()
    rec.run(root, (4, 60))
    data = json.loads((root / ".work" / pipeline.TIMINGS).read_text())
    assert data["main_command"] == {
        "command": "nox -s tests",
        "stages": ["setup", "tests"],
        "seconds": 64,
    }
    assert "  main command (nox -s tests): 1 min 4 s" in rec.lines
    # Written the same way every time: a stable document for the README's figures.
    first = (root / ".work" / pipeline.TIMINGS).read_text()
    rec.run(root, (4, 60))
    again = (root / ".work" / pipeline.TIMINGS).read_text()
    assert [line for line in first.splitlines() if '"started"' not in line] == [
        line for line in again.splitlines() if '"started"' not in line
    ]
    with pytest.raises(ToolkitError, match=r"\[main_command\] names no stage 'lint'"):
        pipeline.load(write(tmp_path, TWO + MAIN.replace('"tests"]', '"lint"]')), INSTALLS)


SCRATCH = """
[[stage]]
name = "make"
about = "writes its scratch"
run = [["make"]]
budget_s = 10
scratch = [".work/made", ".work/there", ".work/never"]

[[stage]]
name = "after"
about = "reads nothing of it"
run = [["true"]]
budget_s = 10
"""


def test_a_stages_scratch_that_this_run_made_is_removed_once_it_passed(tmp_path):
    """CI leaves behind what the README's commands keep: a stage's scratch
    goes once the stage passed, said in one line; what was there before the
    run (a user's, or an earlier command's) stays, and so does a failed
    stage's (to look at)."""
    root = write(tmp_path, SCRATCH)
    (root / ".work" / "there").mkdir(parents=True)
    (root / ".work" / "there" / "yours").write_text("kept")
    rec = Recorder()

    def run(fail=None):
        def command(*args):
            if args != ("make",):
                return
            (root / ".work" / "made").mkdir(parents=True, exist_ok=True)
            (root / ".work" / "made" / "wheel.whl").write_bytes(b"x" * 2_000_000)
            if fail:
                raise RuntimeError("make failed")

        pipeline.run(
            root,
            pipeline.load(root, INSTALLS),
            command=command,
            install=lambda what: None,
            posargs=[],
            log=rec.lines.append,
            clock=Clock(1, 1),
            load=lambda: (1.0, 1.0, 1.0),
        )

    with pytest.raises(RuntimeError, match="make failed"):
        run(fail=True)
    assert (root / ".work" / "made" / "wheel.whl").is_file()  # a failed stage's stays
    assert not any("removed" in line for line in rec.lines)
    (root / ".work" / "made" / "wheel.whl").unlink()
    (root / ".work" / "made").rmdir()
    run()
    assert not (root / ".work" / "made").exists()
    assert (root / ".work" / "there" / "yours").read_text() == "kept"
    assert [line for line in rec.lines if "removed" in line] == [
        "ci: removed this run's scratch after make: .work/made (2 MB)"
    ]


def test_scratch_in_a_git_worktree_leaves_its_repository_clean(tmp_path):
    """The lint's checkout is a worktree of .work/vllm: removing it drops its
    registration too, so the next lint makes it afresh."""
    root = write(tmp_path / "root", SCRATCH.replace('".work/made", ', '".work/lint", '))
    repo = root / ".work" / "vllm"
    repo.mkdir(parents=True)
    git.git(repo, "init", "-q")
    commit_file(repo, "a.py", "x = 1\n", "A", "A U Thor <a@example.com>")
    pipeline.run(
        root,
        pipeline.load(root, INSTALLS),
        command=lambda *a: a == ("make",)
        and git.detached_worktree(repo, root / ".work" / "lint" / "head", "HEAD"),
        install=lambda what: None,
        posargs=[],
        log=(lines := []).append,
        clock=Clock(1, 1),
        load=lambda: (1.0, 1.0, 1.0),
    )
    assert not (root / ".work" / "lint").exists()
    assert "lint" not in git.git(repo, "worktree", "list")
    assert any(
        line.startswith("ci: removed this run's scratch after make: .work/lint (") for line in lines
    )


def test_the_ci_wheel_stage_leaves_no_dist_behind(tmp_path):
    """The committed wheel stage writes its wheel under .work/ and removes it
    once checked: dist/ is the user's `nox -s wheel`'s (issue 39)."""
    committed = pipeline.load(REPO, INSTALLS)
    (stage,) = [s for s in committed.stages if s.name == "wheel"]
    root = tmp_path
    made = []

    def command(*args):  # the wheel session, faked: writes where --dist says
        assert args[:4] == ("python", "-m", "serieskit", "wheel")
        dist = root / (args[args.index("--dist") + 1] if "--dist" in args else "dist")
        dist.mkdir(parents=True, exist_ok=True)
        made.append(dist / "vllm-0.33.0+series.g1.nosm7x-cp38-abi3-manylinux_2_28_x86_64.whl")
        made[-1].write_bytes(b"PK" * 1000)

    lines: list[str] = []
    pipeline.run(
        root,
        pipeline.Pipeline((stage,), committed.fail_factor),
        command=command,
        install=lambda what: None,
        posargs=[],
        log=lines.append,
        clock=Clock(1),
        load=lambda: (1.0, 1.0, 1.0),
    )
    assert made and not made[0].exists()
    assert not (root / "dist").exists() and not (root / ".work" / "ci" / "wheel").exists()
    assert "ci: removed this run's scratch after wheel: .work/ci/wheel (0 MB)" in lines


def test_committed_scratch_is_what_no_later_stage_reads():
    p = pipeline.load(REPO, INSTALLS)
    scratch = {s.name: s.scratch for s in p.stages if s.scratch}
    assert scratch == {
        "wheel": (".work/ci/wheel",),
        "lint": (".work/lint",),
        "upstream tests": (".work/pycache",),
    }
    later = [
        " ".join(cmd)
        for s in p.stages[[x.name for x in p.stages].index("upstream tests") + 1 :]
        for cmd in s.run
    ]
    assert later == [
        "python -m serieskit pr --examples --check"
    ]  # no tests after the bytecode goes


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'install = "ci"',
            'install = "gpu"',
            r"installs 'gpu', which the ci session does not know",
        ),
        ("budget_s = 10", "", r"stage 1 \(setup\) lacks budget_s"),
        ("budget_s = 10", "budget_s = 0", r"budget_s is not positive"),
        ('install = "ci"\n', "", r"stage 1 \(setup\) does nothing"),
        ('["echo", "done"]', '"echo done"', r"run is not a list of commands"),
        ('name = "tests"', 'name = "setup"', r"names stage 'setup' twice"),
        ("fail_factor = 2", "fail_factor = 0.5", r"fail_factor is not a number of at least 1"),
        ("budget_s = 10", 'budget_s = 10\nscratch = ["dist"]', r"scratch is not a list of paths"),
        ("budget_s = 10", 'budget_s = 10\nscratch = [".work"]', r"under \.work/"),
        ("budget_s = 10", 'budget_s = 10\nscratch = [".work/../x"]', r"under \.work/"),
    ],
)
def test_a_broken_pipeline_is_one_error_naming_it(tmp_path, old, new, message):
    assert old in TWO
    root = write(tmp_path, TWO.replace(old, new, 1))
    with pytest.raises(ToolkitError, match=message):
        pipeline.load(root, INSTALLS)


class CiSession(FakeSession):
    """What the ci session uses of nox.Session, recorded."""

    def __init__(self, posargs: list[str]) -> None:
        super().__init__(posargs)
        self.ran: list[tuple] = []
        self.kws: list[dict] = []
        self.logged: list[str] = []

    def run(self, *args, **kw) -> None:
        self.ran.append(args)
        self.kws.append(kw)

    def install(self, *args, silent: bool = True) -> None:
        self.ran.append(("pip install", *args))
        self.silent = silent  # pip's own lines are the progress

    def log(self, text: str) -> None:
        self.logged.append(text)

    def notify(self, *args, **kw) -> None:
        pass


def torch_env(noxfile, tmp_path: Path, monkeypatch) -> str:
    """What the torch_env session leaves for test and ci: its bin directory."""
    bin_dir = tmp_path / "torch_env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    monkeypatch.setattr(noxfile, "_TORCH_ENV", [str(bin_dir)])
    return str(bin_dir)


def test_test_and_ci_share_the_torch_env_sessions_environment():
    """One torch install (5.8 GB) for both: nox runs torch_env first and
    neither makes an environment of its own (issue 39)."""
    pytest.importorskip("nox")
    noxfile = _load_noxfile()
    for session in (noxfile.test, noxfile.ci):
        assert list(session.requires) == ["torch_env"] and session.venv_backend == "none"
    assert noxfile.torch_env.venv_backend is None  # nox makes this one
    assert noxfile.ci_port.venv_backend is None  # a port may pin another torch


@pytest.mark.parametrize("name", ["test", "ci"])
def test_test_and_ci_refuse_without_the_torch_env(tmp_path, monkeypatch, name):
    pytest.importorskip("nox")
    noxfile = _load_noxfile()
    monkeypatch.setattr(noxfile, "_TORCH_ENV", [])  # --no-dependencies: torch_env did not run
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)  # and never made its environment here
    session = CiSession([])
    session.name = name
    with pytest.raises(SessionFailed, match=f"{name} runs in torch_env's environment, which is"):
        getattr(noxfile, name)(session)


def test_nox_ci_session_runs_the_pipeline_file(tmp_path, monkeypatch):
    pytest.importorskip("nox")
    noxfile = _load_noxfile()
    env_bin = torch_env(noxfile, tmp_path, monkeypatch)
    root = write(tmp_path, TWO)
    (root / "pin.toml").write_text((REPO / "pin.toml").read_text())
    monkeypatch.setattr(noxfile, "ROOT", root)
    monkeypatch.setattr(noxfile, "_ports", lambda session: [])
    session = CiSession(["-k", "x"])
    noxfile.ci(session)
    pip = (f"{env_bin}/python", "-m", "pip", "install")
    assert session.ran[0][:4] == pip and noxfile.PYTEST in session.ran[0]
    # programs from the shared environment first, the rest from PATH
    assert session.ran[1:] == [("pytest", "-k", "x"), ("echo", "done")]
    env = session.kws[-1]["env"]
    assert env["PATH"].startswith(env_bin + ":") and env["VIRTUAL_ENV"] == str(Path(env_bin).parent)
    assert any(line.startswith("installing 'ci' requirements: ") for line in session.logged)
    assert (root / ".work" / pipeline.TIMINGS).is_file()
    write(root, TWO.replace("budget_s = 10", "budget_s = -1"))
    with pytest.raises(SessionFailed, match="budget_s is not positive"):
        noxfile.ci(CiSession([]))


def test_the_test_session_says_what_it_installs_and_that_it_takes_minutes(
    root, tmp_path, monkeypatch
):
    pytest.importorskip("nox")
    noxfile = _load_noxfile()
    env_bin = torch_env(noxfile, tmp_path, monkeypatch)
    monkeypatch.setattr(noxfile, "ROOT", root)
    requirements = ["torch==9.9", "-r", "r.txt"]
    monkeypatch.setattr(noxfile.series, "test_requirements", lambda t: requirements)
    session = CiSession([])
    noxfile.test(session)
    (line,) = session.logged
    assert line.startswith("installing the series' test requirements: ")
    assert "torch==9.9 -r r.txt" in line and "minutes on a first run" in line
    install, run = session.ran
    assert install[:4] == (f"{env_bin}/python", "-m", "pip", "install") and "torch==9.9" in install
    assert "--no-compile" in install  # pip's byte-compiling was half the install
    assert "--no-cache-dir" in install  # torch's 3 GB of wheels not kept twice
    assert run == (f"{env_bin}/python", "-m", "serieskit", "test")
    assert session.kws[0]["silent"] is False  # pip's own lines are the progress
    assert session.kws[1]["env"]["VIRTUAL_ENV"] == str(Path(env_bin).parent)
    # Then pip runs only when the requirements (the -r files' lines included)
    # changed: `nox -s test -- 0004` goes straight to its files.
    session = CiSession(["0004"])
    noxfile.test(session)
    assert session.logged == [], session.logged
    assert session.ran == [(f"{env_bin}/python", "-m", "serieskit", "test", "0004")]
    listed = tmp_path / "requirements" / "common.txt"
    listed.parent.mkdir()
    listed.write_text("regex\n-r more.txt\n")
    (listed.parent / "more.txt").write_text("cachetools\n")
    requirements[2] = str(listed)
    for nested, pip in (("cachetools\n", True), ("cachetools\n", False), ("cachetools==9\n", True)):
        (listed.parent / "more.txt").write_text(nested)
        session = CiSession([])
        noxfile.test(session)
        assert len(session.ran) == (2 if pip else 1), (nested, session.ran)


def test_the_toolkit_tests_leave_only_failed_tests_folders():
    """Tests that apply the real sdist leave about 150 MB each in tmp_path:
    pytest removes a passing test's (1.4 GB a run otherwise, kept for three
    runs under $TMPDIR; issue 39)."""
    import tomllib

    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    assert settings["ini_options"]["tmp_path_retention_policy"] == "failed"
