"""Nothing is lost: fault injection through the command line (``cli.run`` and
real processes). Each test breaks something the way it breaks in practice
(a kill, a bad patch file, a stale lock, a wrong pin, a stopped rebase, the
user's own git operations) and checks that the command says what happened in
one ``error:`` line and that the user's work is exactly where it was, or
where the command said it put it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_port
from test_port import PORT, Edit, f0, pin_patches, write_series

from conftest import BASE_FILES, add_release, base_commit, commit_file
from serieskit import cli
from serieskit.errors import ToolkitError
from serieskit.series import base

REPO = Path(__file__).resolve().parent.parent
pinport = test_port.pinport  # the pin and a port to 0.0.2 (a fixture)
USER = {
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_AUTHOR_DATE": "1700000000 +0100",
    "GIT_COMMITTER_DATE": "1700000000 +0100",
}
UTILS = BASE_FILES["vllm/utils.py"]
KERNEL = BASE_FILES["vllm/config/kernel.py"]
F0, F0_NEW = "def f0():\n    return 0\n", "def f0():\n    return 100\n"
F10, F10_NEW = "def f10():\n    return 10\n", "def f10():\n    return 110\n"
# The series of most tests: three patches, the middle one changing two files.
SUBJECTS = ["[Kernel] Change f0", "[Core] Two files", "[Misc] Change f10"]
BACKUP_REF = re.compile(r"refs/series/backup/[^\s`'\",;)]*[^\s`'\",;).:]")


# --- helpers ----------------------------------------------------------------


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def cli_caller(capsys, root: Path):
    """``call("apply", "--force")``: run the command line in this process on
    ``root`` (or ``at=``); returns rc, stdout, stderr."""

    def call(*argv: str, at: Path | None = None) -> Result:
        capsys.readouterr()
        try:
            rc = cli.run(list(argv), at or root)
        except SystemExit as e:  # pragma: no cover - reported as a failure below
            out, err = capsys.readouterr()
            pytest.fail(
                f"cli.run({list(argv)}) raised SystemExit({e.code}) instead of "
                f"returning:\n{out}{err}"
            )
        out, err = capsys.readouterr()
        return Result(rc, out, err)

    return call


@pytest.fixture
def sk(capsys, root):
    return cli_caller(capsys, root)


def error_line(res: Result, *needles: str) -> str:
    """rc 1, exactly one ``error: `` line first on stderr, only indented detail
    lines after it, no traceback anywhere; each needle in the error text."""
    assert "Traceback" not in res.text, res.text
    assert res.rc == 1, res.text
    lines = [line for line in res.err.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), res.err
    assert sum(line.startswith("error: ") for line in lines) == 1, res.err
    assert all(line.startswith("  ") for line in lines[1:]), res.err
    for needle in needles:
        assert needle.lower() in res.err.lower(), (needle, res.err)
    return lines[0]


def ok(res: Result) -> Result:
    assert "Traceback" not in res.text, res.text
    assert res.rc == 0, res.text
    return res


def g(repo: Path, *args: str, check: bool = True) -> str:
    """git as the user runs it (their identity, no toolkit settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        USER, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_EDITOR="true", LC_ALL="C"
    )
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {proc.stdout}{proc.stderr}")
    return proc.stdout


def rev(repo: Path, ref: str) -> str:
    return g(repo, "rev-parse", "--verify", "-q", ref + "^{commit}").strip()


def commit_files(repo: Path, files: dict[str, str], subject: str) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
        g(repo, "add", path)
    g(repo, "commit", "-q", "-m", subject, "-m", "Why: because the test says so.")
    return rev(repo, "HEAD")


def work(root: Path) -> Path:
    return root / ".work" / "vllm"


def patches(root: Path) -> dict[str, bytes]:
    """Every file under patches/, by name: compared byte for byte."""
    return {p.name: p.read_bytes() for p in sorted((root / "patches").iterdir()) if p.is_file()}


def names(root: Path) -> list[str]:
    return (root / "patches" / "series").read_text().split()


def backup_refs(repo: Path) -> list[str]:
    return g(repo, "for-each-ref", "--format=%(refname)", "refs/series/backup/").split()


def is_ancestor(repo: Path, commit: str, ref: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "merge-base", "--is-ancestor", commit, ref],
            capture_output=True,
        ).returncode
        == 0
    )


def refs_keeping(repo: Path, commit: str) -> list[str]:
    return [r for r in backup_refs(repo) if is_ancestor(repo, commit, r)]


def stashed_diffs(repo: Path) -> str:
    out = ""
    for entry in g(repo, "stash", "list", "--format=%gd").split():
        out += g(repo, "stash", "show", "-p", "--include-untracked", entry, check=False)
        out += g(repo, "stash", "show", "-p", entry, check=False)
    return out


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def named_in(text: str, path: Path, root: Path) -> bool:
    """The output names ``path`` (absolute, or relative to the root)."""
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else None
    return str(path) in text or (rel is not None and rel in text)


def series_head_subjects(repo: Path, ref: str = "series", version: str = "0.0.1") -> list[str]:
    return g(
        repo, "log", "--reverse", "--format=%s", f"refs/series/base/{version}..{ref}"
    ).splitlines()


def make_series(sk, root: Path) -> Path:
    """The empty series applied, three commits made in the work tree and
    exported: patches/ holds 0001..0003, the work tree is complete."""
    ok(sk("apply"))
    repo = work(root)
    commit_files(repo, {"vllm/utils.py": UTILS.replace(F0, F0_NEW)}, SUBJECTS[0])
    commit_files(
        repo,
        {"vllm/config/kernel.py": KERNEL.replace("a = 1", "a = 10"), "vllm/new.py": "NEW = 1\n"},
        SUBJECTS[1],
    )
    commit_files(
        repo, {"vllm/utils.py": UTILS.replace(F0, F0_NEW).replace(F10, F10_NEW)}, SUBJECTS[2]
    )
    ok(sk("export"))
    assert len(names(root)) == 3
    return repo


def fresh_apply(sk, root: Path) -> str:
    """Apply patches/ from scratch; the HEAD a complete apply makes."""
    shutil.rmtree(root / ".work")
    ok(sk("apply"))
    return rev(work(root), "HEAD")


def break_context(root: Path, index: int) -> str:
    """Change one context line of patch ``index`` (0-based) so that it no
    longer applies; return its file name."""
    name = names(root)[index]
    path = root / "patches" / name
    text = path.read_text()
    old, new = {
        0: (" def f1():", " def f1_gone():"),
        1: (" class KernelConfig:", " class KernelConfigGone:"),
        2: (" def f11():", " def f11_gone():"),
    }[index]
    assert f"\n{old}\n" in text, text
    path.write_text(text.replace(f"\n{old}\n", f"\n{new}\n", 1))
    return name


def truncate_last_diff(root: Path, index: int) -> str:
    """Cut patch ``index`` at its last ``diff --git``: one file's diff dropped."""
    name = names(root)[index]
    path = root / "patches" / name
    text = path.read_text()
    assert text.count("\ndiff --git ") == 2, text
    path.write_text(text[: text.rindex("\ndiff --git ") + 1])
    return name


KILL_APPLY = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from serieskit import cli, git
real, seen = git.run, []
def run(repo, *args, **kw):
    if args and args[0] == "checkout" and {when!r} == "before checkout":
        os.kill(os.getpid(), signal.SIGKILL)
    if args and args[0] == "am" and any(str(a).endswith(".patch") for a in args):
        seen.append(args)
        if len(seen) == {at} and {when!r} == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        proc = real(repo, *args, **kw)
        if len(seen) == {at} and {when!r} == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return proc
    return real(repo, *args, **kw)
git.run = run
sys.exit(cli.run(["apply"], Path({root!r})))
"""


def killed_apply(root: Path, at: int = 2, when: str = "before") -> None:
    """A real apply process, SIGKILLed as it applies patch ``at`` (just before
    its ``git am`` runs, or just after it committed, before anything else), or
    "before checkout": before it moves the work tree at all."""
    proc = subprocess.run(
        [sys.executable, "-c", KILL_APPLY.format(repo=str(REPO), root=str(root), at=at, when=when)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr


RUN_CLI = """
import contextlib, io, json, sys, time, traceback
from pathlib import Path
sys.path.insert(0, {repo!r})
from serieskit import cli
results = []
for argv in json.loads(sys.argv[1]):
    out, err, start = io.StringIO(), io.StringIO(), time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.run(argv, Path({root!r}))
        except BaseException:
            rc = 99
            err.write(traceback.format_exc())
    results.append([argv, rc, out.getvalue(), err.getvalue(), time.monotonic() - start])
