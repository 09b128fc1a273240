"""Every command, killed at several points, is recovered: the fault-injection matrix.

Each case runs one command in a process of its own that stops itself at a
named step (``serieskit.killpoint``: a step of the toolkit's, just before a
git command, or inside one, git dying half-way through its writes) with
SIGKILL, SIGTERM or SIGINT, to itself or to its whole process group. Then it
does what the user would: runs the command again (or its ``--continue``, or
``--abort`` and the command again), and asserts the invariant:

- the user's work survives: the patch files (or their previous versions
  under ``.work/backup/``), the commits, a stash the user had, the
  uncommitted work an ``--abort`` finds (in a stash it names);
- the rerun completes, and leaves no lock file in the work tree's git
  folder and no half-written file in the patch folder;
- the killed command printed no traceback (Ctrl-C: its one line), nor did
  a child of its (the sdist download).

A fault that is not a kill (``FAULTS``: a pin.toml cut short, a read-only
work tree) stops the command before anything moves: one error line naming
what is wrong and the way on, the user's work where it was; once the user
has put it right, the command runs and the scenario's invariant holds.

Each scenario's starting point is made once and copied for every case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_faults import (
    BIG,
    BIG_LIMIT,
    F0,
    F0_NEW,
    NEAR_PATCH_2,
    RESOLVED,
    SUBJECTS,
    TWO_CONFLICTS,
    Result,
    amend_all,
    backup_refs,
    break_context,
    cli_caller,
    commit_files,
    error_line,
    files_under,
    fresh_apply,
    g,
    in_namespace,
    killed,
    make_big_series,
    make_docs_series,
    make_series,
    names,
    namespace_or_skip,
    ok,
    patches,
    refs_keeping,
    rev,
    series_head_subjects,
    work,
)
from test_port import PORT, f0, make_port, pin_patches, write_series

from conftest import BASE_FILES, add_release, base_commit, make_root
from serieskit.checks import docs
from serieskit.series import base, target
from serieskit.upstream import carry_record, resolutions

KERNEL = BASE_FILES["vllm/config/kernel.py"]
# Upstream changes f0's line: patch 1 conflicts there, and nothing else does.
ONE_CONFLICT = {
    **BASE_FILES,
    "vllm/utils.py": TWO_CONFLICTS["vllm/utils.py"].replace(
        "def f10():\n    return -10\n", "def f10():\n    return 10\n"
    ),
}
MY_STASH = "print('stashed by the user before')\n"


@dataclass
class Case:
    """One scenario's starting point, what it runs, and what must hold after."""

    name: str
    argv: list[str]
    setup: Callable  # (call, root, facts) -> None: from a fresh root to the starting point
    recover: Callable  # (call, root, facts) -> None: the user's way on, asserting it works
    check: Callable  # (call, root, facts) -> None: the invariant
    facts: dict = field(default_factory=dict)  # setup's; "env": variables set (None: unset)


def _user_stash(repo: Path) -> None:
    """A stash of the user's, made before: no command may drop it."""
    (repo / "setup.py").write_text(MY_STASH)
    g(repo, "stash", "push", "-q", "-m", "my own stash")


def _stash_kept(repo: Path) -> None:
    entries = g(repo, "stash", "list", "--format=%gs").splitlines()
    assert any("my own stash" in e for e in entries), entries


def _state(root: Path, version: str | None = None) -> dict:
    name = f"state-{version}.json" if version else "state.json"
    path = root / ".work" / name
    return json.loads(path.read_text()) if path.exists() else {}


def _in_a_stash_or_history(repo: Path, text: str) -> bool:
    for entry in g(repo, "stash", "list", "--format=%gd").split():
        for tree in (entry, f"{entry}^2", f"{entry}^3"):
            if g(repo, "grep", "-F", "-l", text, tree, check=False):
                return True
    return bool(g(repo, "log", "--all", "-p", "-S", text, "--format=%H", check=False))


def _no_leftovers(root: Path, repo: Path) -> None:
    """No lock file in the work tree's git folder, no temporary file in a patch folder."""
    locks = [str(p.relative_to(repo)) for p in (repo / ".git").rglob("*.lock")]
    assert not locks, locks
    for folder in [root / "patches", *(root / "ports").glob("*")]:
        left = [p.name for p in folder.iterdir() if re.search(r"\.serieskit-\d+\.tmp$", p.name)]
        assert not left, left


# --- apply, from scratch and over changed patches -------------------------------


def _apply_setup(call, root, facts):
    make_series(call, root)
    shutil.rmtree(root / ".work")
    ok(call("apply"))
    facts["good"] = rev(work(root), "HEAD")
    facts["patches"] = patches(root)
    shutil.rmtree(root / ".work")


