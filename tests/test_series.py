"""apply / export / status on a synthetic base: reproducible, idempotent, safe."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import commit_file, quiet
from serieskit import git, status
from serieskit.errors import ToolkitError
from serieskit.series import apply, export, safety, series
from serieskit.state import State


def make_series(root, changes=None):
    """Apply the empty series, commit ``changes`` in the work tree, export them."""
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    for path, text, subject in changes or [
        ("vllm/utils.py", "def f0():\n    return 100\n", "[Kernel] Change f0"),
        ("vllm/new.py", "NEW = 1\n", "[Core] Add new module"),
    ]:
        commit_file(repo, path, text, subject)
    export.export(root, log=quiet)
    return repo


def patch_bytes(root):
    return {p.name: p.read_bytes() for p in sorted((root / "patches").iterdir())}


def test_apply_then_export_changes_no_byte(root):
    make_series(root)
    before = patch_bytes(root)
    assert list(before) == [
        "0001-Kernel-Change-f0.patch",
        "0002-Core-Add-new-module.patch",
        "series",
    ]
    text = before["0001-Kernel-Change-f0.patch"].decode()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] [Kernel] Change f0" in text
    assert "\n-- \n" not in text  # no git version signature that drifts
    shutil.rmtree(root / ".work")
    apply.apply(root, log=quiet)
    export.export(root, log=quiet)
    assert patch_bytes(root) == before


def fresh_apply(root):
    shutil.rmtree(root / ".work")
    apply.apply(root, log=quiet)
    return git.rev(series.work_repo(root), "HEAD")


def test_same_series_same_commit_ids_whatever_the_identity(root, tmp_path, monkeypatch):
    make_series(root)
    fresh_apply(root)
    first = git.rev(series.work_repo(root), "HEAD")
    subjects = [subj for _, subj in git.commits(series.work_repo(root), "HEAD~2..HEAD")]
    assert subjects == ["[Kernel] Change f0", "[Core] Add new module"]  # brackets kept
    other = tmp_path / "other"
    shutil.copytree(root, other, ignore=shutil.ignore_patterns(".work"))
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Mallory")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "1500000000 +0000")
    monkeypatch.setenv("HOME", str(tmp_path))  # no user git config at all
    apply.apply(other, log=quiet)
    assert git.rev(series.work_repo(other), "HEAD") == first
    author = git.git(series.work_repo(other), "log", "-1", "--format=%an|%ad|%cn", "--date=raw")
    assert author.strip() == f"Ada|1700000000 +0100|{git.COMMITTER[0]}"


def test_second_apply_is_a_fast_no_op(root):
    make_series(root)
    lines = []
    start = time.monotonic()
    apply.apply(root, log=lines.append)
    assert time.monotonic() - start < 5
    assert lines and lines[0].startswith("apply: up to date, 2 patch(es)")


def test_apply_reports_progress(root):
    make_series(root)
    shutil.rmtree(root / ".work")
    lines = []
    apply.apply(root, log=lines.append)
    assert "apply 1/2: [Kernel] Change f0" in lines
    assert "apply 2/2: [Core] Add new module" in lines


def test_changed_patch_is_reapplied(root):
    repo = make_series(root)
    old = git.rev(repo, "HEAD")
    p = root / "patches" / "0002-Core-Add-new-module.patch"
    p.write_text(p.read_text().replace("+NEW = 1", "+NEW = 2"))
    apply.apply(root, log=quiet)
    assert git.rev(repo, "HEAD") != old
    assert (repo / "vllm/new.py").read_text() == "NEW = 2\n"


def test_apply_refuses_uncommitted_changes(root):
    repo = make_series(root)
    (repo / "vllm/utils.py").write_text("edited\n")
    (repo / "scratch.txt").write_text("notes\n")
    with pytest.raises(ToolkitError) as e:
        apply.apply(root, log=quiet)
    msg = str(e.value)
    assert "uncommitted: vllm/utils.py" in msg and "uncommitted: scratch.txt" in msg
    assert "nox -s export" in msg and "stash" in msg
    assert (repo / "vllm/utils.py").read_text() == "edited\n"


def test_apply_refuses_unexported_commits(root):
    repo = make_series(root)
    cid = commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    with pytest.raises(ToolkitError, match=f"commit {cid[:12]} Local experiment"):
        apply.apply(root, log=quiet)
    assert git.rev(repo, "HEAD") == cid


def test_force_keeps_the_work_in_a_stash_and_a_backup_ref(root):
    repo = make_series(root)
    cid = commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    (repo / "vllm/utils.py").write_text("edited\n")
    apply.apply(root, force=True, log=quiet)
    backups = git.git(repo, "for-each-ref", "--format=%(objectname)", safety.BACKUP_REF).split()
    assert backups == [cid]
    assert "saved by apply --force" in git.git(repo, "stash", "list")
    assert not git.dirty_files(repo)


def test_interrupted_apply_is_detected_and_repaired(root):
    repo = make_series(root)
    good = fresh_apply(root)
    shutil.rmtree(root / ".work")
    # Kill an apply midway through its second patch.
    repo_dir = str(Path(__file__).parent.parent)
    proc = subprocess.Popen(
        [
            "python3",
            "-c",
            (
                "import sys, os, signal; from pathlib import Path\n"
                f"sys.path.insert(0, {repo_dir!r})\n"
                "from serieskit import git\n"
                "from serieskit.series import apply\n"
                "from serieskit.state import State\n"
                "real = git.run\n"
                "def run(repo, *a, **k):\n"
                f"    if a[0] == 'am' and State.load(Path({str(root)!r})).applied == 1:\n"
                "        os.kill(os.getpid(), signal.SIGKILL)\n"
                "    return real(repo, *a, **k)\n"
                "git.run = run\n"
                f"apply.apply(Path({str(root)!r}), log=lambda *a: None)\n"
            ),
        ]
    )
    proc.wait()
    assert proc.returncode != 0
    assert State.load(root).in_progress == "apply"
    lines = []
    apply.apply(root, log=lines.append)
    assert any("interrupted at 1/2; applying again" in line for line in lines)
    assert git.rev(repo, "HEAD") == good


def test_interrupted_git_am_stopped_at_a_conflict_is_left_to_the_user(root):
    """Its own am of patch 2, stopped at a conflict and left so (killed before
    it aborted it): the unmerged file may hold a resolution under way, which
    `git am --abort` would drop, so apply stops, naming it and the ways on;
    once the user has aborted the am, apply repairs the tree."""
    repo = make_series(root)
    good = fresh_apply(root)
    state = State.load(root)
    git.git(repo, "reset", "-q", "--hard", "HEAD~1")
    (repo / "vllm/new.py").write_text("OTHER = 1\n")
    git.git(repo, "add", "vllm/new.py")
    git.git(
        repo,
        "commit",
        "-q",
        "-m",
        "conflicting",
        env={"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com"},
    )
    git.run(repo, "am", "--3way", str(root / "patches" / "0002-Core-Add-new-module.patch"))
    assert git.operation_in_progress(repo) == "am"
    state.in_progress, state.head, state.applied = "apply", git.rev(repo, "HEAD"), 1
    state.save(root)
    with pytest.raises(ToolkitError, match="unmerged paths .*vllm/new.py.* am --abort"):
        apply.apply(root, log=quiet)
    assert git.operation_in_progress(repo) == "am"
    git.git(repo, "am", "--abort")
    apply.apply(root, log=quiet)
    assert git.operation_in_progress(repo) is None
    assert git.rev(repo, "HEAD") == good


def test_patch_that_does_not_apply_is_a_clear_error(root):
    make_series(root)
    p = root / "patches" / "0001-Kernel-Change-f0.patch"
    p.write_text(
        p.read_text().replace(" def f0():", " def nothere():").replace("index ", "index-broken ")
    )
    shutil.rmtree(root / ".work")
    with pytest.raises(ToolkitError) as e:
        apply.apply(root, log=quiet)
    first, *ways = str(e.value).splitlines()
    assert "patch 0001-Kernel-Change-f0.patch (1/2) does not apply" in first
    assert "holds patches 1-0 only" in first
    # Then, indented, both ways on: fix the file, or finish the patch by hand.
    assert ways and all(line.startswith("  ") for line in ways)
    assert "then `nox -s apply`" in ways[0]
    assert any("am -3 --keep-non-patch" in line for line in ways)
    assert any("nox -s apply -- --continue" in line for line in ways)
    state = State.load(root)
    assert state.failed == "0001-Kernel-Change-f0.patch" and not state.in_progress
    lines = []
    status.status(root, log=lines.append)
    assert any("the last apply stopped at patches/0001-Kernel-Change-f0.patch" in x for x in lines)
    assert not any("nox -s export" in x for x in lines)


def test_status_names_differences_and_uncommitted_files(root):
    repo = make_series(root)
    lines = []
    info = status.status(root, log=lines.append)
    assert info["differ"] == [] and "patches:   the work tree matches patches/" in lines
    commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    (repo / "vllm/utils.py").write_text("edited\n")
    lines = []
    info = status.status(root, log=lines.append)
    assert info["differ"] == ["0003-Local-experiment.patch"]
    assert any(line.startswith("  + ") and "Local experiment" in line for line in lines)
    assert info["uncommitted"] == [" M vllm/utils.py"]


def test_export_writes_series_and_removes_dropped_patches(root):
    repo = make_series(root)
    git.git(repo, "reset", "-q", "--hard", "HEAD~1")
    changed = export.export(root, log=quiet)
    assert changed == []
    assert (root / "patches" / "series").read_text() == "0001-Kernel-Change-f0.patch\n"
    assert not (root / "patches" / "0002-Core-Add-new-module.patch").exists()


def test_manifest_entries_are_tied_to_commits_by_trailer(root):
    repo = make_series(root)
    before = patch_bytes(root)
    state = State.load(root)
    git.git(repo, "reset", "-q", "--hard", state.base)
    author = {"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com"}
    for path, subject, name in [
        ("vllm/utils.py", "[Kernel] Change f0", "f0"),
        ("vllm/new.py", "[Core] Add new module", None),
    ]:
        (repo / path).write_text(f"# {subject}\n")
        git.git(repo, "add", path)
        trailer = ["-m", f"{series.NAME_TRAILER}: {name}"] if name else []
        git.git(repo, "commit", "-q", "-m", subject, "-m", "Why: a test.", *trailer, env=author)
    entry = 'seed = "1"\nsummary = "x"\nconfig = []\ntests = []\n'
    (root / "patches" / "manifest.toml").write_text(
        f'[[patch]]\nname = "f0"\n{entry}[[patch]]\nname = "gone"\n{entry}'
        '[[patch]]\nname = "partial"\n'
    )
    with pytest.raises(ToolkitError) as e:
        export.export(root, log=quiet)
    msg = str(e.value)
    assert "nothing written" in msg
    assert '"[Core] Add new module" has no Patch-Name: trailer' in msg
    assert "has an entry gone that no commit names" in msg
    assert "entry partial lacks seed, summary, config, tests" in msg
    after = patch_bytes(root)
    del after["manifest.toml"]
    assert after == before  # a stale manifest fails before writing


def test_series_naming_a_missing_file_is_an_error(root):
    (root / "patches" / "series").write_text("0001-missing.patch\n")
    with pytest.raises(ToolkitError, match="names 0001-missing.patch, which does not exist"):
        apply.apply(root, log=quiet)


def test_status_reminds_to_commit_what_export_wrote(root):
    """After an export, patches/ (and pin.toml) differ from what this
    repository has committed: status says so, with the command."""
    repo = make_series(root)
    lines: list[str] = []
    info = status.status(root, log=lines.append)
    assert "unpublished" not in info  # no git repository here: nothing to commit
    assert not any(x.startswith("to commit:") for x in lines)
    ident = {"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com"}
    git.git(root, "init", "-q")
    (root / ".gitignore").write_text(".work/\n")
    git.git(root, "add", "-A")
    git.git(root, "commit", "-q", "-m", "The series", env=ident)
    lines = []
    assert status.status(root, log=lines.append)["unpublished"] == []
    assert not any(x.startswith("to commit:") for x in lines)
    commit_file(repo, "vllm/x.py", "X = 1\n", "[Misc] Local experiment")
    export.export(root, log=quiet)
    lines = []
    info = status.status(root, log=lines.append)
    assert "patches:   the work tree matches patches/" in lines
    assert info["unpublished"] == [
        " M patches/series",
        "?? patches/0003-Misc-Local-experiment.patch",
    ]
    at = lines.index(next(x for x in lines if x.startswith("to commit:")))
    assert lines[at] == (
        f"to commit: 2 change(s) to patches/ not committed in this repository ({root}): "
        "others apply what it has committed; `git add patches/ && git commit`"
    )
    assert lines[at + 1 :] == [
        "   M patches/series",
        "  ?? patches/0003-Misc-Local-experiment.patch",
    ]
    # pin.toml too; a long list is cut, with the command that shows it whole.
    (root / "pin.toml").write_text((root / "pin.toml").read_text() + "# moved\n")
    for i in range(12):
        (root / "patches" / f"note{i:02}.txt").write_text("x\n")
    lines = []
    status.status(root, log=lines.append)
    at = lines.index(next(x for x in lines if x.startswith("to commit:")))
    assert lines[at].endswith("`git add patches/ pin.toml && git commit`")
    assert len(lines[at + 1 :]) == 11
    assert lines[-1] == "  ... and 5 more (`git status -- patches pin.toml`)"