print(json.dumps(results))
"""


def cli_process(root: Path, *commands: list[str], timeout: float = 120) -> list[tuple]:
    """Run commands one after another in a separate process (for locks)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_CLI.format(repo=str(REPO), root=str(root)),
            json.dumps(list(commands)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [
        (argv, Result(rc, out, err), secs)
        for argv, rc, out, err, secs in json.loads(proc.stdout.splitlines()[-1])
    ]


# --- 1, 2: export and status after a failed or killed apply ---------------------


def test_export_after_a_failed_apply_refuses(sk, root):
    make_series(sk, root)
    name = break_context(root, 1)
    before = patches(root)
    error_line(sk("apply"), name)
    res = sk("export")
    error_line(res)
    assert patches(root) == before  # the user's edited patch and the later ones untouched
    error_line(sk("export", "--force"))
    assert patches(root) == before


def test_status_after_a_failed_apply_names_the_patch_and_says_apply(sk, root):
    make_series(sk, root)
    name = break_context(root, 1)
    error_line(sk("apply"), name)
    res = ok(sk("status"))
    assert name in res.out
    assert "nox -s apply" in res.out
    assert "nox -s export" not in res.out


def test_export_after_a_killed_apply_refuses(sk, root):
    make_series(sk, root)
    shutil.rmtree(root / ".work")
    before = patches(root)
    killed_apply(root, at=2)
    error_line(sk("export"))
    assert patches(root) == before
    error_line(sk("export", "--force"))
    assert patches(root) == before


def test_status_after_a_killed_apply_names_the_patch_and_says_apply(sk, root):
    make_series(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2)
    res = ok(sk("status"))
    stopped = names(root)[1]
    assert stopped in res.out or SUBJECTS[1] in res.out, res.out
    assert "nox -s apply" in res.out
    assert "nox -s export" not in res.out


def test_failed_apply_then_the_patch_fixed_applies(sk, root):
    make_series(sk, root)
    good = fresh_apply(sk, root)
    path = root / "patches" / names(root)[1]
    fixed = path.read_bytes()
    break_context(root, 1)
    error_line(sk("apply"))
    path.write_bytes(fixed)
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good


def test_export_with_head_detached_behind_the_series_refuses(sk, root):
    repo = make_series(sk, root)
    before = patches(root)
    g(repo, "checkout", "-q", "--detach", "HEAD~1")
    error_line(sk("export"))
    assert patches(root) == before
    error_line(sk("export", "--force"))
    assert patches(root) == before


# --- 3: an interrupted apply, with and without the user's work ---------------


def test_killed_apply_with_no_user_work_is_repaired(sk, root):
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2, when="before")
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good
    assert ok(sk("status")).out.count("matches patches/") == 1


def test_apply_killed_right_after_a_commit_is_repaired(sk, root):
    """Killed after git am committed patch 2 but before the toolkit noted it:
    that commit is the patch's own, not the user's work."""
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2, when="after")
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good


def test_apply_killed_while_its_git_am_set_up_is_repaired(sk, root):
    """Killed (git am with it) after git am made .git/rebase-apply, before it
    marked the folder as an am's ("applying"): no rebase of the user's, and
    nothing applied; the next apply makes the whole series."""
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2, when="before")
    setup = work(root) / ".git" / "rebase-apply"
    setup.mkdir()
    shutil.copy(root / "patches" / names(root)[1], setup / "0001")
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good
    assert not setup.exists()


@pytest.mark.parametrize("at", [1, 2, 3])
def test_apply_killed_with_its_git_processes_is_repaired(sk, root, at):
    """SIGKILL to the whole process group (git am included) as soon as the
    apply prints that it starts patch ``at``: whatever state git is left in,
    the next apply makes the whole series."""
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {str(REPO)!r})\n"
        f"from serieskit import cli; sys.exit(cli.run(['apply'], Path({str(root)!r})))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout
        for line in proc.stdout:
            if line.startswith(f"apply {at}/"):
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    # Its git children die on their own time; the user reruns once they have.
    filelock = pytest.importorskip("filelock")
    waiter = filelock.FileLock(str(root / ".work" / "lock"))
    waiter.acquire(timeout=20)
    waiter.release()
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good
    assert "matches patches/" in ok(sk("status")).out


@pytest.mark.parametrize("made_by", ["apply", "export"])
def test_apply_killed_before_it_moved_the_work_tree_is_repaired(sk, root, made_by):
    """Killed after it noted that it started, before its first git command
    changed anything: the series in the work tree is the one the toolkit last
    applied or exported, in patches/, not the user's unsaved work."""
    make_series(sk, root)  # the work tree's commits: the user's, exported
    if made_by == "apply":
        fresh_apply(sk, root)  # the work tree's commits: made by apply
    path = root / "patches" / names(root)[2]
    path.write_text(path.read_text().replace("Why: because", "Why: since"))
    killed_apply(root, when="before checkout")
    ok(sk("apply"))
    assert series_head_subjects(work(root)) == SUBJECTS
    assert "Why: since" in g(work(root), "log", "-1", "--format=%B")
    assert "matches patches/" in ok(sk("status")).out


def test_killed_apply_with_user_work_refuses_then_force_keeps_it(sk, root):
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2)
    repo = work(root)
    mine = commit_file(repo, "vllm/mine.py", "MINE = 1\n", "My experiment")
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    before = patches(root)

    res = sk("apply")
    error_line(res)
    assert "My experiment" in res.err or mine[:12] in res.err, res.err
    assert "vllm/__init__.py" in res.err
    assert rev(repo, "series") == mine and rev(repo, "HEAD") == mine
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 2\n"
    assert patches(root) == before

    res = ok(sk("apply", "--force"))
    assert rev(repo, "HEAD") == good
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 1\n"
    kept = refs_keeping(repo, mine)
    assert kept, backup_refs(repo)
    assert any(ref in res.text for ref in kept), res.text
    assert "+VERSION = 2" in stashed_diffs(repo)
    assert "stash" in res.text
    assert patches(root) == before


def test_a_lock_is_named_where_the_system_cannot_tell_who_holds_it(sk, root, monkeypatch):
    """Without /proc the toolkit cannot tell a stale .git/index.lock from one
    a running git holds: the error line names that file (the user must see
    whether a git still runs there before removing it), nothing changes, and
    apply works once it is gone."""
    from serieskit import git as toolkit_git

    monkeypatch.setattr(toolkit_git, "processes_in", lambda repo: None)
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    path = root / "patches" / names(root)[2]
    path.write_text(path.read_text().replace("Why: because", "Why: since"))
    before = patches(root)
    (repo / ".git" / "index.lock").write_text("")
    line = error_line(sk("apply"))
    assert "index.lock" in line, line
    assert rev(repo, "HEAD") == head and patches(root) == before
    (repo / ".git" / "index.lock").unlink()
    ok(sk("apply"))
    assert b"Why: since" in g(repo, "log", "-1", "--format=%B").encode()


# --- 4: the user's own git am, stopped --------------------------------------


def test_users_own_stopped_git_am_is_left_alone(sk, root, tmp_path):
    repo = make_series(sk, root)
    # The user's patch, made on the base: f0 returns 7 (the series says 100).
    scratch = tmp_path / "mine"
    scratch.mkdir()
    g(scratch, "init", "-q")
    commit_files(scratch, {"vllm/utils.py": UTILS}, "base")
    commit_files(
        scratch, {"vllm/utils.py": UTILS.replace(F0, "def f0():\n    return 7\n")}, "My f0"
    )
    g(scratch, "format-patch", "-q", "--full-index", "-1", "-o", str(tmp_path / "out"))
    patch = next((tmp_path / "out").iterdir())
    proc = subprocess.run(
        ["git", "-C", str(repo), "am", "--3way", str(patch)],
        capture_output=True,
        text=True,
        env={**os.environ, **USER, "GIT_CONFIG_GLOBAL": os.devnull},
    )
    assert proc.returncode != 0
    assert (repo / ".git" / "rebase-apply").is_dir()
    # Half-way through resolving it by hand, with a note on the side.
    (repo / "vllm/utils.py").write_text(UTILS.replace(F0, "def f0():\n    return 107\n"))
    (repo / "notes.txt").write_text("resolve f0\n")
    head = rev(repo, "HEAD")
    before = patches(root)

    res = sk("apply")
    error_line(res, "git am")
    assert "in progress" in res.err
    assert (repo / ".git" / "rebase-apply" / "applying").exists()  # still in progress
    assert rev(repo, "HEAD") == head
    assert (repo / "vllm/utils.py").read_text() == UTILS.replace(F0, "def f0():\n    return 107\n")
    assert (repo / "notes.txt").read_text() == "resolve f0\n"
    assert patches(root) == before


@pytest.mark.parametrize("operation", ["rebase -i", "cherry-pick"])
def test_users_own_stopped_git_operation_stops_apply_and_export(sk, root, operation):
    repo = make_series(sk, root)
    before = patches(root)
    if operation == "rebase -i":  # stopped to edit the first patch's commit
        env = {
            **os.environ,
            **USER,
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_SEQUENCE_EDITOR": "sed -i 1s/^pick/edit/",
        }
        subprocess.run(
            ["git", "-C", str(repo), "rebase", "-i", "HEAD~3"],
            check=True,
            capture_output=True,
            env=env,
        )
        marker = repo / ".git" / "rebase-merge"
    else:  # a conflicting commit of the user's, picked onto the series
        g(repo, "checkout", "-q", "-b", "mine", "refs/series/base/0.0.1")
        mine = commit_files(
            repo, {"vllm/utils.py": UTILS.replace(F0, "def f0():\n    return 7\n")}, "My f0"
        )
        g(repo, "checkout", "-q", "series")
        g(repo, "cherry-pick", mine, check=False)  # stops at the conflict
        marker = repo / ".git" / "CHERRY_PICK_HEAD"
    assert marker.exists()
    (repo / "notes.txt").write_text("mid-way\n")
    head = rev(repo, "HEAD")
    for argv in (["apply"], ["export"]):
        res = sk(*argv)
        error_line(res, operation.split()[0])
        assert marker.exists(), argv
        assert rev(repo, "HEAD") == head and (repo / "notes.txt").read_text() == "mid-way\n"
    assert patches(root) == before


# --- 5: detached HEAD with an unexported commit on series -------------------


