"""rebase onto another release or a fork's ref: report, conflicts, abort, pin."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest
from test_series import make_series

from conftest import BASE_FILES, add_release, commit_file, quiet
from serieskit import git, status
from serieskit.errors import ToolkitError
from serieskit.series import apply, base, export, safety, series, target
from serieskit.state import State
from serieskit.upstream import rebase, resolutions, stops

UPSTREAM_CHANGE = {**BASE_FILES, "setup.py": "print('setup 2')\n"}
CONFLICTING = {
    **BASE_FILES,
    "vllm/utils.py": BASE_FILES["vllm/utils.py"].replace("return 0", "return -1"),
}


def test_rebase_onto_a_release_writes_a_range_diff_report(root, cache):
    make_series(root)
    add_release(cache, "0.0.2", UPSTREAM_CHANGE)
    pin_before = (root / "pin.toml").read_text()
    patches_before = {p.name: p.read_bytes() for p in (root / "patches").iterdir()}
    lines = []
    report = rebase.start(root, "vllm==0.0.2", log=lines.append)
    text = report.read_text()
    assert report.name.startswith("rebase-0.0.1-to-0.0.2-")  # one file per run
    assert "```diff" in text and "= 1:" in text and "[Kernel] Change f0" in text
    assert "- patches: 2 unchanged, 0 changed, 0 dropped, 0 added" in text
    assert any("2 unchanged" in line for line in lines)
    repo = series.work_repo(root)
    assert (repo / "setup.py").read_text() == "print('setup 2')\n"
    assert (repo / "vllm/new.py").exists()
    # Without --update-pin nothing of the repo's own files moves.
    assert (root / "pin.toml").read_text() == pin_before
    assert {p.name: p.read_bytes() for p in (root / "patches").iterdir()} == patches_before


def test_apply_after_a_rebase_without_pin_keeps_the_rebased_series(root, cache):
    make_series(root)
    add_release(cache, "0.0.2", UPSTREAM_CHANGE)
    rebase.start(root, "vllm==0.0.2", log=quiet)
    repo = series.work_repo(root)
    rebased = git.rev(repo, "HEAD")
    with pytest.raises(ToolkitError, match="rebased onto 0.0.2"):
        apply.apply(root, log=quiet)
    assert git.rev(repo, "HEAD") == rebased
    apply.apply(root, force=True, log=quiet)
    backups = git.git(repo, "for-each-ref", "--format=%(objectname)", safety.BACKUP_REF).split()
    assert backups == [rebased]
    assert (repo / "setup.py").read_text() == BASE_FILES["setup.py"]


def test_update_pin_moves_pin_and_patches(root, cache):
    make_series(root)
    sha = add_release(cache, "0.0.2", UPSTREAM_CHANGE)
    rebase.start(root, "vllm==0.0.2", update_pin=True, log=quiet)
    pin = base.read_pin(root)
    assert pin.version == "0.0.2" and pin.sha256 == sha
    assert pin.commit == git.rev(series.work_repo(root), base.base_ref("0.0.2"))
    # The moved series applies from scratch on the new pin.
    apply.apply(root, log=quiet)
    lines = []
    status.status(root, log=lines.append)
    assert "patches:   the work tree matches patches/" in lines


def test_conflict_stops_with_instructions_then_abort_loses_nothing(root, cache):
    repo = make_series(root)
    head = git.rev(repo, "HEAD")
    add_release(cache, "0.0.3", CONFLICTING)
    lines = []
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.3", log=lines.append)
    out = "\n".join(lines)
    assert "onto 0.0.3, stopped at patch 1/2" in out
    assert "[Kernel] Change f0 (patches/0001-Kernel-Change-f0.patch)" in out
    assert "files:  vllm/utils.py (1 conflict hunk(s))" in out
    assert "upstream changed them from 0.0.1 to 0.0.3:" in out and "vllm/utils.py | 2 +-" in out
    assert "--conflict=zdiff3 -- vllm/utils.py" in out
    assert "nox -s rebase -- --continue" in out and "nox -s rebase -- --abort" in out
    with pytest.raises(ToolkitError, match="rebase is stopped"):
        apply.apply(root, log=quiet)
    rebase.abort(root, log=quiet)
    assert git.rev(repo, "HEAD") == head
    assert git.operation_in_progress(repo) is None and not git.dirty_files(repo)
    assert not State.load(root).rebase_stopped


def test_conflict_resolved_then_continue(root, cache):
    repo = make_series(root)
    add_release(cache, "0.0.3", CONFLICTING)
    with pytest.raises(ToolkitError):
        rebase.start(root, "vllm==0.0.3", log=quiet)
    with pytest.raises(ToolkitError, match="unresolved conflicts remain in vllm/utils.py"):
        rebase.cont(root, log=quiet)
    (repo / "vllm/utils.py").write_text("def f0():\n    return 100\n")
    git.git(repo, "add", "vllm/utils.py")
    report = rebase.cont(root, log=quiet)
    assert "1 changed" in report.read_text() or "1 unchanged" in report.read_text()
    assert not State.load(root).rebase_stopped
    assert len(git.commits(repo, f"{base.base_ref('0.0.3')}..HEAD")) == 2


def test_rebase_onto_a_fork_ref(root, tmp_path):
    repo = make_series(root)
    fork = tmp_path / "fork"
    git.git(None, "clone", "-q", "--no-checkout", str(repo), str(fork))
    git.git(fork, "checkout", "-q", "-b", "fork-main", State.load(root).base or "")
    commit_file(fork, "FORK.md", "fork\n", "Fork-only change")
    report = rebase.start(root, f"{fork}@fork-main", log=quiet)
    assert (series.work_repo(root) / "FORK.md").exists()
    assert "2 unchanged" in report.read_text()
    with pytest.raises(ToolkitError, match="--update-pin needs a PyPI release"):
        rebase.start(root, f"{fork}@fork-main", update_pin=True, log=quiet)


def test_rebase_refuses_unsaved_work_and_unknown_targets(root, cache):
    repo = make_series(root)
    (repo / "vllm/utils.py").write_text("edited\n")
    with pytest.raises(ToolkitError, match="uncommitted: vllm/utils.py"):
        rebase.start(root, "vllm==0.0.2", log=quiet)
    for bad in ["0.33.0", "vllm>=1", "@main", "repo@"]:
        with pytest.raises(ToolkitError, match="unknown rebase target"):
            rebase.parse_target(bad)
    with pytest.raises(ToolkitError, match="no rebase is stopped"):
        rebase.abort(root, log=quiet)


def test_rebase_onto_an_unfetchable_ref_is_one_clear_line(root, tmp_path):
    make_series(root)
    with pytest.raises(ToolkitError, match=r"no repository at .*missing") as e:
        rebase.start(root, f"{tmp_path / 'missing'}@nope", log=quiet)
    assert "\n" not in str(e.value)
    assert not State.load(root).rebase_stopped


def test_summarize_counts_each_kind():
    rd = (
        "1:  aaaaaaa = 1:  bbbbbbb one\n2:  ccccccc ! 2:  ddddddd two\n"
        "    @@ context\n3:  eeeeeee < -:  ------- three\n-:  ------- > 3:  fffffff four\n"
    )
    assert rebase.summarize(rd) == {"unchanged": 1, "changed": 1, "dropped": 1, "added": 1}


def test_a_resolution_is_made_once(root, cache):
    """rerere's record of a resolution travels with the series (patches/
    resolutions/): the next rebase onto the same release resolves itself."""
    repo = make_series(root)
    add_release(cache, "0.0.3", CONFLICTING)
    with pytest.raises(ToolkitError):
        rebase.start(root, "vllm==0.0.3", log=quiet)
    (repo / "vllm/utils.py").write_text("def f0():\n    return 100\n")
    git.git(repo, "add", "vllm/utils.py")
    first = rebase.cont(root, log=quiet)
    resolved = git.git(repo, "show", "HEAD~1:vllm/utils.py")
    folder = root / "patches" / stops.RESOLUTIONS
    records = [p for p in folder.iterdir() if p.name != resolutions.STOPS]
    assert len(records) == 1 and (records[0] / "postimage").exists()
    assert len(list((folder / resolutions.STOPS).iterdir())) == 1  # and the whole stop
    # Elsewhere: a work tree on the pin without rerere's own cache, the same
    # rebase, no hand work.
    apply.apply(root, force=True, log=quiet)
    shutil.rmtree(git.gitdir(repo) / "rr-cache")
    lines = []
    second = rebase.start(root, "vllm==0.0.3", log=lines.append)
    assert any("resolved by a recorded resolution" in line for line in lines)
    assert git.git(repo, "show", "HEAD~1:vllm/utils.py") == resolved
    assert "[Kernel] Change f0 (recorded resolution)" in second.read_text()
    assert second != first  # one report per run


def test_abort_leaves_the_patch_folder_as_it_was_and_keeps_the_resolutions(root, cache):
    """--abort is back to before: patches/resolutions/ holds what it held
    (here one record of an earlier rebase) and nothing new; the resolution
    made before the abort stays in the work tree's rerere cache, so the same
    rebase again resolves that step by itself."""
    repo = make_series(
        root,
        [
            ("vllm/utils.py", "def f0():\n    return 100\n", "[Kernel] Change f0"),
            ("vllm/setup_note.py", "NOTE = 1\n", "[Core] Note"),
            ("setup.py", "print('series')\n", "[Build] Change setup"),
        ],
    )
    earlier = root / "patches" / stops.RESOLUTIONS / ("e" * 40)
    earlier.mkdir(parents=True)
    for name in ("preimage", "postimage"):
        (earlier / name).write_text(f"an earlier rebase's {name}\n")

    def folder() -> dict[str, str]:
        res = root / "patches" / stops.RESOLUTIONS
        return {str(p.relative_to(res)): p.read_text() for p in res.rglob("*") if p.is_file()}

    before = folder()
    add_release(cache, "0.0.3", {**CONFLICTING, "setup.py": "print('upstream')\n"})
    with pytest.raises(ToolkitError):
        rebase.start(root, "vllm==0.0.3", log=quiet)
    (repo / "vllm/utils.py").write_text("def f0():\n    return 100\n")
    git.git(repo, "add", "vllm/utils.py")
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.cont(root, log=quiet)  # the second stop: setup.py
    lines: list[str] = []
    rebase.abort(root, log=lines.append)
    assert folder() == before
    assert any("rr-cache" in line and "reuses" in line for line in lines), lines
    lines.clear()
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.3", log=lines.append)
    assert any("resolved by a recorded resolution" in line for line in lines), lines
    assert "setup.py" in " ".join(git.git(repo, "diff", "--name-only", "--diff-filter=U").split())
    rebase.abort(root, log=quiet)
    assert folder() == before


def test_classify_separates_own_lines_from_moved_context():
    rd = (
        "1:  aaaaaaa ! 1:  bbbbbbb [Kernel] Moved\n"
        "    @@ vllm/x.py\n"
        "    -@@ def f():\n"
        "    +@@ def g():\n"
        "     -    return 0\n"
        "     +    return 1\n"
        "2:  ccccccc ! 2:  ddddddd [Core] Edited\n"
        "    @@ vllm/y.py\n"
        "    --    old = 1\n"
        "    -+    new = 1\n"
        "    ++    new = 2\n"
        "    -     context\n"
    )
    assert rebase.classify(rd) == [("[Kernel] Moved", 0, 2), ("[Core] Edited", 3, 1)]


def test_conflict_names_what_upstream_added_beside_it(root, cache):
    """A new upstream module next to the conflicted file (or next to a file the
    patch adds) is named at the stop: it may be upstream's own version of the
    patch's work, a conflict that has no marker."""
    make_series(root)
    add_release(
        cache,
        "0.0.3",
        {
            **CONFLICTING,
            "vllm/ubatch_runner.py": "class Runner: ...\n",
            "tools/other.sh": "#!/bin/sh\n",
        },
    )
    lines = []
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.3", log=lines.append)
    out = "\n".join(lines)
    assert "upstream added beside them" in out
    assert "    vllm/ubatch_runner.py" in out
    assert "tools/other.sh" not in out  # another folder
    rebase.abort(root, log=quiet)