def _apply_check(call, root, facts):
    repo = work(root)
    assert rev(repo, "HEAD") == facts["good"]
    assert g(repo, "status", "--porcelain") == ""
    assert patches(root) == facts["patches"]
    assert "matches patches/" in ok(call("status")).out
    _no_leftovers(root, repo)


def _changed_setup(call, root, facts):
    repo = make_series(call, root)
    _user_stash(repo)
    path = root / "patches" / names(root)[2]
    path.write_text(path.read_text().replace("Why: because", "Why: since"))
    facts["patches"] = patches(root)


def _changed_check(call, root, facts):
    repo = work(root)
    assert series_head_subjects(repo) == SUBJECTS
    assert "Why: since" in g(repo, "log", "-1", "--format=%B")
    assert g(repo, "status", "--porcelain") == "" and patches(root) == facts["patches"]
    _stash_kept(repo)
    _no_leftovers(root, repo)


def _continue_setup(call, root, facts):
    """Apply stopped at patch 2 (its context broken); the user made patch 2
    by hand, as one commit."""
    make_series(call, root)
    shutil.rmtree(root / ".work")
    break_context(root, 1)
    error_line(call("apply"), "does not apply")
    repo = work(root)
    commit_files(
        repo,
        {"vllm/config/kernel.py": KERNEL.replace("a = 1", "a = 12"), "vllm/new.py": "NEW = 1\n"},
        SUBJECTS[1],
    )
    facts["mine"] = rev(repo, "HEAD")
    facts["patches"] = patches(root)


def _continue_check(call, root, facts):
    repo = work(root)
    assert series_head_subjects(repo) == SUBJECTS
    assert "a = 12" in (repo / "vllm/config/kernel.py").read_text()
    assert g(repo, "status", "--porcelain") == "" and patches(root) == facts["patches"]
    assert _state(root).get("in_progress") is None and not _state(root).get("failed")
    _no_leftovers(root, repo)


# --- apply, then the user acts in the work tree before the rerun -----------------

MY_F0 = "def f0():\n    return 7\n"
MY_RESOLUTION = BASE_FILES["vllm/utils.py"].replace(
    "def f0():\n    return 0\n", "def f0():\n    return 107  # mine and the series'\n"
)
MY_EDIT = "print('my staged edit')\n"


def _your_am_setup(call, root, facts):
    """As for apply, and a patch of the user's own (f0 returns 7; the series
    says 100), made on the base: `git am -3` of it stops at a conflict."""
    _apply_setup(call, root, facts)
    scratch = root.parent / "mine"
    g(scratch.parent, "init", "-q", str(scratch))
    commit_files(scratch, {"vllm/utils.py": BASE_FILES["vllm/utils.py"]}, "base")
    utils = BASE_FILES["vllm/utils.py"].replace("def f0():\n    return 0\n", MY_F0)
    commit_files(scratch, {"vllm/utils.py": utils}, "My f0")
    out = root.parent / "mine-patch"
    g(scratch, "format-patch", "-q", "--full-index", "-1", "-o", str(out))
    facts["my patch"] = next(out.iterdir())


def _your_am_recover(call, root, facts):
    """The user's own `git am` stops at a conflict; they resolve it and stage
    the resolution, then run apply as the recovery table says: it stops at
    their am, which stays as it was; they finish it, and `apply --force`
    keeps their commit under a backup ref."""
    repo = work(root)
    g(repo, "am", "--3way", str(facts["my patch"]), check=False)
    assert (repo / ".git" / "rebase-apply" / "applying").exists()
    (repo / "vllm/utils.py").write_text(MY_RESOLUTION)
    g(repo, "add", "vllm/utils.py")
    head = rev(repo, "HEAD")
    error_line(call("apply"), "git am", "in progress")
    assert (repo / ".git" / "rebase-apply" / "applying").exists()
    assert rev(repo, "HEAD") == head
    assert g(repo, "show", ":vllm/utils.py") == MY_RESOLUTION
    assert (repo / "vllm/utils.py").read_text() == MY_RESOLUTION
    g(repo, "am", "--continue")
    mine = rev(repo, "HEAD")
    res = ok(call("apply", "--force"))
    assert any(ref in res.text for ref in refs_keeping(repo, mine)), res.text