def test_detached_head_with_an_unexported_commit_on_series(sk, root):
    repo = make_series(sk, root)
    mine = commit_file(repo, "vllm/mine.py", "MINE = 1\n", "Local experiment")
    g(repo, "checkout", "-q", "--detach", "HEAD~1")
    before = patches(root)
    res = sk("apply")
    error_line(res)
    assert "Local experiment" in res.err or mine[:12] in res.err, res.err
    assert rev(repo, "series") == mine
    assert patches(root) == before

    res = ok(sk("apply", "--force"))
    kept = refs_keeping(repo, mine)
    assert kept and any(ref in res.text for ref in kept), res.text
    assert series_head_subjects(repo) == SUBJECTS
    assert patches(root) == before


def test_a_commit_made_on_a_detached_head_is_kept(sk, root):
    """A commit on no branch at all: the easiest to lose."""
    repo = make_series(sk, root)
    g(repo, "checkout", "-q", "--detach", "HEAD~1")
    mine = commit_file(repo, "vllm/mine.py", "MINE = 1\n", "Detached experiment")
    error_line(sk("apply"), "Detached experiment")
    assert rev(repo, "HEAD") == mine
    res = ok(sk("apply", "--force"))
    kept = refs_keeping(repo, mine)
    assert kept and any(ref in res.text for ref in kept), res.text
    assert series_head_subjects(repo) == SUBJECTS


def test_force_keeps_untracked_files_and_earlier_stashes(sk, root):
    repo = make_series(sk, root)
    (repo / "vllm/__init__.py").write_text("VERSION = 3\n")
    g(repo, "stash", "push", "-q", "-m", "my own stash")
    (repo / "scratch.txt").write_text("my notes\n")
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    error_line(sk("apply"), "scratch.txt")
    assert (repo / "scratch.txt").read_text() == "my notes\n"
    res = ok(sk("apply", "--force"))
    assert "stash" in res.text
    stashes = g(repo, "stash", "list", "--format=%gd %gs").splitlines()
    assert len(stashes) == 2 and any("my own stash" in line for line in stashes), stashes
    found = {
        entry.split()[0]: g(repo, "show", f"{entry.split()[0]}^3:scratch.txt", check=False)
        for entry in stashes
    }
    assert "my notes\n" in found.values(), found
    assert "+VERSION = 2" in stashed_diffs(repo) and "+VERSION = 3" in stashed_diffs(repo)
    assert not (repo / "scratch.txt").exists()


# --- 6: a work-tree folder without .git -------------------------------------


def test_work_tree_folder_without_git(sk, root):
    repo = make_series(sk, root)
    shutil.rmtree(repo / ".git")
    (repo / "notes.txt").write_text("my notes\n")
    res = sk("apply")
    error_line(res)
    assert (repo / "notes.txt").read_text() == "my notes\n"
    assert (repo / "vllm/new.py").read_text() == "NEW = 1\n"
    assert not (repo / ".git").exists()

    res = ok(sk("apply", "--force"))
    moved = [p for p in files_under(root / ".work" / "backup") if p.name == "notes.txt"]
    assert len(moved) == 1 and moved[0].read_text() == "my notes\n"
    assert (moved[0].parent / "vllm" / "new.py").read_text() == "NEW = 1\n"
    assert any(
        named_in(res.text, folder, root)
        for folder in moved[0].parents
        if folder.is_relative_to(root / ".work" / "backup") and folder != root / ".work" / "backup"
    ), res.text
    assert series_head_subjects(work(root)) == SUBJECTS
    assert not (work(root) / "notes.txt").exists()


# --- 7: a patch file cut at a diff boundary ---------------------------------


def test_truncated_last_patch_is_named(sk, root):
    make_series(sk, root)
    (root / "patches" / names(root)[2]).unlink()
    (root / "patches" / "series").write_text("".join(n + "\n" for n in names(root)[:2]))
    ok(sk("apply", "--force"))  # the work tree now holds patches 1-2
    name = truncate_last_diff(root, 1)
    res = sk("apply")
    line = error_line(res, name)
    assert re.search(r"truncat|malformed", line, re.I), line


def test_truncated_middle_patch_is_named_not_a_later_one(sk, root):
    make_series(sk, root)
    name = truncate_last_diff(root, 1)
    shutil.rmtree(root / ".work")
    res = sk("apply")
    line = error_line(res, name)
    assert re.search(r"truncat|malformed", line, re.I), line
    assert names(root)[2] not in res.err


# --- 8: one session at a time -----------------------------------------------

EVERY_COMMAND = [
    ["apply"],
    ["apply", "--force"],
    ["export"],
    ["export", "--check"],
    ["export", "--force"],
    ["status"],
    ["rebase", "vllm==0.0.2"],
    ["rebase", "--continue"],
    ["rebase", "--abort"],
    ["rebase", "--update-pin"],
    ["docs"],
    ["docs", "--check"],
    ["build"],
    ["test"],
    ["lint"],
    ["overlay"],
    ["pr", "--check"],
]


def test_a_held_lock_stops_every_command_at_once(sk, root):
    filelock = pytest.importorskip("filelock")
    repo = make_series(sk, root)
    head, before = rev(repo, "HEAD"), patches(root)
    lock = filelock.FileLock(str(root / ".work" / "lock"))
    lock.acquire(timeout=0)
    try:
        results = cli_process(root, *EVERY_COMMAND)
    finally:
        lock.release()
    for argv, res, secs in results:
        line = error_line(res)
        assert "lock" in line and "another" in line.lower(), (argv, line)
        assert secs < 10, (argv, secs)  # refused at once, not after a wait
    assert rev(repo, "HEAD") == head and patches(root) == before


HOLD_LOCK = """
import sys, time, filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire(timeout=10)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_lock_held_by_another_process_stops_a_session_in_this_one(sk, root):
    pytest.importorskip("filelock")
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(root / ".work" / "lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        for argv in (["apply", "--force"], ["status"], ["export"]):
            line = error_line(sk(*argv))
            assert "lock" in line and "another" in line.lower(), (argv, line)
        assert time.monotonic() - start < 10
    finally:
        holder.communicate("", timeout=30)
    assert rev(repo, "HEAD") == head
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 2\n"
    assert g(repo, "stash", "list") == ""
    ok(sk("status"))  # the holder is gone: the lock is free again


def test_two_applies_started_together(sk, root):
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    script = RUN_CLI.format(repo=str(REPO), root=str(root))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, json.dumps([["apply"]])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)  # both end: no hang
            assert p.returncode == 0, out + err
            results.append(json.loads(out.splitlines()[-1])[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rcs = [rc for _, rc, _, _, _ in results]
    assert 0 in rcs and set(rcs) <= {0, 1}, results
    for _, rc, out, err, _ in results:
        if rc:
            error_line(Result(rc, out, err))
    res = ok(sk("status"))
    assert "matches patches/" in res.out, res.out
    res = ok(sk("apply"))
    assert "up to date" in res.out, res.out
    assert rev(work(root), "HEAD") == good


# --- 9, 10: the pin and the sdist -------------------------------------------


def other_sha(root: Path) -> str:
    pin = base.read_pin(root)
    other = "0123456789abcdef" * 4
    return other if other != pin.sha256 else "f" * 64


def set_pin_sha(root: Path, sha: str) -> None:
    path = root / "pin.toml"
    old = base.read_pin(root).sha256
    path.write_text(path.read_text().replace(old, sha))


def no_download(calls):
    def _download(name, version, dest, *a, **kw):
        calls.append(name)
        raise ToolkitError("the test has no network")

    return _download


def test_pin_sha256_is_checked_on_every_apply(sk, root, cache, monkeypatch):
    make_series(sk, root)
    sdist = cache / "vllm-0.0.1.tar.gz"
    data = sdist.read_bytes()
    calls: list[str] = []
    monkeypatch.setattr(base, "_download", no_download(calls))
    repo = work(root)
    head, before = rev(repo, "HEAD"), patches(root)
    set_pin_sha(root, other_sha(root))
    line = error_line(sk("apply"))
    assert "sha256" in line, line
    assert sdist.read_bytes() == data
    assert rev(repo, "HEAD") == head and patches(root) == before


@pytest.mark.parametrize("download", ["raises", "serves other bytes"])
def test_wrong_pin_sha256_from_scratch_keeps_the_cached_sdist(
    sk, root, cache, monkeypatch, download
):
    sdist = cache / "vllm-0.0.1.tar.gz"
    data = sdist.read_bytes()
    calls: list[str] = []
    if download == "raises":
        monkeypatch.setattr(base, "_download", no_download(calls))
    else:

        def _download(name, version, dest, *a, **kw):
            calls.append(name)
            Path(dest).write_bytes(b"not the sdist either\n")
            return {"sha256": None, "url": "http://example.invalid/x", "size": 21}

        monkeypatch.setattr(base, "_download", _download)
    set_pin_sha(root, other_sha(root))
    assert not (root / ".work").exists()
    error_line(sk("apply"))
    assert sdist.read_bytes() == data
    leftovers = [p.name for p in sdist.parent.iterdir() if p.name.endswith(".part")]
    assert not leftovers


def test_unreachable_index_is_said_so(sk, root, monkeypatch):
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    base.write_pin(root, base.Pin("0.0.9", "a" * 64, None))
    res = sk("apply")
    line = error_line(res)
    assert re.search(r"reach|connect", line, re.I), line
    assert "has no source distribution" not in res.err


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip's index: a folder holding vLLM 0.32.0, 0.33.0 and 0.34.0's sdists (by name)."""
    links = tmp_path / "links"
    links.mkdir()
    for v in ("0.32.0", "0.33.0", "0.34.0"):
        (links / f"vllm-{v}.tar.gz").write_bytes(b"not read\n")
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--check", "vllm==9.9.9"], ["0.34.0, 0.33.0, 0.32.0", "--check vllm==0.34.0`"]),
        (["--check", "vllm==0.34"], ["named in full (0.34.0)", "--check vllm==0.34.0`"]),
        (["vllm==0.34"], ["named in full (0.34.0)", "`nox -s rebase -- vllm==0.34.0`"]),
    ],
)
def test_a_release_without_an_sdist_names_the_ones_there(sk, root, local_index, argv, needles):
    make_series(sk, root)
    error_line(sk("rebase", *argv), "has no source distribution", *needles)
    assert not rebase_recorded(root)


