"""rebase --check: a dry run per patch (clean / 3-way / conflict) that changes nothing."""

from __future__ import annotations

from test_series import make_series

from conftest import BASE_FILES, add_release, quiet
from serieskit import git
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