def _your_staged_edit(*argv: str) -> Callable:
    """The user's way on after a command killed inside its git am or rebase:
    they remove the lock git complains about and stage an edit of a file
    that step does not touch, then run the command again: it stops, naming
    the file, which stays staged; they stash it as the error says, and the
    command goes on."""

    def recover(call, root, facts):
        repo = work(root)
        # Where git died depends on the sizes of what it writes (paths among
        # them): if it died before its am or rebase began, the rerun meets a
        # staged edit on a work tree with nothing in progress, and refuses it
        # all the same.
        began = any((repo / ".git" / d).is_dir() for d in ("rebase-apply", "rebase-merge"))
        for lock in (repo / ".git").rglob("*.lock"):
            lock.unlink()
        (repo / "setup.py").write_text(MY_EDIT)
        g(repo, "add", "setup.py")
        error_line(call(*argv), *(("setup.py", "stash") if began else ("stash",)))
        assert g(repo, "show", ":setup.py") == MY_EDIT
        assert (repo / "setup.py").read_text() == MY_EDIT
        g(repo, "stash")
        ok(call(*argv))
        assert _in_a_stash_or_history(repo, "my staged edit")

    return recover


# A base with more files than a cut-short checkout's files are inspected one by one.
MANY_FILES = {**BASE_FILES, **{f"vllm/many/m{i:03d}.py": f"M = {i}\n" * 20 for i in range(150)}}


def _many_files_setup(call, root, facts):
    """As for apply, on a base of 150 more files (the pin moved to it)."""
    cache = root.parent / "cache" / "sdists"
    sha = add_release(cache, "0.0.3", MANY_FILES)
    commit = base_commit(cache / "vllm-0.0.3.tar.gz", "0.0.3", sha)
    base.write_pin(root, base.Pin("0.0.3", sha, commit))
    _apply_setup(call, root, facts)


def _full_disk_recover(call, root, facts):
    """The first checkout of the base, killed before it wrote anything, is
    left as a full disk leaves one: every file of the base there, empty or
    cut short, no index, HEAD unborn. A plain apply finishes it and says so."""
    repo = work(root)
    assert not g(repo, "rev-parse", "--verify", "-q", "HEAD", check=False)
    for i, (path, text) in enumerate(sorted(MANY_FILES.items())):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text[: 3 if i % 5 == 0 else 0])
    res = ok(call("apply"))
    assert "checkout" in res.out and "cut short" in res.out, res.out


def _half_written_setup(call, root, facts):
    """As for apply, patch 2 adding a big file that patch 3 changes in its
    last line: a git am of patch 3 killed past the limit dies writing it."""
    ok(call("apply"))
    repo = work(root)
    commit_files(repo, {"vllm/utils.py": UTILS.replace(F0, F0_NEW)}, SUBJECTS[0])
    commit_files(repo, {"vllm/big.py": BIG}, SUBJECTS[1])
    last = BIG.replace("# 00399", "# 99399")  # its last line: written past the limit
    commit_files(repo, {"vllm/big.py": last, "vllm/new.py": "NEW = 3\n"}, SUBJECTS[2])
    ok(call("export"))
    facts["good"] = fresh_apply(call, root)
    facts["patches"] = patches(root)
    shutil.rmtree(root / ".work")


def _half_written_recover(call, root, facts):
    """git died writing patch 3's big file, before its index: the file cut
    short is the apply's own work, not the user's; a plain apply redoes it."""
    cut = (work(root) / "vllm/big.py").read_bytes()
    assert len(cut) <= BIG_LIMIT < len(BIG), len(cut)
    res = ok(call("apply"))
    assert "vllm/big.py" not in res.err, res.text


def _download_setup(call, root, facts):
    """The series exported, the pin moved to 0.0.2, whose sdist is on pip's
    index (a folder of find-links) and not in the cache: apply downloads it
    (its progress on the terminal)."""
    make_series(call, root)
    links = root.parent / "links"
    sha = add_release(links, "0.0.2", BASE_FILES)
    (links / "vllm-0.0.2.tar.gz").with_suffix(".sha256").unlink()  # pip reads the folder
    commit = base_commit(links / "vllm-0.0.2.tar.gz", "0.0.2", sha)
    base.write_pin(root, base.Pin("0.0.2", sha, commit))
    shutil.rmtree(root / ".work")
    facts["patches"] = patches(root)
    facts["env"] = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
        **dict.fromkeys(("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_INDEX")),
        "VLLM_SERIES_QUIET": None,  # the download child writes to the session's stderr
    }


def _download_check(call, root, facts):
    repo = work(root)
    assert series_head_subjects(repo, version="0.0.2") == SUBJECTS
    assert g(repo, "status", "--porcelain") == ""
    assert patches(root) == facts["patches"]
    assert "matches patches/" in ok(call("status")).out
    _no_leftovers(root, repo)


# --- apply --force over the user's edit -------------------------------------------

MINE = "print('mine')\n"


def _your_edit_setup(call, root, facts):
    """The series applied and exported; an edit of the user's in the work
    tree, which apply --force stashes."""
    repo = make_series(call, root)
    (repo / "setup.py").write_text(MINE)
    facts["head"], facts["patches"] = rev(repo, "HEAD"), patches(root)