def rebase_recorded(root: Path) -> bool:
    path = root / ".work" / "state.json"
    return bool(json.loads(path.read_text()).get("rebase")) if path.exists() else False


def test_rebase_check_ends_with_the_rebase_that_acts_on_it(sk, root, cache):
    make_series(sk, root)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    add_release(cache, "0.0.3", TWO_CONFLICTS)
    last = ok(sk("rebase", "--check", "vllm==0.0.2")).out.splitlines()[-1]
    assert last.startswith("next: `nox -s rebase -- vllm==0.0.2`"), last
    assert "will not stop" in last
    last = ok(sk("rebase", "--check", "vllm==0.0.2", "vllm==0.0.3")).out.splitlines()[-1]
    assert last.startswith("next: `nox -s rebase -- vllm==0.0.3` (stops at 1 patch(es)"), last
    assert names(root)[0] in last  # the conflict at patch 3 follows from patch 1's
    assert "`nox -s rebase -- vllm==0.0.2`, which will not stop" in last


# --- 11: a rebase with two conflicts ----------------------------------------

TWO_CONFLICTS = {
    **BASE_FILES,
    "vllm/utils.py": UTILS.replace(F0, "def f0():\n    return -1\n").replace(
        F10, "def f10():\n    return -10\n"
    ),
}
RESOLVED = TWO_CONFLICTS["vllm/utils.py"].replace(
    "def f0():\n    return -1\n", "def f0():\n    return 100  # resolved by hand\n"
)


def stop_twice(sk, root: Path, cache: Path) -> tuple[Path, Result]:
    """A rebase onto 0.0.2 stopped at patch 1, resolved by hand, continued,
    and stopped again at patch 3; returns the work tree and the continue's result."""
    repo = work(root)
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    res = sk("rebase", "vllm==0.0.2")
    error_line(res)
    assert SUBJECTS[0] in res.text or names(root)[0] in res.text, res.text
    (repo / "vllm/utils.py").write_text(RESOLVED)
    g(repo, "add", "vllm/utils.py")
    res = sk("rebase", "--continue")
    error_line(res)
    assert SUBJECTS[2] in res.text or names(root)[2] in res.text, res.text
    assert (repo / ".git" / "rebase-merge").exists() or (repo / ".git" / "rebase-apply").exists()
    return repo, res


@pytest.mark.parametrize("which", ["continue", "status"])
def test_second_rebase_stop_says_where_and_how_to_go_on(sk, root, cache, which):
    make_series(sk, root)
    _, res = stop_twice(sk, root, cache)
    said = res.text if which == "continue" else ok(sk("status")).out
    assert "0.0.2" in said
    assert SUBJECTS[2] in said or names(root)[2] in said, said
    assert "rebase -- --continue" in said and "rebase -- --abort" in said, said
    assert "on the pin's base" not in said, said
    assert "nox -s export" not in said and "nox -s apply" not in said, said


def test_rebase_abort_after_two_stops_keeps_the_resolution(sk, root, cache):
    repo = make_series(sk, root)
    old_head, before = rev(repo, "HEAD"), patches(root)
    pin_before = (root / "pin.toml").read_bytes()
    stop_twice(sk, root, cache)
    res = ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == old_head and rev(repo, "series") == old_head
    assert not (repo / ".git" / "rebase-merge").exists()
    assert not (repo / ".git" / "rebase-apply").exists()
    assert g(repo, "status", "--porcelain") == ""
    named = [ref for ref in BACKUP_REF.findall(res.text) if ref in backup_refs(repo)]
    assert named, (res.text, backup_refs(repo))
    assert any(
        "+    return 100  # resolved by hand"
        in g(repo, "log", "-p", "--format=", ref, "--", "vllm/utils.py")
        for ref in named
    ), named
    assert patches(root) == before and (root / "pin.toml").read_bytes() == pin_before
    assert "matches patches/" in ok(sk("status")).out


KILL_REBASE = """
import os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from serieskit import cli, git
real = git.run
def run(repo, *args, **kw):
    if "rebase" in args and "--onto" in args:  # after the first patch: kill it all
        i = args.index("rebase") + 1
        args = (*args[:i], "--exec", f"kill -9 {{os.getpid()}} $PPID", *args[i:])
    return real(repo, *args, **kw)
git.run = run
sys.exit(cli.run(["rebase", "vllm==0.0.2"], Path({root!r})))
"""


def test_rebase_killed_midway_then_abort_goes_back(sk, root, cache):
    """The rebase process and its git rebase SIGKILLed after the first patch
    moved: status advises no export, and --abort goes back to where it started."""
    repo = make_series(sk, root)
    head, before = rev(repo, "HEAD"), patches(root)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_REBASE.format(repo=str(REPO), root=str(root))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (repo / ".git" / "rebase-merge").exists()
    res = ok(sk("status"))
    assert "nox -s export" not in res.out, res.out
    error_line(sk("export"))
    assert patches(root) == before
    ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == head and rev(repo, "series") == head
    assert not (repo / ".git" / "rebase-merge").exists()
    assert patches(root) == before
    assert "up to date" in ok(sk("apply")).out


def test_rebase_continue_before_the_conflict_is_resolved_refuses(sk, root, cache):
    repo = make_series(sk, root)
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    error_line(sk("rebase", "vllm==0.0.2"))
    half = (repo / "vllm/utils.py").read_text() + "# half-way\n"
    (repo / "vllm/utils.py").write_text(half)  # edited, not added
    stopped = rev(repo, "HEAD")
    error_line(sk("rebase", "--continue"), "vllm/utils.py")
    assert (repo / "vllm/utils.py").read_text() == half
    assert rev(repo, "HEAD") == stopped
    assert (repo / ".git" / "rebase-merge").exists() or (repo / ".git" / "rebase-apply").exists()


def test_rebase_over_an_unexported_commit_refuses_then_force_keeps_it(sk, root, cache):
    repo = make_series(sk, root)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    mine = commit_file(repo, "vllm/mine.py", "MINE = 1\n", "Local experiment")
    error_line(sk("rebase", "vllm==0.0.2"), "Local experiment")
    assert rev(repo, "HEAD") == mine and rev(repo, "series") == mine
    res = ok(sk("rebase", "vllm==0.0.2", "--force"))
    kept = refs_keeping(repo, mine)
    assert kept and any(ref in res.text for ref in kept), res.text


# --- 12: after a finished rebase --------------------------------------------

# Upstream changes the context of patch 2: its rebased file differs.
NEAR_PATCH_2 = {**BASE_FILES, "vllm/config/kernel.py": KERNEL.replace("c = 3", "c = 30")}


def test_finished_release_rebase_then_update_pin(sk, root, cache):
    repo = make_series(sk, root)
    before = patches(root)
    sha = add_release(cache, "0.0.2", NEAR_PATCH_2)
    ok(sk("rebase", "vllm==0.0.2"))
    assert patches(root) == before
    res = ok(sk("status"))
    assert "0.0.2" in res.out and "rebase -- --update-pin" in res.out, res.out

    res = ok(sk("rebase", "--update-pin"))
    pin = base.read_pin(root)
    assert (pin.version, pin.sha256) == ("0.0.2", sha)
    assert pin.commit == rev(repo, "refs/series/base/0.0.2")
    after = patches(root)
    assert after[names(root)[1]] != before[names(root)[1]]  # patch 2 written anew
    kept = files_under(root / ".work" / "backup")
    assert any(p.read_bytes() == before[names(root)[1]] for p in kept), kept
    assert "c = 30" in after[names(root)[1]].decode()
    ok(sk("export", "--check"))
    assert "matches patches/" in ok(sk("status")).out


def test_abort_after_a_finished_rebase_names_the_way_back(sk, root, cache):
    """--abort has nothing to abort once a rebase finished: its error names
    the way back to the pin's series and where earlier work is kept."""
    repo = make_series(sk, root)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    ok(sk("rebase", "vllm==0.0.2"))
    head = rev(repo, "HEAD")
    error_line(sk("rebase", "--abort"), "nothing to abort", "apply -- --force", "0.0.2")
    assert rev(repo, "HEAD") == head
    ok(sk("apply", "--force"))  # keeps the rebased commits
    line = error_line(sk("rebase", "--abort"), "nothing to abort", "nox -s status")
    assert "refs/series/backup/" in line and "for-each-ref" in line, line


def make_fork(tmp_path: Path, repo: Path) -> Path:
    """A git repository whose main is the base plus one upstream commit."""
    fork = tmp_path / "fork"
    fork.mkdir()
    g(fork, "init", "-q")
    g(fork, "fetch", "-q", str(repo), "refs/series/base/0.0.1")
    g(fork, "checkout", "-q", "-b", "main", "FETCH_HEAD")
    commit_files(fork, {"setup.py": "print('fork')\n"}, "Fork: setup")
    return fork