def test_added_beside_caps_the_list(root, cache, monkeypatch):
    make_series(root)
    add_release(
        cache, "0.0.3", {**CONFLICTING, **{f"vllm/m{i}.py": f"M = {i}\n" for i in range(5)}}
    )
    monkeypatch.setattr(stops, "ADDED_BESIDE_MAX", 2)
    lines = []
    with pytest.raises(ToolkitError):
        rebase.start(root, "vllm==0.0.3", log=lines.append)
    out = "\n".join(lines)
    assert "... and 3 more" in out and "--diff-filter=A" in out
    rebase.abort(root, log=quiet)


def test_export_after_a_rebase_onto_the_pins_own_release(root):
    """The rebased tree is made from patches/ as they are: export writes it
    without --force; a patch file edited since the apply still stops it."""
    from serieskit.series import export

    make_series(root)
    rebase.start(root, "vllm==0.0.1", log=quiet)
    export.export(root, log=quiet)  # refused before: "patches/ changed since ..."
    first = root / "patches" / "0001-Kernel-Change-f0.patch"
    first.write_text(first.read_text() + "\n")
    rebase.start(root, "vllm==0.0.1", log=quiet)
    with pytest.raises(ToolkitError, match="changed since the work tree was made"):
        export.export(root, log=quiet)