def _your_edit_check(call, root, facts):
    repo = work(root)
    assert series_head_subjects(repo) == SUBJECTS
    assert g(repo, "status", "--porcelain") == "" and patches(root) == facts["patches"]
    assert _in_a_stash_or_history(repo, MINE.strip())
    _no_leftovers(root, repo)


# --- export -------------------------------------------------------------------


def _export_setup(call, root, facts):
    repo = make_series(call, root)
    facts["before"] = patches(root)
    amend_all(repo, "Why: said again.")
    facts["head"] = rev(repo, "HEAD")


def _export_check(call, root, facts):
    now = patches(root)
    assert all(b"Why: said again." in now[n] for n in names(root))
    kept = {p.read_bytes() for p in files_under(root / ".work" / "backup")}
    lost = [n for n, data in facts["before"].items() if data not in kept | set(now.values())]
    assert not lost, lost
    repo = work(root)
    assert rev(repo, "HEAD") == facts["head"]
    assert "up to date" in ok(call("apply")).out
    _no_leftovers(root, repo)


# --- rebase, its --continue and its --abort -------------------------------------


def _rebase_setup(call, root, facts, cache):
    repo = make_big_series(call, root)
    _user_stash(repo)
    add_release(cache, "0.0.2", NEAR_PATCH_2)
    facts["head"], facts["patches"] = rev(repo, "HEAD"), patches(root)


def _rebase_recover(call, root, facts, argv=("rebase", "vllm==0.0.2")):
    """As the user: --continue where a rebase is stopped; --abort and start
    again where that says so; start again where none was recorded."""
    st = _state(root).get("rebase")
    if st and not st["done"]:
        res = call("rebase", "--continue")
        if res.rc == 0:
            return
        error_line(res, "--abort")
        ok(call("rebase", "--abort"))
        ok(call(*argv))
    elif not st:
        ok(call(*argv))


def _rebase_check(call, root, facts):
    repo = work(root)
    assert series_head_subjects(repo, version="0.0.2") == SUBJECTS
    assert _state(root)["rebase"]["done"] and patches(root) == facts["patches"]
    assert g(repo, "status", "--porcelain") == ""
    _stash_kept(repo)
    _no_leftovers(root, repo)


def _stopped_setup(call, root, facts, cache):
    """A rebase stopped at its one conflict (patch 1), the resolution made
    and staged, an unrelated change beside it."""
    repo = make_series(call, root)
    add_release(cache, "0.0.2", ONE_CONFLICT)
    facts["head"], facts["patches"] = rev(repo, "HEAD"), patches(root)
    error_line(call("rebase", "vllm==0.0.2"), "conflict")
    (repo / "vllm/utils.py").write_text(RESOLVED.replace("return -10", "return 10"))
    g(repo, "add", "vllm/utils.py")


def _continue_rebase_recover(call, root, facts):
    """--continue again; where it says the rebase was interrupted, --abort
    (the resolution goes to a stash) and start again: it stops at the same
    conflict, or, where --continue had recorded the stop before the kill,
    replays that record."""
    if not _state(root)["rebase"]["done"]:
        res = call("rebase", "--continue")
        if res.rc:
            error_line(res, "--abort")
            ok(call("rebase", "--abort"))
            res = call("rebase", "vllm==0.0.2")
            if res.rc:
                error_line(res, "conflict")


def _continue_rebase_check(call, root, facts):
    """Finished with the resolution in it; or, where the user had to
    --abort, back where it started with the resolution in a stash and the
    rebase done again (stopped at the same conflict, which the user
    resolves anew from the stash)."""
    repo = work(root)
    assert _in_a_stash_or_history(repo, "return 100  # resolved by hand")
    assert patches(root) == facts["patches"]
    rb = _state(root).get("rebase")
    assert rb and (rb["done"] or not rb["running"])
    _no_leftovers(root, repo)


def _abort_setup(call, root, facts, cache):
    _stopped_setup(call, root, facts, cache)
    (work(root) / "setup.py").write_text("print('my unrelated edit')\n")


def _abort_recover(call, root, facts):
    if _state(root).get("rebase"):
        ok(call("rebase", "--abort"))


def _abort_check(call, root, facts):
    repo = work(root)
    assert rev(repo, "HEAD") == facts["head"] and rev(repo, "series") == facts["head"]
    assert g(repo, "status", "--porcelain") == ""
    for text in ("return 100  # resolved by hand", "my unrelated edit"):
        assert _in_a_stash_or_history(repo, text), text
    assert patches(root) == facts["patches"]
    assert "up to date" in ok(call("apply")).out
    _no_leftovers(root, repo)


# --- rebase --continue recording a whole stop ------------------------------------