def test_finished_fork_rebase_has_no_update_pin(sk, root, tmp_path):
    repo = make_series(sk, root)
    before, pin_before = patches(root), (root / "pin.toml").read_bytes()
    fork = make_fork(tmp_path, repo)
    ok(sk("rebase", f"{fork}@main"))
    assert (repo / "setup.py").read_text() == "print('fork')\n"
    res = ok(sk("status"))
    assert "--update-pin" not in res.out, res.out
    head = rev(repo, "HEAD")
    error_line(sk("rebase", "--update-pin"))
    assert (root / "pin.toml").read_bytes() == pin_before and patches(root) == before
    assert rev(repo, "HEAD") == head


GENERATOR = '''\
"""A stand-in for the series' runtime reference generator."""
import argparse
import sys
from pathlib import Path

SOURCES = ["vllm/config/kernel.py"]
OUTPUT = "docs/design/architecture/runtime_reference.md"

p = argparse.ArgumentParser()
p.add_argument("--root", default=".")
p.add_argument("--check", action="store_true")
a = p.parse_args()
root = Path(a.root)
text = "# Reference\\n\\n" + "".join(
    f"    {line}\\n" for s in SOURCES for line in (root / s).read_text().splitlines())
out = root / OUTPUT
if a.check:
    if out.is_file() and out.read_text() == text:
        sys.exit(0)
    print("--- a/" + OUTPUT + "\\n+++ b/" + OUTPUT)
    sys.exit(1)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(text)
'''


def make_docs_series(sk, root: Path) -> Path:
    """A series whose first patch adds the reference generator and whose
    second changes its source: ``docs`` would amend the second."""
    ok(sk("apply"))
    repo = work(root)
    commit_files(
        repo,
        {"tools/pre_commit/generate_runtime_reference.py": GENERATOR},
        "[CI] Reference generator",
    )
    commit_files(
        repo, {"vllm/config/kernel.py": KERNEL.replace("a = 1", "a = 10")}, "[Core] Change a"
    )
    ok(sk("export"))
    return repo


def test_docs_rewrites_the_series_on_the_pin(sk, root):
    """The control of the next test: on the pin, docs does rewrite."""
    repo = make_docs_series(sk, root)
    head = rev(repo, "HEAD")
    ok(sk("docs"))
    assert rev(repo, "HEAD") != head
    assert "a = 10" in g(repo, "show", "HEAD:docs/design/architecture/runtime_reference.md")


@pytest.mark.parametrize("onto", ["release", "fork"])
def test_docs_on_a_rebased_tree_refuses_before_rewriting(sk, root, cache, tmp_path, onto):
    repo = make_docs_series(sk, root)
    if onto == "release":
        add_release(cache, "0.0.2", NEAR_PATCH_2)
        ok(sk("rebase", "vllm==0.0.2"))
    else:
        ok(sk("rebase", f"{make_fork(tmp_path, repo)}@main"))
    head, before = rev(repo, "HEAD"), patches(root)
    refs = backup_refs(repo)
    error_line(sk("docs"))
    assert rev(repo, "HEAD") == head and rev(repo, "series") == head
    assert patches(root) == before
    assert backup_refs(repo) == refs
    assert g(repo, "status", "--porcelain") == ""


# --- 13: bad input ------------------------------------------------------------


def rewrite_pin(root: Path, how: str) -> None:
    path = root / "pin.toml"
    if how == "integer version":
        path.write_text(path.read_text().replace('version = "0.0.1"', "version = 26"))
    elif how == "missing":
        path.unlink()
    elif how == "not toml":
        path.write_text("[base\nversion = 0.0.1\n")


@pytest.mark.parametrize("command", ["apply", "status", "export"])
@pytest.mark.parametrize("how", ["integer version", "missing", "not toml"])
def test_bad_pin_is_one_error_line(sk, root, how, command):
    make_series(sk, root)
    before = patches(root)
    rewrite_pin(root, how)
    line = error_line(sk(command))
    assert "pin" in line.lower(), line
    assert patches(root) == before


def test_a_pin_cut_in_a_string_is_refused_before_anything_moves(sk, root):
    """Not valid TOML (cut in a string); a pin cut at a line or with a value
    cut short: tests/test_fault_matrix.py's FAULTS."""
    repo = make_series(sk, root)
    (repo / "setup.py").write_text("print('mine')\n")  # what --force would stash
    path = root / "pin.toml"
    text = path.read_text()
    path.write_text(text[: text.index("sha256 =") + 20])
    head, refs = rev(repo, "HEAD"), backup_refs(repo)
    line = error_line(sk("apply", "--force"), "pin.toml")
    assert "not valid TOML" in line, line
    assert rev(repo, "HEAD") == head and backup_refs(repo) == refs
    assert (repo / "setup.py").read_text() == "print('mine')\n"
    assert not g(repo, "stash", "list")


def test_export_with_a_pin_without_its_commit_names_the_difference(sk, root):
    repo = make_series(sk, root)
    path = root / "pin.toml"
    path.write_text(re.sub(r'commit = "[0-9a-f]*"', 'commit = ""', path.read_text()))
    line = error_line(sk("export"), "pin.toml records none", "apply -- --force")
    assert rev(repo, "refs/series/base/0.0.1") in line
    assert "the pin's base on 0.0.1" not in line  # the self-contradicting form


def test_duplicate_series_entry_is_named(sk, root):
    make_series(sk, root)
    first = names(root)[0]
    (root / "patches" / "series").write_text("".join(n + "\n" for n in [*names(root), first]))
    line = error_line(sk("apply"))
    assert first in line, line


def test_missing_series_file_is_an_error(sk, root):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    (root / "patches" / "series").unlink()
    line = error_line(sk("apply"))
    assert "series" in line, line
    assert rev(repo, "HEAD") == head


def test_empty_series_applies_and_says_so(sk, root):
    assert (root / "patches" / "series").read_text() == ""
    res = ok(sk("apply"))
    assert re.search(r"empty|no patch", res.out, re.I), res.out
    assert (work(root) / "vllm/utils.py").read_text() == UTILS


def test_rebase_onto_a_missing_repository(sk, root):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    line = error_line(sk("rebase", "/nonexistent@main"))
    assert "/nonexistent" in line, line
    assert line.isprintable() and "_nonexistent" not in line, line
    assert rev(repo, "HEAD") == head and g(repo, "status", "--porcelain") == ""


