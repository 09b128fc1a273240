"""apply / export / status on a synthetic base: reproducible, idempotent, safe."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from conftest import commit_file, quiet
from serieskit import git as g
from serieskit import series as s
from serieskit.errors import ToolkitError


def make_series(root, changes=None):
    """Apply the empty series, commit ``changes`` in the work tree, export them."""
    s.apply(root, log=quiet)
    repo = s.work_repo(root)
    for path, text, subject in changes or [
        ("vllm/utils.py", "def f0():\n    return 100\n", "[Kernel] Change f0"),
        ("vllm/new.py", "NEW = 1\n", "[Core] Add new module"),
    ]:
        commit_file(repo, path, text, subject)
    s.export(root, log=quiet)
    return repo


def patch_bytes(root):
    return {p.name: p.read_bytes() for p in sorted((root / "patches").iterdir())}


def test_apply_then_export_changes_no_byte(root):
    make_series(root)
    before = patch_bytes(root)
    assert list(before) == ["0001-Kernel-Change-f0.patch", "0002-Core-Add-new-module.patch",
                            "series"]
    text = before["0001-Kernel-Change-f0.patch"].decode()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] [Kernel] Change f0" in text
    assert "\n-- \n" not in text  # no git version signature that drifts
    shutil.rmtree(root / ".work")
    s.apply(root, log=quiet)
    s.export(root, log=quiet)
    assert patch_bytes(root) == before


def fresh_apply(root):
    shutil.rmtree(root / ".work")
    s.apply(root, log=quiet)
    return g.rev(s.work_repo(root), "HEAD")


def test_same_series_same_commit_ids_whatever_the_identity(root, tmp_path, monkeypatch):
    make_series(root)
    fresh_apply(root)
    first = g.rev(s.work_repo(root), "HEAD")
    subjects = [subj for _, subj in g.commits(s.work_repo(root), "HEAD~2..HEAD")]
    assert subjects == ["[Kernel] Change f0", "[Core] Add new module"]  # brackets kept
    other = tmp_path / "other"
    shutil.copytree(root, other, ignore=shutil.ignore_patterns(".work"))
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Mallory")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "1500000000 +0000")
    monkeypatch.setenv("HOME", str(tmp_path))  # no user git config at all
    s.apply(other, log=quiet)
    assert g.rev(s.work_repo(other), "HEAD") == first
    author = g.git(s.work_repo(other), "log", "-1", "--format=%an|%ad|%cn", "--date=raw")
    assert author.strip() == f"Ada|1700000000 +0100|{g.COMMITTER[0]}"


def test_second_apply_is_a_fast_no_op(root):
    make_series(root)
    lines = []
    start = time.monotonic()
    s.apply(root, log=lines.append)
    assert time.monotonic() - start < 5
    assert lines and lines[0].startswith("apply: up to date, 2 patch(es)")


def test_apply_reports_progress(root):
    make_series(root)
    shutil.rmtree(root / ".work")
    lines = []
    s.apply(root, log=lines.append)
    assert "apply 1/2: [Kernel] Change f0" in lines
    assert "apply 2/2: [Core] Add new module" in lines


def test_changed_patch_is_reapplied(root):
    repo = make_series(root)
    old = g.rev(repo, "HEAD")
    p = root / "patches" / "0002-Core-Add-new-module.patch"
    p.write_text(p.read_text().replace("+NEW = 1", "+NEW = 2"))
    s.apply(root, log=quiet)
    assert g.rev(repo, "HEAD") != old
    assert (repo / "vllm/new.py").read_text() == "NEW = 2\n"


def test_apply_refuses_uncommitted_changes(root):
    repo = make_series(root)
    (repo / "vllm/utils.py").write_text("edited\n")
    (repo / "scratch.txt").write_text("notes\n")
    with pytest.raises(ToolkitError) as e:
        s.apply(root, log=quiet)
    msg = str(e.value)
    assert "uncommitted: vllm/utils.py" in msg and "uncommitted: scratch.txt" in msg
    assert "nox -s export" in msg and "stash" in msg
    assert (repo / "vllm/utils.py").read_text() == "edited\n"


def test_apply_refuses_unexported_commits(root):
    repo = make_series(root)
    cid = commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    with pytest.raises(ToolkitError, match=f"commit {cid[:12]} Local experiment"):
        s.apply(root, log=quiet)
    assert g.rev(repo, "HEAD") == cid


def test_force_keeps_the_work_in_a_stash_and_a_backup_ref(root):
    repo = make_series(root)
    cid = commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    (repo / "vllm/utils.py").write_text("edited\n")
    s.apply(root, force=True, log=quiet)
    backups = g.git(repo, "for-each-ref", "--format=%(objectname)", s.BACKUP).split()
    assert backups == [cid]
    assert "saved by --force" in g.git(repo, "stash", "list")
    assert not g.dirty_files(repo)


def test_interrupted_apply_is_detected_and_repaired(root):
    repo = make_series(root)
    good = fresh_apply(root)
    shutil.rmtree(root / ".work")
    # Kill an apply midway through its second patch.
    proc = subprocess.Popen(["python3", "-c", (
        "import sys, os, signal; from pathlib import Path; sys.path.insert(0, %r)\n"
        "from serieskit import series as s, git as g\n"
        "real = g.run\n"
        "def run(repo, *a, **k):\n"
        "    if a[0] == 'am' and s.State.load(Path(%r)).applied == 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(repo, *a, **k)\n"
        "g.run = run\n"
        "s.apply(Path(%r), log=lambda *a: None)\n"
    ) % (str(s.Path(__file__).parent.parent), str(root), str(root))])
    proc.wait()
    assert proc.returncode != 0
    assert s.State.load(root).in_progress == "apply"
    lines = []
    s.apply(root, log=lines.append)
    assert any("interrupted at 1/2; repairing" in line for line in lines)
    assert g.rev(repo, "HEAD") == good


def test_interrupted_git_am_is_repaired(root):
    repo = make_series(root)
    good = fresh_apply(root)
    state = s.State.load(root)
    g.git(repo, "reset", "-q", "--hard", "HEAD~1")
    # A conflicting am left stopped, as after a kill during its 3-way merge.
    (repo / "vllm/new.py").write_text("OTHER = 1\n")
    g.git(repo, "add", "vllm/new.py")
    g.git(repo, "commit", "-q", "-m", "conflicting",
          env={"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com"})
    g.run(repo, "am", "--3way", str(root / "patches" / "0002-Core-Add-new-module.patch"))
    assert g.operation_in_progress(repo) == "am"
    state.in_progress, state.head = "apply", g.rev(repo, "HEAD")
    state.save(root)
    s.apply(root, log=quiet)
    assert g.operation_in_progress(repo) is None
    assert g.rev(repo, "HEAD") == good


def test_patch_that_does_not_apply_is_a_clear_error(root):
    make_series(root)
    p = root / "patches" / "0001-Kernel-Change-f0.patch"
    p.write_text(p.read_text().replace(" def f0():", " def nothere():")
                 .replace("index ", "index-broken "))
    shutil.rmtree(root / ".work")
    with pytest.raises(ToolkitError) as e:
        s.apply(root, log=quiet)
    msg = str(e.value)
    assert "patch 0001-Kernel-Change-f0.patch (1/2) does not apply" in msg
    assert "holds patches 1-0 only" in msg and "\n" not in msg
    state = s.State.load(root)
    assert state.failed == "0001-Kernel-Change-f0.patch" and not state.in_progress
    lines = []
    s.status(root, log=lines.append)
    assert any("the last apply stopped at 0001-Kernel-Change-f0.patch" in x for x in lines)


def test_status_names_differences_and_uncommitted_files(root):
    repo = make_series(root)
    lines = []
    info = s.status(root, log=lines.append)
    assert info["differ"] == [] and "patches:   the work tree matches patches/" in lines
    commit_file(repo, "vllm/x.py", "X = 1\n", "Local experiment")
    (repo / "vllm/utils.py").write_text("edited\n")
    lines = []
    info = s.status(root, log=lines.append)
    assert info["differ"] == ["0003-Local-experiment.patch"]
    assert any(line.startswith("  + ") and "Local experiment" in line for line in lines)
    assert info["uncommitted"] == [" M vllm/utils.py"]


def test_export_writes_series_and_removes_dropped_patches(root):
    repo = make_series(root)
    g.git(repo, "reset", "-q", "--hard", "HEAD~1")
    changed = s.export(root, log=quiet)
    assert changed == []
    assert (root / "patches" / "series").read_text() == "0001-Kernel-Change-f0.patch\n"
    assert not (root / "patches" / "0002-Core-Add-new-module.patch").exists()


def test_manifest_problems_are_named(root):
    make_series(root)
    (root / "patches" / "manifest.toml").write_text(
        '[[patch]]\nfile = "0001-Kernel-Change-f0.patch"\nseed = "1"\nsummary = "x"\n'
        'config = []\ntests = []\n'
        '[[patch]]\nfile = "0009-gone.patch"\n')
    problems = s.manifest_problems(root)
    assert "0002-Core-Add-new-module.patch has no entry in patches/manifest.toml" in problems
    assert "patches/manifest.toml lists 0009-gone.patch, which is not in the series" in problems
    assert any("0009-gone.patch lacks seed" in p for p in problems)


def test_series_naming_a_missing_file_is_an_error(root):
    (root / "patches" / "series").write_text("0001-missing.patch\n")
    with pytest.raises(ToolkitError, match="names 0001-missing.patch, which does not exist"):
        s.apply(root, log=quiet)
