"""rebase --check: a dry run per patch (clean / 3-way / conflict) that changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_series import make_series

from conftest import BASE_FILES, add_release, quiet
from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.series import base, series
from serieskit.upstream import rebase_check

UTILS = BASE_FILES["vllm/utils.py"]


def release(cache, version: str, old: str, new: str) -> None:
    add_release(cache, version, {**BASE_FILES, "vllm/utils.py": UTILS.replace(old, new)})


def test_each_patch_is_classified_and_nothing_changes(root, cache):
    repo = make_series(
        root,
        [
            ("vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Kernel] Change f10"),
            ("vllm/new.py", "NEW = 1\n", "[Core] Add new module"),
        ],
    )
    head, state = git.rev(repo, "HEAD"), (root / ".work" / "state.json").read_bytes()
    release(cache, "0.0.2", "return 12\n", "return 1200\n")  # outside the hunk's context
    release(cache, "0.0.3", "return 11\n", "return 1100\n")  # in its context: 3-way
    release(cache, "0.0.4", "return 10\n", "return -10\n")  # the changed line itself
    lines: list[str] = []
    results = rebase_check.check(
        root, ["vllm==0.0.4", "vllm==0.0.2", "vllm==0.0.3"], log=lines.append
    )
    assert [r.version for r in results] == ["0.0.2", "0.0.3", "0.0.4"]
    assert [[p.how for p in r.patches] for r in results] == [
        ["clean", "clean"],
        ["3-way", "clean"],
        ["conflict", "clean"],
    ]
    assert results[2].patches[0].files == {"vllm/utils.py": "1 conflict hunk(s)"}
    out = "\n".join(lines)
    assert "rebase --check vllm==0.0.4: 1 of 2 patch(es) conflict" in out
    assert "newest release the series takes without a conflict: 0.0.3" in out
    # Nothing of the user's moved: same HEAD, same state, no worktree left.
    assert git.rev(repo, "HEAD") == head and not git.dirty_files(repo)
    assert (root / ".work" / "state.json").read_bytes() == state
    assert git.git(repo, "worktree", "list").count("\n") == 1
    assert not list((root / ".work").glob("check-*"))


def test_check_without_a_work_tree_reads_the_patch_files(root, cache):
    make_series(root)
    release(cache, "0.0.2", "return 12\n", "return 1200\n")
    (root / ".work" / "state.json").unlink()
    results = rebase_check.check(root, ["vllm==0.0.2"], log=quiet)
    assert [p.name for p in results[0].patches] == series.read_series(root)


def test_a_check_left_by_a_killed_one_is_removed_and_said(root, cache):
    repo = make_series(root)
    release(cache, "0.0.2", "return 12\n", "return 1200\n")
    # What a check killed before its cleanup leaves: its worktree, registered
    # in the work tree's repository, named after a process that is gone.
    left = root / ".work" / "check-20260101-000000-999999999"
    git.git(repo, "worktree", "add", "-q", "--detach", str(left), "HEAD")
    lines: list[str] = []
    rebase_check.check(root, ["vllm==0.0.2"], log=lines.append)
    assert not left.exists()
    assert git.git(repo, "worktree", "list").count("\n") == 1
    assert f"removed {left}, left by a check that was killed (pid 999999999)" in "\n".join(lines)


def fresh_clone(root: Path, dest: Path) -> Path:
    """``root``'s patch files and pin alone, as a fresh clone has them: no
    work tree yet, so none of the blobs the patches were made from."""
    shutil.copytree(root / "patches", dest / "patches")
    shutil.copy(root / "pin.toml", dest / "pin.toml")
    return dest


def test_a_fresh_clone_gets_the_verdicts_of_an_applied_series(root, cache, tmp_path):
    """git am --3way merges only from the blobs a patch's index lines name; the
    check makes them itself (the pin's base and the series in a throwaway
    index), so a fresh clone sees what a work tree after apply sees, and
    keeps no ref or work tree of it."""
    make_series(
        root,
        [
            ("vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Kernel] Change f10"),
            ("vllm/utils.py", UTILS.replace("return 10\n", "return 1001\n"), "[Kernel] Again f10"),
        ],
    )
    release(cache, "0.0.3", "return 11\n", "return 1100\n")  # in the hunks' context: 3-way
    applied = rebase_check.check(root, ["vllm==0.0.3"], log=quiet)
    fresh = fresh_clone(root, tmp_path / "fresh")
    lines: list[str] = []
    results = rebase_check.check(fresh, ["vllm==0.0.3"], log=lines.append)
    assert [p.how for p in results[0].patches] == ["3-way", "3-way"]
    assert results == applied
    assert "patch does not apply" not in "\n".join(lines)
    repo = series.work_repo(fresh)
    refs = git.git(repo, "for-each-ref", "--format=%(refname)").split()
    assert refs == ["refs/series/base/0.0.1", "refs/series/base/0.0.3"]
    assert git.git(repo, "worktree", "list").count("\n") == 1
    assert not (fresh / ".work" / "state.json").exists()


def test_a_file_upstream_deleted_or_renamed_is_said(root, cache):
    make_series(
        root,
        [("vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Kernel] Change f10")],
    )
    gone = {k: v for k, v in BASE_FILES.items() if k != "vllm/utils.py"}
    add_release(cache, "0.0.5", gone)
    add_release(cache, "0.0.6", {**gone, "vllm/helpers.py": UTILS.replace("return 11", "return 1")})
    results = rebase_check.check(root, ["vllm==0.0.5", "vllm==0.0.6"], log=quiet)
    assert results[0].patches[0].files == {
        "vllm/utils.py": "deleted upstream, the patch changes it"
    }
    # A rename git's merge finds, it follows (the patch lands in the new file);
    # one it does not is named from the bases' rename detection.
    assert results[1].patches[0].how == "3-way"
    repo = series.work_repo(root)
    old, new = base.base_ref("0.0.1"), base.base_ref("0.0.6")
    moved = rebase_check.renamed_upstream(repo, old, new, ["vllm/utils.py", "setup.py"])
    assert moved == {"vllm/utils.py": "vllm/helpers.py"}
    assert (
        rebase_check.describe({1, 3}, 0, moved["vllm/utils.py"])
        == "renamed upstream to vllm/helpers.py, the patch changes it"
    )


def test_a_patch_that_does_not_apply_names_its_files(root, cache, tmp_path):
    make_series(
        root,
        [("vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Kernel] Change f10")],
    )
    # Its index line names a blob that no repository has: no 3-way merge.
    (patch,) = (root / "patches").glob("0001-*.patch")
    text = patch.read_text()
    line = next(x for x in text.splitlines() if x.startswith("index "))
    patch.write_text(text.replace(line, "index 0123456789ab..ba9876543210 100644"))
    release(cache, "0.0.3", "return 11\n", "return 1100\n")
    lines: list[str] = []
    (result,) = rebase_check.check(root, ["vllm==0.0.3"], log=lines.append)
    assert result.patches[0].how == "conflict"
    assert result.patches[0].files == {
        "vllm/utils.py": "could not be merged (patch does not apply)"
    }
    assert "      vllm/utils.py: could not be merged (patch does not apply)" in lines


def test_a_range_that_matches_one_release_still_names_the_newest(root, cache, monkeypatch):
    make_series(
        root,
        [("vllm/utils.py", UTILS.replace("return 10\n", "return 1000\n"), "[Kernel] Change f10")],
    )
    release(cache, "0.0.2", "return 12\n", "return 1200\n")
    index(monkeypatch, "0.0.1", "0.0.2")
    lines: list[str] = []
    rebase_check.check(root, ["vllm>0.0.1"], log=lines.append)
    assert "rebase --check: newest release the series takes without a conflict: 0.0.2" in lines
    lines.clear()
    rebase_check.check(root, ["vllm==0.0.2"], log=lines.append)
    assert not any("newest release" in line for line in lines)  # one release, its own answer


# --- what a range or a typo says (issue 39: each says what to do next) --------------


def index(monkeypatch, *on_index: str) -> list[str]:
    """The package index holds ``on_index``; returns the specifiers asked for."""
    # pytest's own dependency: importing pip here would, on Python 3.11, turn
    # setuptools' distutils off for the rest of the worker (see test_base.py).
    from packaging.specifiers import SpecifierSet

    asked: list[str] = []

    def releases(specifier: str) -> list[str]:
        asked.append(specifier)
        return [v for v in on_index if v in SpecifierSet(specifier)]

    monkeypatch.setattr(rebase_check, "releases", releases)
    return asked


def test_a_range_past_the_newest_release_names_it_and_the_pin(monkeypatch):
    index(monkeypatch, "0.32.0", "0.33.0")
    with pytest.raises(ToolkitError) as e:
        rebase_check.targets(["vllm>0.33"], pin="0.33.0")
    message = str(e.value)
    assert "matches 'vllm>0.33': the newest on the index is 0.33.0, the series' pin" in message
    assert "nothing to rebase onto until a newer release is out" in message
    assert "\n" not in message


def test_a_range_with_no_match_below_the_newest_points_at_the_newest(monkeypatch):
    index(monkeypatch, "0.33.0", "0.34.1")
    with pytest.raises(ToolkitError) as e:
        rebase_check.targets(["vllm>0.34.1"], pin="0.33.0")
    assert "the newest on the index is 0.34.1 and the series is on 0.33.0" in str(e.value)
    assert "try `nox -s rebase -- --check vllm==0.34.1`" in str(e.value)


@pytest.mark.parametrize(
    "spec, fix",
    [("vllm=0.33.0", "(one release: 'vllm==0.33.0')"), ("vllm>=0.3,<<1", ""), ("vllm>", "")],
)
def test_an_invalid_specifier_is_one_line_with_the_form(monkeypatch, spec, fix):
    asked = index(monkeypatch, "0.33.0")
    with pytest.raises(ToolkitError) as e:
        rebase_check.targets([spec], pin="0.33.0")
    message = str(e.value)
    assert message.startswith(
        f"--check: {spec!r} is not a version specifier{' ' + fix if fix else ''}"
    )
    assert message.endswith("it takes vllm==VERSION or a range such as 'vllm>=0.27,<=0.33'")
    assert "\n" not in message and not asked  # refused before asking the index


def test_a_valid_range_asks_the_index_for_it(monkeypatch):
    asked = index(monkeypatch, "0.31.0", "0.32.0", "0.33.0")
    assert rebase_check.targets(["vllm>=0.32,<=0.33"], pin="0.33.0") == ["0.32.0", "0.33.0"]
    assert asked == [">=0.32,<=0.33"]