def test_update_pin_keeps_pin_comments_and_advises_torch_only_when_it_changed(root, cache):
    """pin.toml's comments and lines it does not own stay; the torch advice
    comes only where the new release pins another torch, naming both."""
    make_series(root)
    pin = root / "pin.toml"
    text = pin.read_text().replace(
        'commit = "', '# why the CPU tests use 2.14.1\ntorch = "2.14.1"  # kept\ncommit = "'
    )
    pin.write_text(text + "\n# a closing note\n")
    cuda = "requirements/cuda.txt"
    add_release(cache, "0.0.2", {**UPSTREAM_CHANGE, cuda: "torch==2.14.0\n"})
    add_release(cache, "0.0.3", {**UPSTREAM_CHANGE, cuda: "torch==2.14.0\nnumpy\n"})
    add_release(cache, "0.0.4", {**UPSTREAM_CHANGE, cuda: "torch==2.15.0\n"})
    rebase.start(root, "vllm==0.0.2", update_pin=True, log=quiet)
    apply.apply(root, log=quiet)
    lines: list[str] = []
    rebase.start(root, "vllm==0.0.3", update_pin=True, log=lines.append)
    assert not any("torch" in line for line in lines), lines  # 2.14.0 on both
    after = pin.read_text()
    assert "# why the CPU tests use 2.14.1\n" in after and "# a closing note\n" in after
    assert 'torch = "2.14.1"  # kept\n' in after and 'version = "0.0.3"' in after
    assert base.read_pin(root).version == "0.0.3"
    apply.apply(root, log=quiet)
    lines.clear()
    rebase.start(root, "vllm==0.0.4", update_pin=True, log=lines.append)
    advice = [line for line in lines if "torch" in line]
    assert len(advice) == 1 and "2.15.0" in advice[0] and "2.14.0" in advice[0], lines
    assert "2.14.1" in advice[0]