def test_build_reports_the_compilers_own_error(sk, root, tmp_path, monkeypatch):
    repo = make_series(sk, root)
    commit_files(
        repo,
        {"csrc/sm7x/x.cu": "__global__ void k(float* x) { x[0] = 1.f; }\n"},
        "[Kernel] A kernel",
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc fatal: boom' >&2\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    res = sk("build")
    error_line(res)
    assert "boom" in res.text, res.text


# --- 14: status without state.json ------------------------------------------


def test_status_without_state_file_still_sees_the_work_tree(sk, root):
    repo = make_series(sk, root)
    (root / ".work" / "state.json").unlink()
    res = sk("status")
    assert "Traceback" not in res.text
    assert "work tree: none" not in res.text, res.text
    assert str(repo) in res.text or ".work/vllm" in res.text


# --- 15: export over hand-edited patches, and a dropped commit --------------


def test_export_over_hand_edited_patches_refuses(sk, root):
    make_series(sk, root)
    path = root / "patches" / names(root)[0]
    edited = path.read_text().replace(
        "Why: because the test says so.", "Why: edited by hand in patches/."
    )
    assert edited != path.read_text()
    path.write_text(edited)
    before = patches(root)
    error_line(sk("export"))
    assert path.read_text() == edited
    assert patches(root) == before


def test_export_after_a_dropped_commit_keeps_the_removed_patch(sk, root):
    repo = make_series(sk, root)
    dropped = names(root)[2]
    old = (root / "patches" / dropped).read_bytes()
    g(repo, "reset", "-q", "--hard", "HEAD~1")
    res = ok(sk("export"))
    assert not (root / "patches" / dropped).exists()
    assert names(root) == names(root)[:2]
    kept = [p for p in files_under(root / ".work" / "backup") if p.read_bytes() == old]
    assert kept, files_under(root / ".work" / "backup")
    assert any(
        named_in(res.text, folder, root)
        for folder in [kept[0], *kept[0].parents]
        if folder.is_relative_to(root / ".work" / "backup") and folder != root / ".work" / "backup"
    ), res.text


def test_export_rewriting_a_patch_keeps_its_previous_version(sk, root):
    repo = make_series(sk, root)
    name = names(root)[2]
    old = (root / "patches" / name).read_bytes()
    g(repo, "commit", "-q", "--amend", "-m", SUBJECTS[2], "-m", "Why: said better.")
    res = ok(sk("export"))
    assert (root / "patches" / name).read_bytes() != old
    assert b"Why: said better." in (root / "patches" / name).read_bytes()
    kept = [p for p in files_under(root / ".work" / "backup") if p.read_bytes() == old]
    assert kept, files_under(root / ".work" / "backup")
    assert any(
        named_in(res.text, folder, root)
        for folder in [kept[0], *kept[0].parents]
        if folder.is_relative_to(root / ".work" / "backup") and folder != root / ".work" / "backup"
    ), res.text


@pytest.mark.parametrize("command", ["status", "apply", "export"])
def test_a_half_written_state_file_is_no_traceback(sk, root, command):
    repo = make_series(sk, root)
    head, before = rev(repo, "HEAD"), patches(root)
    state = root / ".work" / "state.json"
    state.write_text(state.read_text()[:40])
    res = sk(command)
    assert "Traceback" not in res.text
    if res.rc:
        error_line(res)
    assert rev(repo, "series") == head and patches(root) == before


KILL_EXPORT = """
import os, pathlib, signal, sys
sys.path.insert(0, {repo!r})
from serieskit import cli
patches = pathlib.Path({root!r}) / "patches"
real, seen = pathlib.Path.write_bytes, []
def write_bytes(self, data):
    if self.parent == patches and self.name.endswith(".patch"):
        seen.append(self.name)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(self, data)
pathlib.Path.write_bytes = write_bytes
sys.exit(cli.run(["export"], pathlib.Path({root!r})))
"""


def test_export_killed_midway_loses_no_patch(sk, root):
    """Killed as it writes the second of three rewritten patch files: every
    previous version is still in patches/ or under .work/backup/."""
    repo = make_series(sk, root)
    before = patches(root)
    g(
        repo,
        "rebase",
        "-q",
        "--exec",
        "git commit -q --amend -m \"$(git log -1 --format=%s)\" -m 'Why: said again.'",
        "refs/series/base/0.0.1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", KILL_EXPORT.format(repo=str(REPO), root=str(root))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stdout + proc.stderr
    kept = {p.read_bytes() for p in files_under(root / ".work" / "backup")}
    now = set(patches(root).values())
    lost = [name for name, data in before.items() if data not in kept | now]
    assert not lost, lost
    ok(sk("export", "--force"))
    ok(sk("export", "--check"))
    assert all(b"Why: said again." in patches(root)[n] for n in names(root))


# --- 16: apply over the user's work -----------------------------------------


def test_apply_over_an_uncommitted_edit_refuses(sk, root):
    repo = make_series(sk, root)
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    res = sk("apply")
    error_line(res, "vllm/__init__.py")
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 2\n"
    assert g(repo, "stash", "list") == ""


def test_apply_over_a_new_commit_refuses(sk, root):
    repo = make_series(sk, root)
    mine = commit_file(repo, "vllm/mine.py", "MINE = 1\n", "Local experiment")
    res = sk("apply")
    line = error_line(res)
    assert "Local experiment" in res.err or mine[:12] in res.err, (line, res.err)
    assert rev(repo, "series") == mine and rev(repo, "HEAD") == mine


def test_rebase_over_an_uncommitted_edit_refuses_then_force_stashes_it(sk, root, cache):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    error_line(sk("rebase", "vllm==0.0.2"), "vllm/__init__.py")
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 2\n"
    assert rev(repo, "HEAD") == head
    res = ok(sk("rebase", "vllm==0.0.2", "--force"))
    assert "+VERSION = 2" in stashed_diffs(repo)
    assert "stash" in res.text
    assert series_head_subjects(repo, version="0.0.2") == SUBJECTS


# --- where saved work goes: distinct backups in one second -----------------


def test_two_backups_in_the_same_second_get_distinct_refs(sk, root, monkeypatch):
    repo = make_series(sk, root)
    frozen = time.gmtime(1_800_000_000)
    monkeypatch.setattr(time, "gmtime", lambda *a: frozen)
    monkeypatch.setattr(time, "localtime", lambda *a: frozen)
    first = commit_file(repo, "vllm/one.py", "ONE = 1\n", "First experiment")
    ok(sk("apply", "--force"))
    second = commit_file(repo, "vllm/two.py", "TWO = 2\n", "Second experiment")
    ok(sk("apply", "--force"))
    assert refs_keeping(repo, first) and refs_keeping(repo, second)
    assert set(refs_keeping(repo, first)) != set(refs_keeping(repo, second))
    assert len(backup_refs(repo)) >= 2


# =============================================================================
# Nothing is lost, second round: each failure found by trying the toolkit under
# kills at named steps (serieskit.killpoint), process-group kills, a full
# file system and a read-only folder, first as a test.
# =============================================================================

# The command runs as from a terminal: SIGINT raises KeyboardInterrupt. A
# pytest-xdist worker ignores SIGINT, and a child inherits an ignored signal
# (Python then installs no handler of its own), so the kill point's SIGINT
# would pass unnoticed there.
KILLED_CLI = """
import signal
import sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {repo!r})
from serieskit import cli
sys.exit(cli.run({argv!r}, Path({root!r})))
"""

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}


def wait_gone(pgid: int, timeout: float = 30) -> None:
    """Until no process of the group ``pgid`` is left (a killed session's git
    children end on their own time; the user reruns once they have)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {pgid} still runs")


def killed(
    root: Path,
    *argv: str,
    at: str,
    sig: str = "KILL",
    group: bool = False,
    fsize: int | None = None,
) -> Result:
    """Run ``argv`` in a process of its own (its own process group) that
    signals itself at the kill point ``at`` (serieskit.killpoint); assert that
    it was stopped there, not finished."""
    env = {**os.environ, "VLLM_SERIES_KILL_AT": at, "VLLM_SERIES_KILL_SIGNAL": sig}
    if group:
        env["VLLM_SERIES_KILL_GROUP"] = "1"
    if fsize is not None:
        env["VLLM_SERIES_KILL_FSIZE"] = str(fsize)
    code = KILLED_CLI.format(repo=str(REPO), root=str(root), argv=list(argv))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_gone(proc.pid)
    stopped = (-SIGNALS[sig], 130) if sig == "INT" else (-SIGNALS[sig],)
    assert proc.returncode in stopped, (argv, at, proc.returncode, out, err)
    return Result(proc.returncode, out, err)


def stash_count(repo: Path) -> int:
    return len(g(repo, "stash", "list").splitlines())


def saved_anywhere(repo: Path, text: str, res: Result) -> bool:
    """``text`` is in a stash or a backup ref that ``res`` names."""
    named = [ref for ref in BACKUP_REF.findall(res.text) if ref in backup_refs(repo)]
    for ref in named:
        if text in g(repo, "grep", "-h", "-F", text, ref, check=False):
            return True
    if "stash" in res.text:
        for entry in g(repo, "stash", "list", "--format=%gd").split():
            for tree in (entry, f"{entry}^2", f"{entry}^3"):
                if text in g(repo, "grep", "-h", "-F", text, tree, check=False):
                    return True
    return False


# --- 17: --abort keeps every uncommitted change (issue 26, item 1) --------------


def test_rebase_abort_keeps_an_unrelated_edit_and_a_staged_resolution(sk, root, cache):
    repo = make_series(sk, root)
    old_head, before = rev(repo, "HEAD"), patches(root)
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    error_line(sk("rebase", "vllm==0.0.2"))
    (repo / "vllm/utils.py").write_text(RESOLVED)
    g(repo, "add", "vllm/utils.py")  # the resolution, staged, not continued
    (repo / "setup.py").write_text("print('my unrelated edit')\n")
    (repo / "notes.txt").write_text("my notes\n")
    res = ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == old_head and g(repo, "status", "--porcelain") == ""
    for text in ("return 100  # resolved by hand", "my unrelated edit", "my notes"):
        assert saved_anywhere(repo, text, res), (text, res.text)
    assert patches(root) == before


def test_rebase_abort_keeps_a_resolution_over_unresolved_conflicts(sk, root, cache):
    """Half-way: one file resolved in the work tree, the conflict not yet
    marked resolved (git stash refuses such an index)."""
    repo = make_series(sk, root)
    old_head = rev(repo, "HEAD")
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    error_line(sk("rebase", "vllm==0.0.2"))
    (repo / "vllm/utils.py").write_text(RESOLVED)  # not added: still unmerged
    res = ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == old_head and g(repo, "status", "--porcelain") == ""
    assert saved_anywhere(repo, "return 100  # resolved by hand", res), res.text


# The pin also changes f1's line, which the port's release changed too: a conflict.
CARRY_CONFLICT = Edit(
    vllm__utils_DOT_py=lambda t: t.replace("return 0\n", "return 100\n").replace(
        "return 1\n", "return 11\n"
    )
)


def test_carry_abort_keeps_uncommitted_work(capsys, pinport):
    pin, port = pinport
    repo = port.work
    head = rev(repo, "HEAD")
    write_series(pin, pin_patches(CARRY_CONFLICT))
    call = cli_caller(capsys, pin.root)
    error_line(call("carry", PORT), "conflict")
    (repo / "setup.py").write_text("print('my unrelated edit')\n")
    res = ok(call("carry", PORT, "--abort"))
    assert rev(repo, "HEAD") == head and g(repo, "status", "--porcelain") == ""
    assert saved_anywhere(repo, "my unrelated edit", res), res.text


# --- 18: a killed command is recovered by running it again (issue 26, item 2) ----


def test_a_stale_lock_of_a_killed_git_is_cleared_with_a_line(sk, root):
    """Ctrl-C during apply left .git/HEAD.lock (its git killed before it
    cleaned up): no git runs there, so the lock is stale; the rerun says so,
    removes it, and applies."""
    repo = make_series(sk, root)
    path = root / "patches" / names(root)[2]
    path.write_text(path.read_text().replace("Why: because", "Why: since"))
    for lock in ("HEAD.lock", "index.lock", "refs/heads/series.lock"):
        (repo / ".git" / lock).write_text("")
    res = ok(sk("apply"))
    for lock in ("HEAD.lock", "index.lock", "series.lock"):
        assert lock in res.out, res.out
    assert "stale" in res.out.lower() or "removed" in res.out.lower(), res.out
    assert "Why: since" in g(repo, "log", "-1", "--format=%B")


def test_a_lock_of_a_running_git_is_left_alone(sk, root):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    (repo / ".git" / "index.lock").write_text("")
    holder = subprocess.Popen(
        ["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        line = error_line(sk("apply", "--force"), "index.lock")
        assert str(holder.pid) in line, line
        assert (repo / ".git" / "index.lock").exists() and rev(repo, "HEAD") == head
    finally:
        holder.communicate(b"", timeout=30)
    ok(sk("apply"))
    assert not (repo / ".git" / "index.lock").exists()


def test_apply_interrupted_by_ctrl_c_says_so_and_the_rerun_applies(sk, root):
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    res = killed(root, "apply", at="git-am#2", sig="INT")
    assert "Traceback" not in res.text, res.text
    assert res.rc == 130 and res.err.startswith("error: interrupted"), res.err
    ok(sk("apply"))
    assert rev(work(root), "HEAD") == good


@pytest.mark.parametrize("how", ["before its checkout", "inside its checkout"])
@pytest.mark.parametrize("rerun", [["apply"], ["apply", "--force"]])
def test_a_killed_first_checkout_of_the_base_is_redone(sk, root, how, rerun):
    """Killed as apply first checks out a fresh base: HEAD unborn, and
    (inside git) index.lock left and the tree half written."""
    make_series(sk, root)
    good = fresh_apply(sk, root)
    shutil.rmtree(root / ".work")
    if how == "before its checkout":
        killed(root, "apply", at="git-checkout")
    else:
        killed(root, "apply", at="in-git-checkout", fsize=80)
    assert not g(work(root), "rev-parse", "--verify", "-q", "HEAD", check=False)
    res = ok(sk(*rerun))
    assert rev(work(root), "HEAD") == good, res.text
    assert g(work(root), "status", "--porcelain") == ""
    assert "matches patches/" in ok(sk("status")).out


def amend_all(repo: Path, why: str) -> None:
    """The user rewrites every commit message of the series (export rewrites
    every patch file)."""
    g(
        repo,
        "rebase",
        "-q",
        "--exec",
        f"git commit -q --amend -m \"$(git log -1 --format=%s)\" -m '{why}'",
        "refs/series/base/0.0.1",
    )


@pytest.mark.parametrize("at", ["export.written", "write#2"])
def test_an_export_killed_while_it_writes_is_finished_by_running_it_again(sk, root, at):
    """Killed after writing every patch file but before noting it
    (export.written), or between two files (write#2): the rerun finishes
    the export, and apply then finds the series in its patch files."""
    repo = make_series(sk, root)
    before = patches(root)
    amend_all(repo, "Why: said again.")
    head = rev(repo, "HEAD")
    killed(root, "export", at=at)
    if at != "export.written":  # some files written, not all
        said = ok(sk("status")).out
        assert "export was interrupted" in said and "nox -s export" in said, said
        error_line(sk("apply"), "export was interrupted", "nox -s export")
    res = ok(sk("export"))
    assert all(b"Why: said again." in patches(root)[n] for n in names(root)), res.text
    kept = {p.read_bytes() for p in files_under(root / ".work" / "backup")}
    assert all(before[n] in kept for n in names(root))
    assert not [p for p in (root / "patches").iterdir() if p.name.startswith(".")]
    res = ok(sk("apply"))
    assert "up to date" in res.out, res.out
    assert rev(repo, "HEAD") == head


def test_a_half_written_patch_file_never_replaces_a_good_one(sk, root):
    repo = make_series(sk, root)
    amend_all(repo, "Why: said again.")
    killed(root, "export", at="write")  # the first file written aside, not renamed
    now = patches(root)
    for name in names(root):
        assert now[name].endswith(b"\n") and b"Why: because" in now[name], name
    ok(sk("export"))
    assert not [p for p in (root / "patches").iterdir() if p.name.startswith(".")]


# The series of the kill tests inside a rebase step: patch 2 also adds a file
# larger than the kill's file-size limit, so that git dies while writing it.
BIG = "".join(f"# {i:05d} {'abcdefghij' * 6}\n" for i in range(400))
BIG_LIMIT = 8192


def make_big_series(sk, root: Path) -> Path:
    ok(sk("apply"))
    repo = work(root)
    commit_files(repo, {"vllm/utils.py": UTILS.replace(F0, F0_NEW)}, SUBJECTS[0])
    commit_files(
        repo,
        {
            "vllm/config/kernel.py": KERNEL.replace("a = 1", "a = 10"),
            "vllm/new.py": "NEW = 1\n",
            "vllm/big.py": BIG,
        },
        SUBJECTS[1],
    )
    commit_files(
        repo, {"vllm/utils.py": UTILS.replace(F0, F0_NEW).replace(F10, F10_NEW)}, SUBJECTS[2]
    )
    ok(sk("export"))
    return repo


def test_a_rebase_killed_inside_a_step_is_undone_by_abort(sk, root, cache):
    """git dies writing patch 2's big file (a lock and a half-written file
    left), the toolkit with it: --continue says the rebase was interrupted,
    not that it stopped at a conflict; --abort goes back and keeps what it
    found in the work tree; apply and a new rebase then work."""
    repo = make_big_series(sk, root)
    head, before = rev(repo, "HEAD"), patches(root)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    killed(root, "rebase", "vllm==0.0.2", at="in-git-rebase", fsize=BIG_LIMIT)
    said = ok(sk("status")).out
    assert "interrupted" in said and "rebase -- --abort" in said, said
    res = sk("rebase", "--continue")
    error_line(res, "interrupted", "--abort")
    assert "stopped at a conflict" not in res.text, res.text
    res = sk("apply")
    error_line(res, "rebase -- --abort")
    assert "stopped at a conflict" not in res.text, res.text
    res = ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == head and rev(repo, "series") == head
    assert g(repo, "status", "--porcelain") == "", g(repo, "status", "--porcelain")
    assert patches(root) == before
    assert "up to date" in ok(sk("apply")).out
    ok(sk("rebase", "vllm==0.0.2"))
    assert series_head_subjects(repo, version="0.0.2") == SUBJECTS


# A release whose files differ from the base in a big file: the rebase's
# checkout of it dies half-way.
BIG_RELEASE = {**NEAR_PATCH_2, "vllm/huge.py": BIG, "vllm/zz_last.py": "LAST = 1\n"}


def test_a_release_rebase_killed_in_its_checkout_is_undone_by_abort(sk, root, cache):
    repo = make_series(sk, root)
    head, before = rev(repo, "HEAD"), patches(root)
    add_release(cache, "0.0.2", BIG_RELEASE)
    killed(root, "rebase", "vllm==0.0.2", at="in-git-rebase", fsize=BIG_LIMIT)
    error_line(sk("rebase", "--continue"), "interrupted")
    ok(sk("rebase", "--abort"))
    assert rev(repo, "HEAD") == head and g(repo, "status", "--porcelain") == ""
    assert not (repo / "vllm/huge.py").exists()
    assert patches(root) == before
    assert "up to date" in ok(sk("apply")).out


def test_a_rebase_killed_before_git_started_goes_on_with_continue(sk, root, cache):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    killed(root, "rebase", "vllm==0.0.2", at="git-rebase")
    assert rev(repo, "HEAD") == head
    res = sk("rebase", "--continue")
    assert res.rc == 0 or "interrupted" in res.err, res.text
    if res.rc:
        ok(sk("rebase", "--abort"))
        ok(sk("rebase", "vllm==0.0.2"))
    assert series_head_subjects(repo, version="0.0.2") == SUBJECTS
    assert rebase_done(root)


def rebase_done(root: Path) -> bool:
    data = json.loads((root / ".work" / "state.json").read_text())
    return bool(data.get("rebase") and data["rebase"]["done"])


def test_a_carry_killed_while_it_builds_the_pins_side_runs_again(capsys, pinport):
    pin, port = pinport
    write_series(pin, pin_patches(f0(101)))
    killed(pin.root, "carry", PORT, at="git-am")  # in the pin's worktree
    call = cli_caller(capsys, pin.root)
    ok(call("carry", PORT))
    ok(call("carry", PORT, "--check"))
    assert len(g(port.work, "worktree", "list").splitlines()) == 1


# --- 19: the file system's faults are one line (issue 26, item 3) ---------------


def test_ctrl_c_during_the_sdist_download_prints_no_traceback(tmp_path):
    """Ctrl-C reaches the whole process group, the download child included:
    the child ends at once with 130 and prints no traceback of pip's. The
    child is run alone and interrupted at the point where it asks its index
    (a kill point), so that what it prints is its own, not cut by the
    session's kill of it."""
    links = tmp_path / "links"
    links.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(links),
        VLLM_SERIES_KILL_AT="download.asking",
        VLLM_SERIES_KILL_SIGNAL="INT",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "serieskit.series._pipfetch",
            "vllm",
            "0.0.9",
            "vllm-0.0.9.tar.gz",
            str(tmp_path / "dest"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert proc.returncode == 130, (proc.returncode, proc.stderr)


def test_a_cache_that_is_a_file_is_one_line(sk, root, tmp_path, monkeypatch):
    make_series(sk, root)
    shutil.rmtree(root / ".work")
    blocker = tmp_path / "cache-file"
    blocker.write_text("not a folder\n")
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(blocker))
    line = error_line(sk("apply"), str(blocker))
    assert "folder" in line or "directory" in line, line


def test_a_dangling_work_symlink_is_one_line(sk, root, tmp_path):
    make_series(sk, root)
    shutil.rmtree(root / ".work")
    (root / ".work").symlink_to(tmp_path / "gone")
    for argv in (["apply"], ["status"], ["export"]):
        line = error_line(sk(*argv), ".work")
        assert "link" in line, line


def test_an_os_error_anywhere_is_one_line_with_its_path(sk, root, monkeypatch):
    from serieskit.series import export

    make_series(sk, root)

    def denied(*a, **kw):
        raise PermissionError(13, "Permission denied", str(root / "patches" / "series"))

    monkeypatch.setattr(export, "export", denied)
    error_line(sk("export"), str(root / "patches" / "series"), "permission")


NAMESPACE = shutil.which("unshare")


def in_namespace(root: Path, argv: list[str], mounts: str) -> Result:
    """Run ``argv`` on ``root`` in a user and mount namespace of its own, after
    the shell commands ``mounts`` (a read-only bind mount, a small tmpfs)."""
    code = KILLED_CLI.format(repo=str(REPO), root=str(root), argv=argv)
    script = f'{mounts} && exec "$0" -c "$1"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def namespace_or_skip(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    ok_ = (
        NAMESPACE
        and subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=4k tmpfs {probe}"],
            capture_output=True,
        ).returncode
        == 0
    )
    if not ok_:
        pytest.skip("no user and mount namespaces here (unshare -rm): no tmpfs to fill")