UTILS = BASE_FILES["vllm/utils.py"]
# Upstream deleted utils.py; f10 lives in a module of its own (no rename).
UTILS_GONE = {
    **{k: v for k, v in BASE_FILES.items() if k != "vllm/utils.py"},
    "vllm/f10.py": "def f10():\n    return 10\n",
}
F10_PORTED = "def f10():\n    return 1000\n"
TEST_PORTED = "from vllm.f10 import f10\n"


def _resolve_whole_stop(repo: Path) -> None:
    """The patch's change ported to where upstream moved f10, the deleted
    file dropped, the patch's test (no conflict in it) edited to match."""
    (repo / "vllm/f10.py").write_text(F10_PORTED)
    (repo / "tests/test_f10.py").write_text(TEST_PORTED)
    g(repo, "rm", "-q", "vllm/utils.py")
    g(repo, "add", "vllm/f10.py", "tests/test_f10.py")


def _whole_stop_setup(call, root, facts, cache):
    """A rebase stopped where upstream deleted a file the patch changes; the
    resolution (a deletion, an edit beside it) made and staged."""
    ok(call("apply"))
    repo = work(root)
    commit_files(
        repo,
        {
            "vllm/utils.py": UTILS.replace("return 10\n", "return 1000\n"),
            "tests/test_f10.py": "from vllm.utils import f10\n",
        },
        "[Core] F10",
    )
    ok(call("export"))
    add_release(cache, "0.0.2", UTILS_GONE)
    facts["patches"] = patches(root)
    error_line(call("rebase", "vllm==0.0.2"), "conflict")
    _resolve_whole_stop(repo)


def _whole_stop_recover(call, root, facts):
    """--continue again; where that says so, --abort and start again, which
    replays the record where one was made, else stops for the same resolution."""
    repo = work(root)
    if _state(root)["rebase"]["done"]:
        return
    res = call("rebase", "--continue")
    if res.rc == 0:
        return
    error_line(res, "--abort")
    ok(call("rebase", "--abort"))
    res = call("rebase", "vllm==0.0.2")
    if res.rc:
        error_line(res, "conflict")
        _resolve_whole_stop(repo)
        ok(call("rebase", "--continue"))


def _whole_stop_check(call, root, facts):
    """Done with the resolution; the record kept with the series is whole (or
    absent), and the same move again, with no record but patches/'s,
    replays it to the same tree."""
    repo = work(root)
    assert _state(root)["rebase"]["done"]
    assert (repo / "vllm/f10.py").read_text() == F10_PORTED
    assert (repo / "tests/test_f10.py").read_text() == TEST_PORTED
    assert not (repo / "vllm/utils.py").exists()
    tree = g(repo, "rev-parse", "HEAD^{tree}")
    assert patches(root) == facts["patches"]
    _no_leftovers(root, repo)
    stops_dir = root / "patches" / resolutions.RESOLUTIONS / resolutions.STOPS
    (record,) = stops_dir.iterdir()  # the one record, no temporary folder beside it
    meta = json.loads((record / resolutions.STOP_META).read_text())
    assert meta["files"]["vllm/utils.py"] == "deleted"
    for path in ("vllm/f10.py", "tests/test_f10.py"):
        assert (record / "files" / path).is_file()
    ok(call("apply", "--force"))
    for folder in ("rr-cache", resolutions.STOP_CACHE):
        shutil.rmtree(repo / ".git" / folder, ignore_errors=True)
    res = ok(call("rebase", "vllm==0.0.2"))
    assert "resolved by a recorded resolution" in res.out, res.out
    assert g(repo, "rev-parse", "HEAD^{tree}") == tree


# --- docs -----------------------------------------------------------------------


def _docs_setup(call, root, facts):
    """A series whose reference is stale: docs rewrites both patches."""
    repo = make_docs_series(call, root)
    facts["head"], facts["patches"] = rev(repo, "HEAD"), patches(root)


def _docs_check(call, root, facts):
    repo = work(root)
    assert "a = 10" in g(repo, "show", f"HEAD:{docs.OUTPUT}")
    assert refs_keeping(repo, facts["head"]), "the series before docs is kept"
    ok(call("export", "--check"))
    assert "up to date" in ok(call("apply")).out
    assert g(repo, "status", "--porcelain") == ""
    _no_leftovers(root, repo)


# --- carry ----------------------------------------------------------------------


def _carry_setup(call, root, facts, cache):
    # The port to 0.0.2, as tests/test_port.py's fixture makes it.
    pin, port = make_port(root, cache, {**BASE_FILES, "setup.py": "print('setup 2')\n"})
    write_series(pin, pin_patches(f0(101)))  # a change of the pin's to carry
    facts["port"] = {
        p.name: p.read_bytes()
        for p in port.patches.iterdir()
        if p.is_file() and p.name != carry_record.CARRIED  # rewritten by the carry
    }