def test_status_after_a_rebase_tells_moved_patches_from_changed_ones(root, cache):
    """After a rebase a patch file differs from the work tree in line numbers
    and index lines only: status shows it as moved, and its counts are the
    report's."""
    utils = BASE_FILES["vllm/utils.py"]
    f15 = utils.replace("return 15\n", "return 150\n")
    make_series(
        root,
        [
            ("vllm/utils.py", f15, "[Core] f15"),
            ("vllm/new.py", "NEW = 1\n", "[Core] Add new module"),
            ("vllm/utils.py", f15.replace("return 10\n", "return 110\n"), "[Misc] f10"),
        ],
    )
    upstream = "# upstream's header\n" + utils.replace("return 11\n", "return 1100\n")
    # Patch 1 moves a line down; patch 3's context (f11) changed.
    add_release(cache, "0.0.2", {**BASE_FILES, "vllm/utils.py": upstream})
    lines: list[str] = []
    report = rebase.start(root, "vllm==0.0.2", log=lines.append)
    assert "- patches: 2 unchanged, 1 changed, 0 dropped, 0 added" in report.read_text()
    lines.clear()
    info = status.status(root, log=lines.append)
    out = "\n".join(lines)
    assert "~ " in out and " M " in out, out
    assert "patches:   2 unchanged (1 of them moved" in out and ", 1 changed (" in out, out
    assert info["moved"] == ["0001-Core-f15.patch"]


def test_the_current_base_ref_follows_apply_rebase_and_abort(root, cache):
    """`series/base/current` names the work tree's base whatever its version:
    the docs' fixup and sign-off commands use it."""
    repo = make_series(root)

    def current() -> str | None:
        return git.rev(repo, base.CURRENT)  # the short name, as the docs give it

    assert current() == git.rev(repo, base.base_ref("0.0.1"))
    add_release(cache, "0.0.2", UPSTREAM_CHANGE)
    rebase.start(root, "vllm==0.0.2", log=quiet)
    assert current() == git.rev(repo, base.base_ref("0.0.2"))
    apply.apply(root, force=True, log=quiet)
    assert current() == git.rev(repo, base.base_ref("0.0.1"))
    add_release(cache, "0.0.3", CONFLICTING)
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.3", log=quiet)
    rebase.abort(root, log=quiet)
    assert current() == git.rev(repo, base.base_ref("0.0.1"))
    assert git.git(repo, "rev-list", "--count", f"{base.CURRENT}..HEAD").strip() == "2"