def test_a_read_only_patches_folder_is_one_line_and_nothing_changes(sk, root, tmp_path):
    namespace_or_skip(tmp_path)
    repo = make_series(sk, root)
    amend_all(repo, "Why: said again.")
    before = patches(root)
    p = root / "patches"
    res = in_namespace(root, ["export"], f"mount --bind {p} {p} && mount -o remount,ro,bind {p}")
    error_line(res, str(p))
    assert "read-only" in res.err, res.err
    assert patches(root) == before
    ok(sk("export"))


def test_a_full_disk_leaves_no_half_written_patch(sk, root, tmp_path):
    """patches/ on a full tmpfs, the user's change making the last patch
    larger than the room left: what export leaves there is whole (the files
    as they were), and the error names the folder."""
    namespace_or_skip(tmp_path)
    repo = make_series(sk, root)
    before = patches(root)
    big = UTILS.replace(F0, F0_NEW).replace(F10, F10_NEW) + BIG
    commit_files(repo, {"vllm/utils.py": big}, "[Misc] A big one")
    keep, after = tmp_path / "keep", tmp_path / "after"
    shutil.copytree(root / "patches", keep)
    p = root / "patches"
    used = sum(-(-f.stat().st_size // 4096) for f in keep.iterdir()) + 1
    mounts = f"mount -t tmpfs -o size={used * 4}k tmpfs {p} && cp -a {keep}/. {p}/"
    code = KILLED_CLI.format(repo=str(REPO), root=str(root), argv=["export"])
    script = f'{mounts} && "$0" -c "$1"; rc=$?; cp -a {p}/. {after}/; exit $rc'
    after.mkdir()
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    res = Result(proc.returncode, proc.stdout, proc.stderr)
    error_line(res, str(p))
    assert "full" in res.err or "space" in res.err, res.err
    left = {f.name: f.read_bytes() for f in after.iterdir() if f.is_file()}
    assert left == before, sorted(set(left) ^ set(before))


@pytest.mark.parametrize("rerun", [["apply"], ["apply", "--force"]])
def test_a_first_checkout_cut_short_by_a_full_disk_is_finished(sk, root, cache, tmp_path, rerun):
    """The work tree on a tmpfs too small for the base: git's checkout leaves
    hundreds of files empty or cut short, no index, HEAD unborn. Once there is
    room again, a plain apply (or --force) finishes that checkout, saying so."""
    namespace_or_skip(tmp_path)
    many = {**BASE_FILES, **{f"vllm/many/m{i:03d}.py": f"M = {i}\n" * 300 for i in range(300)}}
    sha = add_release(cache, "0.0.3", many)
    commit = base_commit(cache / "vllm-0.0.3.tar.gz", "0.0.3", sha)
    base.write_pin(root, base.Pin("0.0.3", sha, commit))
    repo, after = work(root), tmp_path / "after"
    repo.mkdir(parents=True)
    after.mkdir()
    code = KILLED_CLI.format(repo=str(REPO), root=str(root), argv=["apply"])
    script = (
        f'mount -t tmpfs -o size=300k tmpfs {repo} && "$0" -c "$1"; rc=$?; '
        f"cp -a {repo}/. {after}/; exit $rc"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    error_line(Result(proc.returncode, proc.stdout, proc.stderr))
    repo.rmdir()  # the mount point, empty again out of the namespace
    shutil.copytree(after, repo, symlinks=True)
    assert not g(repo, "rev-parse", "--verify", "-q", "HEAD", check=False)
    empty = [p for p in (repo / "vllm" / "many").iterdir() if p.stat().st_size == 0]
    assert len(empty) > 100, len(empty)
    # What the checkout did not write is not taken for its own: named, left alone.
    (repo / "notes.txt").write_text("my notes\n")
    res = sk(*rerun)
    error_line(res, "notes.txt")
    assert "vllm/many" not in res.err and (repo / "notes.txt").read_text() == "my notes\n"
    (repo / "notes.txt").unlink()
    res = ok(sk(*rerun))
    assert "cut short" in res.out, res.out
    assert rev(repo, "HEAD") == commit and g(repo, "status", "--porcelain") == ""


# --- 20: sessions refuse a half-made tree; pin checks first (issue 26, item 4) -----

READERS = [
    ["pr", "--signoff", "Ada <ada@example.com>"],
    ["overlay"],
    ["wheel", "--no-module"],
    ["build"],
    ["test"],
    ["docs"],
    ["docs", "--check"],
    ["lint"],
]


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:2]))
def test_sessions_refuse_a_stopped_rebase(sk, root, cache, argv):
    make_series(sk, root)
    stop_twice(sk, root, cache)
    error_line(sk(*argv), "rebase -- --continue")


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:2]))
def test_sessions_refuse_a_partial_series(sk, root, argv):
    make_series(sk, root)
    name = break_context(root, 1)
    error_line(sk("apply"), name)
    res = sk(*argv)
    error_line(res, "apply -- --continue")