def _carry_recover(call, root, facts):
    st = _state(root, PORT).get("rebase")
    if st and not st["done"]:
        if call("carry", PORT, "--continue").rc == 0:
            return
        ok(call("carry", PORT, "--abort"))
    ok(call("carry", PORT))


def _carry_check(call, root, facts):
    ok(call("carry", PORT, "--check"))
    port = target.port(root, PORT)
    kept = {p.read_bytes() for p in files_under(root / ".work" / "backup")}
    now = {p.read_bytes() for p in port.patches.iterdir() if p.is_file()}
    lost = [
        n for n, data in facts["port"].items() if data not in kept | now and n != "carried.toml"
    ]
    assert not lost, lost
    assert len(g(port.work, "worktree", "list").splitlines()) == 1
    _no_leftovers(root, port.work)


CASES = {
    "apply": Case("apply", ["apply"], _apply_setup, None, _apply_check),
    "apply changed": Case("apply changed", ["apply"], _changed_setup, None, _changed_check),
    "apply --continue": Case(
        "apply --continue", ["apply", "--continue"], _continue_setup, None, _continue_check
    ),
    "apply, your am": Case(
        "apply, your am", ["apply"], _your_am_setup, _your_am_recover, _apply_check
    ),
    "apply, your staged edit": Case(
        "apply, your staged edit", ["apply"], _apply_setup, _your_staged_edit("apply"), _apply_check
    ),
    "apply, full disk": Case(
        "apply, full disk", ["apply"], _many_files_setup, _full_disk_recover, _apply_check
    ),
    "apply, half-written patch": Case(
        "apply, half-written patch",
        ["apply"],
        _half_written_setup,
        _half_written_recover,
        _apply_check,
    ),
    "apply, download": Case("apply, download", ["apply"], _download_setup, None, _download_check),
    "apply --force, your edit": Case(
        "apply --force, your edit",
        ["apply", "--force"],
        _your_edit_setup,
        None,
        _your_edit_check,
    ),
    "apply --continue, your staged edit": Case(
        "apply --continue, your staged edit",
        ["apply", "--continue"],
        _continue_setup,
        _your_staged_edit("apply", "--continue"),
        _continue_check,
    ),
    "export": Case("export", ["export"], _export_setup, None, _export_check),
    "rebase": Case(
        "rebase", ["rebase", "vllm==0.0.2"], _rebase_setup, _rebase_recover, _rebase_check
    ),
    "rebase --continue": Case(
        "rebase --continue",
        ["rebase", "--continue"],
        _stopped_setup,
        _continue_rebase_recover,
        _continue_rebase_check,
    ),
    "rebase --abort": Case(
        "rebase --abort", ["rebase", "--abort"], _abort_setup, _abort_recover, _abort_check
    ),
    "rebase --continue, whole stop": Case(
        "rebase --continue, whole stop",
        ["rebase", "--continue"],
        _whole_stop_setup,
        _whole_stop_recover,
        _whole_stop_check,
    ),
    "docs": Case("docs", ["docs"], _docs_setup, None, _docs_check),
    "docs, your staged edit": Case(
        "docs, your staged edit", ["docs"], _docs_setup, _your_staged_edit("docs"), _docs_check
    ),
    "carry": Case("carry", ["carry", PORT], _carry_setup, _carry_recover, _carry_check),
}