def test_a_finished_rebase_lists_the_moves_chores(root, cache, capsys):
    """The checklist after a rebase and after --update-pin: each chore with its
    command, the text that names the old release or a removed file, and
    whether the move is complete."""
    from serieskit import cli

    make_series(root)
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text(
        "# Guide\n\nOn vLLM 0.0.1 the series adds `vllm/setup_gone.py`.\n"
        "It imports vllm.config.kernel.KernelConfig.\nNothing else (0.0.10 is another).\n"
    )
    (root / "README.md").write_text("vLLM **0.0.1**\n")
    files = {k: v for k, v in UPSTREAM_CHANGE.items() if k != "vllm/config/kernel.py"}
    add_release(cache, "0.0.2", files)
    assert cli.run(["rebase", "vllm==0.0.2"], root) == 0
    out = capsys.readouterr().out
    assert (
        "[ ] the pin (pin.toml, patches/ still on vLLM 0.0.1): `nox -s rebase -- --update-pin`"
        in out
    )
    assert "[ ] the series' tests (no pass recorded at HEAD): `nox -s test`" in out
    assert "[ ] lint (no pass recorded at HEAD): `nox -s lint`" in out
    assert "`nox -s docs`" in out and "`nox -s lint`" in out
    assert "(missing): `nox -s test -- --record-upstream-baseline`" in out
    assert "README.md:1: vLLM **0.0.1**" in out
    assert "docs/guide.md:3: On vLLM 0.0.1" in out
    assert "docs/guide.md:4: It imports vllm.config.kernel.KernelConfig." in out  # removed
    assert "guide.md:5" not in out
    assert out.rstrip().endswith("rebase: the move is not complete: 6 chore(s) above"), out
    assert cli.run(["rebase", "--update-pin"], root) == 0
    out = capsys.readouterr().out
    assert "[x] the pin: vLLM 0.0.2" in out
    assert out.rstrip().endswith("rebase: the move is not complete: 5 chore(s) above"), out
    assert cli.run(["status"], root) == 0  # status lists them too
    assert "rebase: the move is not complete: 5 chore(s) above" in capsys.readouterr().out


def test_a_whole_passing_test_and_lint_at_head_complete_the_move(root, cache, monkeypatch):
    """`nox -s test` (every series test file) and `nox -s lint` passing on the
    work tree's HEAD mark their chores done, until a new commit; a narrowed,
    failing or uncommitted run does not; all done: the move is complete."""
    from serieskit import cli
    from serieskit.checks import docs, lint, runner, upstream_tests

    repo = make_series(root)
    add_release(cache, "0.0.2", UPSTREAM_CHANGE)
    rebase.start(root, "vllm==0.0.2", update_pin=True, log=quiet)
    # The chores this test is not about, done: the runtime reference current,
    # the upstream-test baseline recorded on the new base.
    monkeypatch.setattr(docs, "check", lambda tree: None)
    new_base = State.load(root).base
    baseline = upstream_tests.Baseline("0.0.2", new_base, "2.0", "3.12", "2025-01-01", {})
    (root / "patches" / upstream_tests.BASELINE).write_text(baseline.to_json())
    ran: list = []
    failing = [runner.Outcome("tests/test_a.py", failed=1, returncode=1)]
    monkeypatch.setattr(runner, "run_all", lambda tree, tests, out, **kw: ran.append(out) or [])
    monkeypatch.setattr(runner, "select_tests", lambda t, tree, what: (["t.py"], [], ["1"]))
    monkeypatch.setattr(lint, "session", lambda t: git.rev(repo, "HEAD"))

    def chores() -> list[str]:
        lines: list[str] = []
        status.chores(root, log=lines.append)
        return lines

    head = git.rev(repo, "HEAD")
    assert "  [ ] the series' tests (no pass recorded at HEAD): `nox -s test`" in chores()
    assert cli.run(["test", "1"], root) == 0 and ran  # narrowed to a patch: not the move's
    assert "test" not in State.load(root).passed
    monkeypatch.setattr(runner, "run_all", lambda tree, tests, out, **kw: failing)
    assert cli.run(["test"], root) == 1  # a failure: nothing recorded
    assert "test" not in State.load(root).passed
    monkeypatch.setattr(runner, "run_all", lambda tree, tests, out, **kw: [])
    (repo / "scratch.py").write_text("x = 1\n")  # what runs is not HEAD's
    assert cli.run(["test"], root) == 0
    assert "test" not in State.load(root).passed
    (repo / "scratch.py").unlink()
    assert cli.run(["test"], root) == 0
    assert State.load(root).passed["test"] == {"head": head, "base": new_base}
    lines = chores()
    assert "  [x] the series' tests (passed at HEAD)" in lines
    assert "  [ ] lint (no pass recorded at HEAD): `nox -s lint`" in lines
    assert lines[-1] == "rebase: the move is not complete: 1 chore(s) above", lines
    assert cli.run(["lint"], root) == 0
    lines = chores()
    assert "  [x] lint (passed at HEAD)" in lines
    assert lines[-1] == "rebase: the move is complete", lines
    # A new commit (a fixup, say) makes both passes stale.
    commit_file(repo, "vllm/new.py", "NEW = 2\n", "fixup! [Core] Add new module")
    lines = chores()
    assert f"  [ ] the series' tests (passed at {head[:12]}, not HEAD): `nox -s test`" in lines
    assert f"  [ ] lint (passed at {head[:12]}, not HEAD): `nox -s lint`" in lines
    assert lines[-1] == "rebase: the move is not complete: 2 chore(s) above", lines