def test_sessions_refuse_a_killed_apply(sk, root):
    make_series(sk, root)
    shutil.rmtree(root / ".work")
    killed_apply(root, at=2)
    for argv in READERS:
        error_line(sk(*argv), "nox -s apply")


def test_pr_refuses_unexported_work(sk, root):
    repo = make_series(sk, root)
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    error_line(sk(*READERS[0]), "vllm/__init__.py", "export")
    g(repo, "checkout", "--", "vllm/__init__.py")
    commit_file(repo, "vllm/mine.py", "MINE = 1\n", "[Misc] Mine")
    error_line(sk(*READERS[0]), "[Misc] Mine", "export")


def test_apply_force_with_a_wrong_pin_commit_refuses_before_stashing(sk, root):
    repo = make_series(sk, root)
    head = rev(repo, "HEAD")
    (repo / "vllm/__init__.py").write_text("VERSION = 2\n")
    path = root / "pin.toml"
    pin = base.read_pin(root)
    path.write_text(path.read_text().replace(pin.commit or "", "0123456789" * 4))
    error_line(sk("apply", "--force"), "pin")
    assert (repo / "vllm/__init__.py").read_text() == "VERSION = 2\n"
    assert stash_count(repo) == 0 and backup_refs(repo) == []
    assert rev(repo, "HEAD") == head


def test_rebase_continue_leaves_a_rebase_of_the_users_own_alone(sk, root, cache):
    """The toolkit's rebase stopped at a conflict; the user gave it up with
    git and started a rebase of their own, stopped to edit a commit:
    --continue stops, naming it, and does not go on with it."""
    repo = make_series(sk, root)
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    error_line(sk("rebase", "vllm==0.0.2"), "conflict")
    g(repo, "rebase", "--abort")
    env = {**os.environ, **USER, "GIT_CONFIG_GLOBAL": os.devnull}
    env["GIT_SEQUENCE_EDITOR"] = "sed -i 1s/^pick/edit/"
    subprocess.run(["git", "-C", str(repo), "rebase", "-i", "HEAD~2"], check=True, env=env)
    head = rev(repo, "HEAD")
    line = error_line(sk("rebase", "--continue"), "not the rebase", "git -C")
    assert "rebase --abort" in line, line
    assert (repo / ".git" / "rebase-merge").is_dir() and rev(repo, "HEAD") == head


def test_rebase_continue_with_an_unrelated_unstaged_change(sk, root, cache):
    repo = make_series(sk, root)
    add_release(cache, "0.0.2", TWO_CONFLICTS)
    error_line(sk("rebase", "vllm==0.0.2"))
    (repo / "vllm/utils.py").write_text(RESOLVED)
    g(repo, "add", "vllm/utils.py")
    (repo / "setup.py").write_text("print('unrelated')\n")
    stopped = rev(repo, "HEAD")
    res = sk("rebase", "--continue")
    error_line(res, "setup.py")
    assert "recorded resolution" not in res.text and "stopped at a conflict" not in res.text
    assert rev(repo, "HEAD") == stopped
    assert (repo / "setup.py").read_text() == "print('unrelated')\n"
    g(repo, "stash", "push", "-q", "--keep-index")
    res = sk("rebase", "--continue")
    error_line(res)  # the second conflict, at patch 3
    assert SUBJECTS[2] in res.text, res.text
    resolved = json.loads((root / ".work" / "state.json").read_text())["rebase"]["resolved"]
    assert resolved == [SUBJECTS[0]], resolved
