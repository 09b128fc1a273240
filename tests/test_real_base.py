"""Integration on the real pinned base: vLLM sdists from the package index.

These download vLLM 0.25.0, 0.26.0 (about 38 MB each, the rebase fixtures'
releases) and the pin's release (0.33.0, 47 MB) once into the toolkit's
cache and reuse them afterwards.
"""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO_ROOT, quiet
from serieskit import git, status
from serieskit.errors import ToolkitError
from serieskit.pr import branches
from serieskit.pr.groups import read_groups
from serieskit.series import apply, base, export, series, target
from serieskit.upstream import rebase

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "patches"
V25 = base.Pin(
    "0.25.0",
    "7e04e2b37164de8c4012f27f75af6c4768039b32610865e9b6fb8c49c34a84aa",
    "99e7bcdde8efe309b449cb9c3c8e04075b882a00",
)
V26_COMMIT = "732efffa7103d31b2e64f5fa5aedc824c5ce8949"  # the base commit of vLLM 0.26.0's sdist
V26 = ("0.26.0", None, V26_COMMIT)  # (version, sha256, commit): a rebase names no sha256


@pytest.fixture(autouse=True)
def shared_cache(monkeypatch):
    monkeypatch.delenv("VLLM_SERIES_CACHE", raising=False)
    monkeypatch.setenv("VLLM_SERIES_QUIET", "1")


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """A repository that holds each real base the tests need, each imported
    from its sdist once (10 to 15 s each) by ensure_base, which checks the
    base commit against the one given. A test's work tree borrows them
    (:func:`borrow`): apply and rebase then find the base in place, as on a
    second run; the import itself is test_pinned_base_is_the_pinned_commit's."""
    repo = tmp_path_factory.mktemp("bases") / "repo"
    made: dict[str, tuple[str, str]] = {}

    def get(version: str, sha256: str | None, commit: str | None) -> tuple[str, str]:
        if version not in made:
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("VLLM_SERIES_CACHE", raising=False)
                mp.setenv("VLLM_SERIES_QUIET", "1")
                made[version] = base.ensure_base(repo, version, sha256, commit, log=quiet)
        return made[version]

    get.repo = repo  # type: ignore[attr-defined]
    return get


def borrow(root, bases, *pins) -> None:
    """``root``'s work repository with the bases of ``pins`` (a Pin, or
    (version, sha256, commit)) in place: their objects through git's
    alternates, their refs as ensure_base writes them."""
    pins = tuple((p.version, p.sha256, p.commit) if isinstance(p, base.Pin) else p for p in pins)
    for version, sha256, commit in pins:
        bases(version, sha256, commit)
    work = series.work_repo(root)
    base.ensure_repo(work)
    alternates = work / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(f"{bases.repo / '.git' / 'objects'}\n")
    for version, _, _ in pins:
        ref = base.base_ref(version)
        git.git(work, "update-ref", ref, git.rev(bases.repo, ref) or "")


def make_root(tmp_path, pin: base.Pin | None, fixtures: list[str]):
    root = tmp_path / "root"
    (root / "patches").mkdir(parents=True)
    if pin is None:
        shutil.copy(REPO_ROOT / "pin.toml", root / "pin.toml")
        names = series.read_series(REPO_ROOT)
        for name in names:
            shutil.copy(REPO_ROOT / "patches" / name, root / "patches" / name)
    else:
        base.write_pin(root, pin)
        names = []
    for i, fixture in enumerate(fixtures, len(names) + 1):
        name = f"{i:04d}-{fixture.split('/')[1]}"  # format-patch's own naming
        shutil.copy(FIXTURES / fixture, root / "patches" / name)
        names.append(name)
    (root / "patches" / "series").write_text("".join(n + "\n" for n in names))
    return root


def test_pinned_base_is_the_pinned_commit(bases):
    pin = base.read_pin(REPO_ROOT)
    commit, sha = bases(pin.version, pin.sha256, pin.commit)
    assert commit == pin.commit and sha == pin.sha256


def test_series_plus_fixture_round_trips_byte_for_byte(tmp_path, bases):
    pin = base.read_pin(REPO_ROOT)  # the fixture as exported on the pin
    root = make_root(tmp_path, None, [f"{pin.version}/Misc-Fixture-note-in-the-README.patch"])
    borrow(root, bases, pin)
    before = {p.name: p.read_bytes() for p in (root / "patches").iterdir()}
    apply.apply(root, log=quiet)
    assert export.export(root, log=quiet) == []
    assert {p.name: p.read_bytes() for p in (root / "patches").iterdir()} == before


def test_every_pr_group_of_the_series_applies_alone(tmp_path, bases):
    """Each [[pr]] of the manifest builds on its base: the lower PR's commits,
    then its own, taken out of the interleaved series (0006 after 0003-0005)."""
    pytest.importorskip("git")  # GitPython, as the pr session installs it
    root = make_root(tmp_path, None, [])
    borrow(root, bases, base.read_pin(REPO_ROOT))
    shutil.copy(REPO_ROOT / "patches" / "manifest.toml", root / "patches" / "manifest.toml")
    apply.apply(root, log=quiet)
    groups = read_groups(root)
    built = branches.build_branches(
        target.pin(root),
        series.work_repo(root),
        groups,
        "Example Contributor <contributor@example.com>",
        None,
        log=quiet,
    )
    assert {name: b.problems for name, b in built.items()} == {g.name: [] for g in groups}
    for g in groups:
        assert len(built[g.name].own) == len(g.patches), g.name


def test_rebase_from_0_25_onto_0_26_writes_range_diff(tmp_path, bases):
    root = make_root(tmp_path, V25, ["0.25.0/Misc-Fixture-note-in-ubatching.patch"])
    borrow(root, bases, V25, V26)
    apply.apply(root, log=quiet)
    report = rebase.start(root, "vllm==0.26.0", log=quiet)
    text = report.read_text()
    assert "vLLM 0.25.0 -> 0.26.0" in text
    assert "1 unchanged" in text and "[Misc] Fixture: note in ubatching" in text
    repo = series.work_repo(root)
    assert git.rev(repo, "HEAD~1") == V26_COMMIT


def test_conflicting_rebase_stops_then_aborts_with_nothing_lost(tmp_path, bases):
    root = make_root(
        tmp_path,
        V25,
        [
            "0.25.0/Misc-Fixture-note-in-ubatching.patch",
            "0.25.0/Misc-Fixture-field-where-upstream-adds-one.patch",
        ],
    )
    borrow(root, bases, V25, V26)
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    head = git.rev(repo, "HEAD")
    lines = []
    with pytest.raises(ToolkitError, match="stopped at a conflict"):
        rebase.start(root, "vllm==0.26.0", log=lines.append)
    out = "\n".join(lines)
    assert "onto 0.26.0, stopped at patch 2/2" in out
    assert "files:  vllm/config/kernel.py" in out
    rebase.abort(root, log=quiet)
    assert git.rev(repo, "HEAD") == head and not git.dirty_files(repo)
    assert status.status(root, log=quiet)["differ"] == []


def test_unknown_release_is_one_clear_line(tmp_path):
    with pytest.raises(ToolkitError) as e:
        base.fetch_sdist("0.0.0")
    assert str(e.value) == (
        "vLLM 0.0.0 has no source distribution (vllm-0.0.0.tar.gz) on pip's configured index"
    )