# --- a stop where a side deleted or added a file (no text conflict) ----------------

KERNEL = BASE_FILES["vllm/config/kernel.py"]
UTILS = BASE_FILES["vllm/utils.py"]
# Upstream: deletes utils.py, changes kernel.py, adds both.py, changes setup.py.
REARRANGED = {
    **{k: v for k, v in BASE_FILES.items() if k != "vllm/utils.py"},
    "vllm/config/kernel.py": KERNEL.replace("b = 2", "b = 20"),
    "vllm/both.py": "UPSTREAM = 1\n",
    "setup.py": "print('upstream')\n",
}


def series_against_rearranged(root):
    """One patch that changes utils.py, deletes kernel.py, adds both.py and
    changes setup.py: against REARRANGED, every kind of unmerged file at once."""
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    git.git(repo, "rm", "-q", "vllm/config/kernel.py")
    (repo / "vllm/both.py").write_text("PATCH = 1\n")
    (repo / "setup.py").write_text("print('series')\n")
    git.git(repo, "add", "vllm/both.py", "setup.py")
    commit_file(
        repo, "vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Core] Rearrange"
    )
    export.export(root, log=quiet)
    return repo


def test_a_stop_names_each_kind_of_unmerged_file_and_its_commands_work(root, cache, tmp_path):
    repo = series_against_rearranged(root)
    add_release(cache, "0.0.7", REARRANGED)
    lines: list[str] = []
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.7", log=lines.append)
    out = "\n".join(lines)
    assert "files:  setup.py (1 conflict hunk(s))" in out
    assert "          vllm/both.py (added on both sides, 1 conflict hunk(s))" in out
    assert "          vllm/config/kernel.py (the patch deletes it, upstream changed it)" in out
    assert "          vllm/utils.py (deleted upstream, the patch changes it)" in out
    assert "0 conflict hunk(s)" not in out
    assert "--conflict=zdiff3 -- setup.py`" in out  # the only file with all three stages
    commands = re.findall(r"`(git -C \S+ [^`]*)`", out)
    assert f"git -C {repo} show REBASE_HEAD -- vllm/utils.py" in commands
    assert f"git -C {repo} checkout --ours -- vllm/config/kernel.py" in commands
    # Every command the stop prints works there (each in a copy of that state).
    for i, command in enumerate(commands):
        copy = tmp_path / f"copy{i}"
        shutil.copytree(repo, copy, symlinks=True)
        args = shlex.split(command.replace(str(repo), str(copy)))
        proc = subprocess.run(args, capture_output=True, text=True)
        assert proc.returncode == 0, (command, proc.stderr)
    # --ours is upstream's side: it gives upstream's kernel.py.
    git.git(repo, "checkout", "--ours", "--", "vllm/config/kernel.py")
    assert (repo / "vllm/config/kernel.py").read_text() == REARRANGED["vllm/config/kernel.py"]
    rebase.abort(root, log=quiet)