# (scenario, kill point, signal, to the whole group, file-size limit for an in-git kill)
KILLS = [
    ("apply", "git-fast-import", "KILL", False, None),
    ("apply", "apply.started", "INT", False, None),
    ("apply", "git-checkout", "TERM", False, None),
    ("apply", "in-git-checkout", "KILL", False, 80),
    ("apply", "in-git-checkout", "INT", True, 80),
    ("apply", "git-am#2", "KILL", True, None),
    ("apply", "in-git-am#2", "KILL", False, 80),
    ("apply", "write#3", "KILL", False, None),
    ("apply changed", "git-checkout", "KILL", False, None),
    ("apply changed", "in-git-checkout", "KILL", False, 80),
    ("apply changed", "git-am#3", "TERM", True, None),
    ("apply changed", "write#2", "INT", False, None),
    # The user acts in the work tree after the kill (issue 38): their own git am
    # (after a kill that left none), a staged edit beside what a killed git am
    # staged (its index.lock left: it died writing the index again).
    ("apply, your am", "git-am#2", "KILL", True, None),
    ("apply, your am", "git-am#3", "TERM", False, None),
    ("apply, your staged edit", "in-git-am#2", "KILL", False, 820),
    ("apply, your staged edit", "in-git-am#3", "KILL", True, 860),
    ("apply, full disk", "git-checkout", "KILL", False, None),
    ("apply, full disk", "git-checkout", "INT", True, None),
    # git am killed as it writes patch 3's files, before its index: what it
    # wrote is the apply's own, not the user's.
    ("apply, half-written patch", "in-git-am#3", "KILL", False, BIG_LIMIT),
    ("apply, half-written patch", "in-git-am#3", "TERM", True, BIG_LIMIT),
    # Ctrl-C as the sdist download child asks pip's index: the terminal sends
    # it to the whole group, the child included.
    ("apply, download", "download.asking", "INT", True, None),
    ("apply, download", "download.asking", "KILL", True, None),
    ("apply --force, your edit", "git-stash", "KILL", False, None),
    ("apply --continue", "git-am", "KILL", False, None),
    ("apply --continue, your staged edit", "in-git-am", "KILL", False, 820),
    ("apply --continue", "in-git-am", "KILL", False, 80),
    ("apply --continue", "write#1", "TERM", False, None),
    ("apply --continue", "write#2", "INT", True, None),
    ("export", "git-format-patch", "KILL", False, None),
    ("export", "write#1", "KILL", False, None),
    ("export", "write#2", "KILL", False, None),
    ("export", "write#3", "TERM", False, None),
    ("export", "export.written", "KILL", False, None),
    ("export", "write#5", "INT", False, None),
    ("rebase", "rebase.started", "KILL", False, None),
    ("rebase", "git-rebase", "TERM", False, None),
    ("rebase", "in-git-rebase", "KILL", False, BIG_LIMIT),
    ("rebase", "in-git-rebase", "INT", True, BIG_LIMIT),
    ("rebase", "git-range-diff", "KILL", False, None),
    ("rebase", "rebase.finishing", "KILL", True, None),
    ("rebase", "write#3", "TERM", False, None),
    ("rebase --continue", "git-rebase", "KILL", False, None),
    ("rebase --continue", "in-git-rebase", "KILL", False, 80),
    ("rebase --continue", "rebase.finishing", "TERM", False, None),
    ("rebase --continue", "write#1", "INT", False, None),
    ("rebase --abort", "git-stash", "KILL", False, None),
    ("rebase --abort", "in-git-stash", "KILL", False, 80),
    ("rebase --abort", "git-rebase", "KILL", True, None),
    ("rebase --abort", "in-git-rebase", "TERM", False, 80),
    ("rebase --abort", "git-diff", "KILL", False, None),
    ("rebase --abort", "write#1", "INT", False, None),
    # Its record: before it is written, inside its write (its files written, not
    # yet in place), before git goes on, and as the finished rebase keeps it
    # with the series.
    ("rebase --continue, whole stop", "stops.recording", "KILL", False, None),
    ("rebase --continue, whole stop", "write#1", "KILL", False, None),
    ("rebase --continue, whole stop", "git-rebase", "TERM", False, None),
    ("rebase --continue, whole stop", "rebase.finishing", "KILL", False, None),
    ("rebase --continue, whole stop", "write#5", "INT", False, None),
    ("docs", "git-rebase", "KILL", False, None),
    ("docs", "in-git-rebase", "KILL", True, 80),
    ("docs", "git-format-patch", "TERM", False, None),
    ("docs", "write#2", "INT", False, None),
    ("docs, your staged edit", "in-git-rebase", "KILL", True, 500),
    ("carry", "carry.pin-side", "KILL", False, None),
    ("carry", "git-am", "KILL", True, None),
    ("carry", "in-git-worktree", "KILL", False, 80),
    ("carry", "carry.started", "TERM", False, None),
    ("carry", "git-rebase", "KILL", False, None),
    ("carry", "in-git-rebase", "KILL", False, 80),
    ("carry", "carry.finishing", "KILL", False, None),
    ("carry", "write#4", "INT", False, None),
]

_made: dict[str, tuple[Path, dict, Path]] = {}


def _starting_point(name: str, tmp_path_factory, capsys, monkeypatch) -> tuple[Path, dict]:
    """The scenario's starting point (a toolkit root and its sdist cache),
    made once per module."""
    if name not in _made:
        folder = tmp_path_factory.mktemp(re.sub(r"\W+", "-", name))
        cache = folder / "cache" / "sdists"
        monkeypatch.setenv("VLLM_SERIES_CACHE", str(cache.parent))
        root = make_root(folder, cache)
        case, facts = CASES[name], {}
        call = cli_caller(capsys, root)
        if name.startswith(("rebase", "carry")):
            case.setup(call, root, facts, cache)
        else:
            case.setup(call, root, facts)
        _made[name] = (root, facts, cache)
    root, facts, cache = _made[name]
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(cache.parent))
    for var, value in facts.get("env", {}).items():
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    return root, facts


