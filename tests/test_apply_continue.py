"""``apply --continue``: an apply stopped at a patch that does not apply, the
patch finished by hand in the work tree (``git am -3``, resolve, ``git am
--continue``; or edit and commit), then the rest of the series applied on it
and export writing the patch as the user made it. Every refusal changes
nothing: not the work tree, its refs, its state, nor patches/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import (
    F10,
    F10_NEW,
    KERNEL,
    REPO,
    SUBJECTS,
    USER,
    UTILS,
    break_context,
    cli_caller,
    commit_files,
    error_line,
    g,
    make_series,
    names,
    ok,
    patches,
    rev,
    series_head_subjects,
    work,
)

from serieskit.state import State

A5 = KERNEL.replace("a = 1", "a = 5")  # kernel.py where patch 2 was written
A11 = KERNEL.replace("a = 1", "a = 11")  # the user's resolution of the conflict


@pytest.fixture
def sk(capsys, root):
    return cli_caller(capsys, root)


# --- helpers ----------------------------------------------------------------


def written_elsewhere(root: Path, repo: Path) -> str:
    """Rewrite patch 2 as if made on a tree whose kernel.py said ``a = 5``
    (that blob in the work tree's objects, as after a fetch): on the base's
    ``a = 1``, ``git am --3way`` stops with conflict markers. Its file name."""
    name = names(root)[1]
    path = root / "patches" / name
    old_blob = g(repo, "rev-parse", "refs/series/base/0.0.1:vllm/config/kernel.py").strip()
    new_blob = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
        input=A5,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    text = path.read_text()
    assert f"index {old_blob}.." in text and "\n-    a = 1\n" in text, text
    path.write_text(
        text.replace(f"index {old_blob}..", f"index {new_blob}..").replace(
            "\n-    a = 1\n", "\n-    a = 5\n"
        )
    )
    return name


def stopped_at_2(sk, root: Path) -> tuple[Path, str, str]:
    """The three-patch series with patch 2 conflicting with the base; apply
    stops there. The work tree, patch 2's file name, the error text."""
    repo = make_series(sk, root)
    name = written_elsewhere(root, repo)
    res = sk("apply")
    error_line(res, name, "(2/3) does not apply", "conflict in vllm/config/kernel.py")
    return repo, name, res.err


def user_git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """git as the user runs it in the work tree; the caller reads the result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(USER, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_EDITOR="true")
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)


def am_stopped(root: Path, repo: Path, name: str, *flags: str) -> None:
    """``git am -3`` of the stopped patch, as the stop message says: it stops at the conflict."""
    proc = user_git(repo, "am", "-3", *flags, str(root / "patches" / name))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "<<<<<<<" in (repo / "vllm/config/kernel.py").read_text()


def resolve_by_hand(root: Path, repo: Path, name: str, keep_tags: bool = True) -> str:
    """``git am -3`` the stopped patch (``--keep-non-patch`` as the stop
    message says), resolve its conflict (``a = 11``), ``git am --continue``:
    the user's commit for patch 2."""
    am_stopped(root, repo, name, *(["--keep-non-patch"] if keep_tags else []))
    (repo / "vllm/config/kernel.py").write_text(A11)
    g(repo, "add", "vllm/config/kernel.py")
    proc = user_git(repo, "am", "--continue")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return rev(repo, "HEAD")


def snapshot(root: Path) -> dict:
    """Everything a refusal must leave as it was."""
    repo = work(root)
    am_dir = repo / ".git" / "rebase-apply"
    return {
        "head": rev(repo, "HEAD"),
        "on": g(repo, "symbolic-ref", "-q", "HEAD", check=False).strip(),
        "refs": g(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "status": g(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "stash": g(repo, "stash", "list"),
        "files": {
            p.relative_to(repo).as_posix(): p.read_bytes()
            for p in sorted(repo.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(repo).parts
        },
        "am": sorted(p.name for p in am_dir.iterdir()) if am_dir.exists() else None,
        "state": (root / ".work" / "state.json").read_bytes(),
        "patches": patches(root),
        "backups": sorted((root / ".work" / "backup").glob("*"))
        if (root / ".work" / "backup").exists()
        else [],
    }


def refused(sk, root: Path, *needles: str) -> str:
    """``apply --continue`` refuses in one error line and changes nothing."""
    before = snapshot(root)
    res = sk("apply", "--continue")
    error_line(res, *needles)
    assert snapshot(root) == before
    return res.err


# --- the way through ----------------------------------------------------------


def test_stopped_patch_finished_by_hand_then_continue_and_export(sk, root):
    repo, name, err = stopped_at_2(sk, root)
    path = root / "patches" / name
    # The stop names both ways on.
    assert f"git -C {repo} am -3 --keep-non-patch {path}" in err
    assert "nox -s apply -- --continue" in err and "applies patches 3-3" in err
    assert "fix the patch file, then `nox -s apply`" in err
    res = ok(sk("status"))
    assert name in res.out and "nox -s apply -- --continue" in res.out
    assert "nox -s export" not in res.out
    before = patches(root)

    hand = resolve_by_hand(root, repo, name)
    error_line(sk("export"), name, "--continue")  # still stopped: export refuses
    assert patches(root) == before

    res = ok(sk("apply", "--continue"))
    assert "apply --continue 2/3: [Core] Two files" in res.out
    assert "apply 3/3: [Misc] Change f10" in res.out
    assert f"finished by hand: patches/{name}" in res.out and "nox -s export" in res.out
    assert series_head_subjects(repo) == SUBJECTS
    assert rev(repo, "HEAD~1") == hand
    assert (repo / "vllm/config/kernel.py").read_text() == A11
    assert F10_NEW in (repo / "vllm/utils.py").read_text()
    assert State.load(root).complete and not g(repo, "status", "--porcelain")
    assert patches(root) == before  # continue writes no patch file
    res = ok(sk("status"))
    assert f"finished by hand after a stopped apply: patches/{name}" in res.out

    res = ok(sk("export"))
    assert f"wrote patches/{name}" in res.out and "1 written, 0 removed" in res.out
    after = patches(root)
    assert "\n-    a = 1\n+    a = 11\n" in after[name].decode()  # as resolved, on the base
    assert {k: v for k, v in after.items() if k != name} == {
        k: v for k, v in before.items() if k != name
    }
    kept = [p for p in (root / ".work" / "backup").rglob(name)]
    assert [p.read_bytes() for p in kept] == [before[name]]  # the conflicting version kept
    ok(sk("apply"))  # up to date now
    assert ok(sk("export", "--check"))

    # The exported series is what the tree held: applied from scratch, the same files.
    files = {p: (repo / p).read_text() for p in ("vllm/config/kernel.py", "vllm/utils.py")}
    shutil.rmtree(root / ".work")
    ok(sk("apply"))
    assert {p: (repo / p).read_text() for p in files} == files
    assert series_head_subjects(repo) == SUBJECTS


def test_patch_edited_and_committed_by_hand_keeps_its_name_trailer(sk, root):
    """Without git am: the files edited and committed. A series with
    Patch-Name trailers needs the commit to carry the stopped patch's."""
    repo = make_series(sk, root)
    name = written_elsewhere(root, repo)
    path = root / "patches" / name
    path.write_text(path.read_text().replace("says so.\n", "says so.\n\nPatch-Name: two\n", 1))
    error_line(sk("apply"), name)
    commit_files(repo, {"vllm/config/kernel.py": A11, "vllm/new.py": "NEW = 1\n"}, SUBJECTS[1])
    err = refused(sk, root, "Patch-Name: trailer is two", "commit --amend --trailer")
    assert "'Patch-Name: two'" in err
    g(repo, "commit", "-q", "--amend", "--no-edit", "--trailer", "Patch-Name: two")
    ok(sk("apply", "--continue"))
    assert series_head_subjects(repo) == SUBJECTS
    ok(sk("export"))
    assert "Patch-Name: two" in (root / "patches" / name).read_text()


def test_plain_git_am_dropping_the_subject_tag_is_caught(sk, root):
    """git am without --keep-non-patch makes "[Core] Two files" "Two files",
    and export would rename the patch: refused with the cause and the way out."""
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name, keep_tags=False)
    assert g(repo, "log", "-1", "--format=%s").strip() == "Two files"
    refused(sk, root, '"[Core] Two files"', "--keep-non-patch", "commit --amend")
    body = g(repo, "log", "-1", "--format=%b")
    g(repo, "commit", "-q", "--amend", "-m", SUBJECTS[1], "-m", body)
    ok(sk("apply", "--continue"))
    assert series_head_subjects(repo) == SUBJECTS


def test_a_later_conflict_stops_again_and_continue_goes_on_from_there(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    third = break_context(root, 2)
    hand = resolve_by_hand(root, repo, name)
    res = sk("apply", "--continue")
    err = error_line(res, third, "(3/3) does not apply", "nox -s apply -- --continue")
    assert "fix the patch file" not in res.err  # apply would refuse over the commit by hand
    assert "takes your one commit as this patch;" in res.err  # the last one: no more to apply
    assert rev(repo, "HEAD") == hand
    res = ok(sk("status"))
    assert third in res.out and "--continue" in res.out
    # The patch finished by hand is the user's work: a plain apply refuses over it.
    before = snapshot(root)
    error_line(sk("apply"), hand[:12], "nox -s apply -- --continue", "nox -s export")
    assert snapshot(root) == before
    assert err.startswith("error: patch ")

    # Patch 3 by hand too: its context is broken, so git am stops without markers.
    proc = user_git(repo, "am", "-3", "--keep-non-patch", str(root / "patches" / third))
    assert proc.returncode != 0 and (repo / ".git" / "rebase-apply").is_dir()
    refused(sk, root, "git am is in progress", "am --continue")
    (repo / "vllm/utils.py").write_text(
        UTILS.replace("return 0\n", "return 100\n", 1).replace(F10, F10_NEW)
    )
    g(repo, "add", "vllm/utils.py")
    assert user_git(repo, "am", "--continue").returncode == 0
    res = ok(sk("apply", "--continue"))
    assert f"patches/{name}, patches/{third}" in res.out
    assert series_head_subjects(repo) == SUBJECTS
    res = ok(sk("export"))
    assert f"wrote patches/{name}" in res.out and f"wrote patches/{third}" in res.out
    assert " def f11():\n" in (root / "patches" / third).read_text()  # the context as it is


@pytest.mark.parametrize("when", ["before", "after"])
def test_continue_killed_midway_goes_on(sk, root, when):
    """A real ``apply --continue`` process SIGKILLed at patch 3 (before its git
    am, or right after its commit): export refuses, a plain apply refuses over
    the patch finished by hand, and ``apply --continue`` again finishes."""
    repo, name, _ = stopped_at_2(sk, root)
    hand = resolve_by_hand(root, repo, name)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_CONTINUE.format(repo=str(REPO), root=str(root), when=when)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert State.load(root).in_progress == "continue"
    error_line(sk("export"), "apply --continue")
    res = ok(sk("status"))
    assert "an apply --continue was interrupted" in res.out
    error_line(sk("apply"), hand[:12])
    assert rev(repo, "HEAD~1" if when == "after" else "HEAD") == hand
    res = ok(sk("apply", "--continue"))
    assert series_head_subjects(repo) == SUBJECTS and rev(repo, "HEAD~1") == hand
    assert State.load(root).complete
    ok(sk("export"))


def test_continue_killed_inside_its_stopped_git_am_goes_on(sk, root):
    """Killed between its git am's failure (patch 3 does not apply) and the
    abort: the am left stopped is the toolkit's, which the rerun aborts, and
    patch 3 stops it as it should have."""
    repo, name, _ = stopped_at_2(sk, root)
    third = break_context(root, 2)
    hand = resolve_by_hand(root, repo, name)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_CONTINUE.format(repo=str(REPO), root=str(root), when="after")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (repo / ".git" / "rebase-apply").is_dir() and rev(repo, "HEAD") == hand
    res = sk("apply", "--continue")
    error_line(res, third, "(3/3) does not apply")
    assert "interrupted" in res.out
    assert not (repo / ".git" / "rebase-apply").exists() and rev(repo, "HEAD") == hand
    assert State.load(root).failed == third


KILL_CONTINUE = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from serieskit import cli, git
real = git.run
def run(repo, *args, **kw):
    if args and args[0] == "am" and any(str(a).endswith(".patch") for a in args):
        if {when!r} == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        proc = real(repo, *args, **kw)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(repo, *args, **kw)
git.run = run
sys.exit(cli.run(["apply", "--continue"], Path({root!r})))
"""


# --- refusals: nothing changes ---------------------------------------------------


def test_continue_while_the_users_git_am_is_stopped(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    am_stopped(root, repo, name, "--keep-non-patch")
    (repo / "vllm/config/kernel.py").write_text(A11)  # half-way: resolved, not added
    err = refused(sk, root, "git am is in progress", "conflicts in vllm/config/kernel.py")
    assert f"git -C {repo} am --continue" in err and "am --abort" in err
    g(repo, "add", "vllm/config/kernel.py")
    assert user_git(repo, "am", "--continue").returncode == 0
    ok(sk("apply", "--continue"))


def test_continue_over_uncommitted_changes(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name)
    (repo / "vllm/utils.py").write_text("edited\n")
    (repo / "notes.txt").write_text("resolve kernel.py\n")
    err = refused(sk, root, "uncommitted: vllm/utils.py", "uncommitted: notes.txt")
    assert "commit --amend" in err and "stash" in err


def test_continue_over_uncommitted_changes_before_any_commit(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    (repo / "vllm/config/kernel.py").write_text(A11)
    err = refused(sk, root, "uncommitted: vllm/config/kernel.py", f"commit them as {name}")
    assert "--amend" not in err  # that would change patch 1


def test_continue_without_a_commit_for_the_patch(sk, root):
    stopped_at_2(sk, root)
    refused(sk, root, "no commit for", names(root)[1], "am -3 --keep-non-patch")


def test_continue_with_two_commits_for_the_patch(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    hand = resolve_by_hand(root, repo, name)
    extra = commit_files(repo, {"vllm/x.py": "X = 1\n"}, "Local experiment")
    err = refused(sk, root, "found 2 commits", hand[:12], extra[:12], "rebase -i")
    assert name in err
    # Squashed into one, it goes on.
    g(repo, "reset", "-q", "--soft", "HEAD~1")
    g(repo, "commit", "-q", "--amend", "--no-edit")
    ok(sk("apply", "--continue"))
    assert (repo / "vllm/x.py").exists() and series_head_subjects(repo) == SUBJECTS


def test_continue_with_an_empty_commit_for_the_patch(sk, root):
    """An empty commit would export as a patch file without a diff."""
    repo, name, _ = stopped_at_2(sk, root)
    g(repo, "commit", "-q", "--allow-empty", "-m", SUBJECTS[1])
    refused(sk, root, "changes no file", "commit --amend", "nox -s apply -- --force")


def test_continue_when_the_patches_below_changed(sk, root):
    """Patch 1's commit rewritten after the stop: the branch no longer holds
    what apply left, and the way out keeps the user's commits."""
    repo, name, _ = stopped_at_2(sk, root)
    g(repo, "commit", "-q", "--amend", "-m", "[Kernel] Change f0, reworded")
    resolve_by_hand(root, repo, name)
    refused(sk, root, "no longer holds the patches", "nox -s apply -- --force", "backup")


def test_continue_on_a_detached_head(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    g(repo, "checkout", "-q", "--detach")
    resolve_by_hand(root, repo, name)
    refused(sk, root, "detached", "checkout -B series")


def test_continue_after_an_applied_patch_file_changed(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name)
    first = root / "patches" / names(root)[0]
    first.write_text(first.read_text().replace("Why: because", "Why: since"))
    refused(sk, root, f"patches/{names(root)[0]} changed", "export would overwrite")


def test_continue_after_the_series_file_changed(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name)
    order = names(root)
    (root / "patches" / "series").write_text("\n".join([order[0], order[2], order[1]]) + "\n")
    refused(sk, root, "series changed", name)


def test_continue_with_nothing_stopped(sk, root):
    res = sk("apply", "--continue")  # no work tree at all
    error_line(res, "nothing to continue", "nox -s apply")
    assert not work(root).exists()
    make_series(sk, root)  # a whole series
    refused(sk, root, "no apply is stopped", "nothing to continue")


def test_continue_after_it_finished_has_nothing_to_do(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name)
    ok(sk("apply", "--continue"))
    refused(sk, root, "nothing to continue")


def test_continue_and_force_together_are_refused(sk, root):
    repo, name, _ = stopped_at_2(sk, root)
    resolve_by_hand(root, repo, name)
    before = snapshot(root)
    error_line(sk("apply", "--continue", "--force"), "--continue", "--force")
    assert snapshot(root) == before