# --- a whole stop is recorded and replayed --------------------------------------

# Upstream deletes utils.py and has f10 in a module of its own (no rename to follow).
UTILS_GONE = {
    **{k: v for k, v in BASE_FILES.items() if k != "vllm/utils.py"},
    "vllm/f10.py": "def f10():\n    return 10\n",
}


def test_a_stop_with_a_deletion_and_an_edit_beside_it_is_replayed(root, cache):
    """The patch changes a file upstream deleted and adds a test that imports
    it: resolved by porting the change, `git rm` of the file and an edit of
    the test (a file without a conflict). The second run of the same move,
    from the old series on a machine with none of this work tree's records,
    goes through without a stop, to the same tree."""
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    (repo / "tests").mkdir()
    (repo / "tests/test_f10.py").write_text("from vllm.utils import f10\n")
    git.git(repo, "add", "tests/test_f10.py")
    commit_file(repo, "vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Core] F10")
    commit_file(repo, "vllm/new.py", "NEW = 1\n", "[Core] Add new module")
    export.export(root, log=quiet)
    add_release(cache, "0.0.8", UTILS_GONE)
    lines: list[str] = []
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.0.8", log=lines.append)
    assert "  files:  vllm/utils.py (deleted upstream, the patch changes it)" in lines
    (repo / "vllm/f10.py").write_text("def f10():\n    return 1000\n")
    (repo / "tests/test_f10.py").write_text("from vllm.f10 import f10\n")
    git.git(repo, "rm", "-q", "vllm/utils.py")
    git.git(repo, "add", "vllm/f10.py", "tests/test_f10.py")
    first = rebase.cont(root, log=quiet)
    tree = git.git(repo, "rev-parse", "HEAD^{tree}")
    (record,) = (root / "patches" / stops.RESOLUTIONS / resolutions.STOPS).iterdir()
    meta = json.loads((record / resolutions.STOP_META).read_text())
    assert meta["patch"] == "[Core] F10" and (meta["from"], meta["onto"]) == ("0.0.1", "0.0.8")
    assert meta["files"] == {
        "tests/test_f10.py": "100644",
        "vllm/f10.py": "100644",
        "vllm/utils.py": "deleted",
    }
    assert (record / "files/tests/test_f10.py").read_text() == "from vllm.f10 import f10\n"
    assert not (root / "patches" / stops.RESOLUTIONS / "stops" / "rr-cache").exists()
    # Elsewhere: the old series on the pin, no records in the work tree's git folder.
    apply.apply(root, force=True, log=quiet)
    for cache_dir in ("rr-cache", resolutions.STOP_CACHE):
        shutil.rmtree(git.gitdir(repo) / cache_dir, ignore_errors=True)
    lines.clear()
    second = rebase.start(root, "vllm==0.0.8", log=lines.append)
    used = f"(patches/resolutions/stops/{record.name}/)"
    assert f"rebase: step 1 resolved by a recorded resolution {used}; going on" in lines
    assert git.git(repo, "rev-parse", "HEAD^{tree}") == tree
    assert "[Core] F10 (recorded resolution)" in second.read_text() and second != first
    # rerere's cache gets no stop record as one of its own.
    assert sorted(p.name for p in (git.gitdir(repo) / "rr-cache").iterdir()) == []


def test_a_half_written_stop_record_is_never_replayed(root, cache):
    """A record folder without all its files (what no toolkit write leaves,
    a hand's or a disk's) is ignored: the stop is shown."""
    repo = series_against_rearranged(root)
    add_release(cache, "0.0.7", REARRANGED)
    with pytest.raises(ToolkitError):
        rebase.start(root, "vllm==0.0.7", log=quiet)
    key = resolutions.stop_key(repo)
    folder = git.gitdir(repo) / resolutions.STOP_CACHE / str(key)
    folder.mkdir(parents=True)
    (folder / resolutions.STOP_META).write_text(json.dumps({"files": {"setup.py": "100644"}}))
    assert resolutions.replay_stop(target.of(root), repo) is None
    assert resolutions._index(repo)["setup.py"][0].endswith(" 1")  # untouched: still unmerged
    rebase.abort(root, log=quiet)