def _copy(template: Path, tmp_path: Path, monkeypatch) -> Path:
    """This test's copy of the starting point: its root, and its sdist cache
    (what a download puts there is this test's)."""
    root = tmp_path / "root"
    shutil.copytree(template, root, symlinks=True)
    shutil.copytree(template.parent / "cache", tmp_path / "cache", symlinks=True)
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(tmp_path / "cache"))
    return root


@pytest.mark.parametrize(
    "scenario, at, sig, group, fsize",
    KILLS,
    ids=[f"{s}-{a}-{sig}{'-group' if grp else ''}" for s, a, sig, grp, _ in KILLS],
)
def test_a_killed_command_is_recovered(
    scenario, at, sig, group, fsize, tmp_path, tmp_path_factory, capsys, monkeypatch
):
    monkeypatch.setenv("VLLM_SERIES_QUIET", "1")
    template, facts = _starting_point(scenario, tmp_path_factory, capsys, monkeypatch)
    root = _copy(template, tmp_path, monkeypatch)
    case = CASES[scenario]
    res = killed(root, *case.argv, at=at, sig=sig, group=group, fsize=fsize)
    assert "Traceback" not in res.text and "KeyboardInterrupt" not in res.text, res.text
    call = cli_caller(capsys, root)
    if case.recover is None:
        ok(call(*case.argv))
    else:
        case.recover(call, root, facts)
    case.check(call, root, facts)


# --- faults that are not kills: refused before anything moves --------------------


@dataclass
class Fault:
    """A fault the user meets in a scenario's starting point, what the error
    says, and how the user puts it right."""

    scenario: str
    make: Callable  # (call, root, facts) -> (the command's Result, undo: () -> None)
    says: tuple[str, ...]  # in the one error line: what is wrong, where, the way on
    unsaid: tuple[str, ...] = ()


def _pin_cut(cut: Callable[[str], str]) -> Callable:
    """pin.toml as ``cut`` leaves it (a write cut short, a value cut short);
    putting it right is restoring it, as the error says."""

    def make(call, root, facts) -> tuple[Result, Callable]:
        path = root / "pin.toml"
        text = path.read_text()
        path.write_text(cut(text))
        return call(*CASES[facts["scenario"]].argv), lambda: path.write_text(text)

    return make


def _read_only_work_tree(call, root, facts) -> tuple[Result, Callable]:
    """The work tree mounted read-only (its git folder too): git stash fails
    without a word of git's. The mount ends with the command."""
    namespace_or_skip(root.parent)
    repo = work(root)
    mounts = f"mount --bind {repo} {repo} && mount -o remount,ro,bind {repo}"
    return in_namespace(root, CASES[facts["scenario"]].argv, mounts), lambda: None


def _nothing_moved(root: Path, facts: dict) -> None:
    repo = work(root)
    assert rev(repo, "HEAD") == facts["head"] and not backup_refs(repo)
    assert (repo / "setup.py").read_text() == MINE
    assert g(repo, "status", "--porcelain") == " M setup.py\n"
    assert not g(repo, "stash", "list")
    assert patches(root) == facts["patches"]


FAULTS = {
    "pin cut at a line": Fault(
        "apply --force, your edit",
        _pin_cut(lambda text: text[: text.index("commit =")]),
        ("pin.toml", "base.commit is missing", "git checkout -- pin.toml", "nothing was changed"),
    ),
    "pin sha256 cut short": Fault(
        "apply --force, your edit",
        _pin_cut(lambda text: re.sub(r'(sha256 = "[0-9a-f]{20})[0-9a-f]*', r"\1", text)),
        ("pin.toml", "base.sha256 must be 64 hex digits", "git checkout -- pin.toml"),
    ),
    "read-only work tree": Fault(
        "apply --force, your edit",
        _read_only_work_tree,
        ("git stash push", ".work/vllm", "cannot be written", "run this again"),
        unsaid=("exit status 1",),
    ),
}


@pytest.mark.parametrize("name", FAULTS)
def test_a_fault_is_one_line_and_nothing_moves(
    name, tmp_path, tmp_path_factory, capsys, monkeypatch
):
    monkeypatch.setenv("VLLM_SERIES_QUIET", "1")
    fault = FAULTS[name]
    template, facts = _starting_point(fault.scenario, tmp_path_factory, capsys, monkeypatch)
    root = _copy(template, tmp_path, monkeypatch)
    call = cli_caller(capsys, root)
    res, undo = fault.make(call, root, {**facts, "scenario": fault.scenario})
    line = error_line(res, *fault.says)
    assert not any(word in line for word in fault.unsaid), line
    _nothing_moved(root, facts)
    undo()
    case = CASES[fault.scenario]
    ok(call(*case.argv))
    case.check(call, root, facts)
