"""rebase --check: a dry run per patch (clean / 3-way / conflict) that changes nothing."""

from __future__ import annotations

import pytest
from test_series import make_series

from conftest import BASE_FILES, add_release, quiet
from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.series import series
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
    assert results[2].patches[0].files == {"vllm/utils.py": 1}
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
