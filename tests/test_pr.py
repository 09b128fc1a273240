"""nox -s pr: stacked, re-signed branches; bodies from the target tree's
template and results-file claims; the duplicate check; --check."""

from __future__ import annotations

import json
from pathlib import Path

import git as gitpython
import pytest

from conftest import BASE_FILES, add_release, base_commit, quiet
from serieskit import git, results
from serieskit.checks import lint, runner
from serieskit.errors import ToolkitError
from serieskit.pr import bodycheck, branches, claims, coverage, duplicates, evidence, pr, prbody
from serieskit.pr.groups import read_groups
from serieskit.series import apply, base, export, series
from serieskit.state import State

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pr"
WHO = "Example Contributor <contributor@example.com>"
PLACEHOLDER = "Signed-off-by: vLLM series <series@vllm-series.invalid>"
CO_AUTHOR = "Original Author <original@example.org>"

KERNEL_A = (
    "class KernelConfig:\n    a = 1\n    b = 2\n    c = 3\n\n"
    "    def host_reduce_limit(self):\n        return 256\n"
)
KERNEL_C = KERNEL_A.replace("c = 3\n", "c = 3\n    overlap_min_tokens = 0\n")

# (manifest name, files, subject): the toolkit-only patch first, as in the real series
PATCHES = [
    ("tool", {"docs/ref.md": "# reference\n"}, "[CI] Generated reference"),
    (
        "a1",
        {
            "vllm/config/kernel.py": KERNEL_A,
            "docs/ref.md": "# reference\nhost_reduce\n",
            "tests/test_a.py": "def test_a():\n    pass\n",
        },
        "[Kernel] Host reduce, kernel mode",
    ),
    (
        "c1",
        {
            "vllm/config/kernel.py": KERNEL_C,
            "vllm/overlap.py": "def overlap_halves():\n    return 2\n",
            "tests/test_c.py": "def test_c():\n    pass\n",
        },
        "[Perf] Overlap in two halves",
    ),
    (
        "a2",
        {"vllm/host_reduce.py": "def copy_engine_mode():\n    return 1\n"},
        "[Kernel] Copy-engine mode",
    ),
    # In no pull request and after them all (as options for a sweep): not
    # picked, and the file it shares with a2 stays in a2's commit as is.
    (
        "trail",
        {"vllm/host_reduce.py": "def copy_engine_mode(option=0):\n    return 1\n"},
        "[Kernel] An option for a sweep",
    ),
]


def manifest(groups: str) -> str:
    entries = "".join(
        f'[[patch]]\nname = "{n}"\nseed = "x"\nsummary = "x"\nconfig = []\n'
        f"tests = {[f for f in files if f.startswith('tests/')]}\n\n"
        for n, files, _ in PATCHES
    )
    return entries.replace("'", '"') + groups


GROUPS = """
[[pr]]
name = "host"
title = "[Kernel] Host reduce"
patches = ["a1", "a2"]
text = "overview/host.md"
keywords = ["all-reduce", "copy engine"]

[pr.contract]
defaults = "off by default"
commands = ["python bench.py"]

[[pr.claim]]
file = "results/bench.json"
path = "figures['copy_ms'].value"
label = "copy-engine mode, time per call"
unit = "ms"
machine = "2 x NVIDIA H200"

[[pr.path]]
path = "host reduce"
format = "FP16"
conditions = "two ranks"
expected = "kernel mode; else NCCL"
executed = "tests/test_a.py"
unverified = "Turing"

[[pr]]
name = "overlap"
title = "[Perf] Overlap in two halves"
patches = ["c1"]
depends = ["host"]
text = "overview/overlap.md"

[[pr.claim]]
file = "results/bench.json"
path = "figures['copy_ms'].value"
label = "copy-engine mode beside the halves"
unit = "ms"
machine = "2 x NVIDIA H200"
"""


def make_root(
    tmp_path: Path,
    cache: Path,
    template: str,
    groups: str = GROUPS,
    extra: dict[str, str] | None = None,
) -> Path:
    """A toolkit root on a synthetic release carrying ``template`` (and the
    ``extra`` files), with the series PATCHES applied and exported, and a
    fresh results file."""
    files = dict(BASE_FILES, **(extra or {}))
    files[".github/PULL_REQUEST_TEMPLATE.md"] = (FIXTURES / template).read_text()
    sha = add_release(cache, "0.0.2", files)
    root = tmp_path / "root"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("")
    commit = base_commit(cache / "vllm-0.0.2.tar.gz", "0.0.2", sha)
    base.write_pin(root, base.Pin("0.0.2", sha, commit))
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    env = {
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "1700000000 +0000",
    }
    for name, changes, subject in PATCHES:
        for path, text in changes.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
            git.git(repo, "add", path)
        git.git(
            repo,
            "commit",
            "-q",
            "-m",
            subject,
            "-m",
            "Why: a test.",
            "-m",
            f"{PLACEHOLDER}\n{series.NAME_TRAILER}: {name}",
            env=env,
        )
    (root / "patches" / "manifest.toml").write_text(manifest(groups))
    export.export(root, log=quiet)
    (root / "overview").mkdir()
    for g in ("host", "overlap"):
        (root / "overview" / f"{g}.md").write_text(
            f"## Overview\n\nThe {g} change.\n\n## Details\n\n- {g} details.\n"
        )
    write_results(root, "results/bench.json")
    return root


def write_results(root: Path, name: str, files: dict | None = None) -> None:
    repo = series.work_repo(root)
    head = gitpython.Repo(repo).commit("HEAD")
    changed = git.git(repo, "diff", "--name-only", State.load(root).base, "HEAD").split()
    blobs = {p: (head.tree / p).hexsha for p in changed}
    data = {
        "schema": claims.SCHEMA,
        "kind": "bench",
        "date": "2026-11-30",
        "machine": {"name": "2 x NVIDIA H200", "label": "H200 figure"},
        "series": {
            "base": "vllm==0.0.2",
            "commit": head.hexsha,
            "tree": head.tree.hexsha,
            "files": blobs if files is None else files,
        },
        "figures": {
            "copy_ms": {"value": 0.598, "unit": "ms", "label": "x", "from": "x"},
            "nccl_ms": {"value": 0.746, "unit": "ms", "label": "y", "from": "y"},
        },
    }
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(json.dumps(data))


TEMPLATES = ["PULL_REQUEST_TEMPLATE-0.26.0.md", "PULL_REQUEST_TEMPLATE-0.33.0.md"]


@pytest.fixture(params=TEMPLATES)
def each_template_root(request, tmp_path, cache) -> Path:
    """A root per template: where the body's blocks go depends on the template."""
    return make_root(tmp_path, cache, request.param)


@pytest.fixture
def proot(tmp_path, cache) -> Path:
    """A root on the newer template. What a block says does not depend on the
    template (prbody.render makes every block, then fill places them):
    test_every_block_has_one_place_in_each_template and
    test_body_follows_the_target_tree_template hold the placing for both."""
    return make_root(tmp_path, cache, TEMPLATES[-1])


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_block_has_one_place_in_each_template(template):
    names = {n for section in prbody.SECTIONS.values() for n in section}
    body = prbody.fill((FIXTURES / template).read_text(), {n: f"<<{n}>>" for n in names})
    assert {n: body.count(f"<<{n}>>") for n in names} == dict.fromkeys(names, 1), body


def run(root: Path, **kw) -> dict:
    kw.setdefault("signoff", WHO)
    return pr.session(root, None, log=quiet, **kw)


def test_stacked_branches_re_signed_without_the_toolkit_files(proot):
    run(proot)
    repo = gitpython.Repo(series.work_repo(proot))
    host = repo.commit("refs/series/pr/host/v1")
    upper = repo.commit("refs/series/pr/overlap/v1")
    assert [
        c.summary for c in repo.iter_commits(f"{State.load(proot).base}..{upper}", reverse=True)
    ] == [
        "[Kernel] Host reduce, kernel mode",
        "[Kernel] Copy-engine mode",
        "[Perf] Overlap in two halves",
    ]  # the lower PR's commits first, in its order
    assert repo.is_ancestor(host, upper)
    for c in repo.iter_commits(f"{State.load(proot).base}..{upper}"):
        assert (c.author.name, c.author.email) == ("Example Contributor", "contributor@example.com")
        assert c.committer.email == "contributor@example.com"
        assert c.message.count(f"Signed-off-by: {WHO}") == 1
        assert PLACEHOLDER not in c.message and series.NAME_TRAILER not in c.message
        with pytest.raises(KeyError):
            c.tree / "docs/ref.md"  # the toolkit-only patch's file is left out
    # A patch in no pull request after every grouped one is only not picked.
    assert (host.tree / "vllm/host_reduce.py").data_stream.read() == (
        b"def copy_engine_mode():\n    return 1\n"
    )
    # The picks ran in a worktree holding the series' files only; the commits
    # are whole trees all the same, and the work repository's settings are
    # as they were.
    base_tree = repo.commit(State.load(proot).base).tree
    assert {b.path for b in base_tree.traverse() if b.type == "blob"} <= {
        b.path for b in upper.tree.traverse() if b.type == "blob"
    }
    assert (upper.tree / "vllm/utils.py").hexsha == (base_tree / "vllm/utils.py").hexsha
    assert git.run(
        series.work_repo(proot), "config", "--get", "extensions.worktreeConfig"
    ).returncode
    body = (proot / ".work/pr/overlap/body.md").read_text()
    assert f"git log {host.hexsha[:12]}..{upper.hexsha[:12]}" in body
    assert "Please review only the last 1 commit(s)" in body
    # its own test files, once each; not those of the pull request it stacks on
    assert body.count("tests/test_c.py") == 1 and "tests/test_a.py" not in body
    # the toolkit-only files are the toolkit's business, not the reviewer's
    assert "docs/ref.md" not in (proot / ".work/pr/host/body.md").read_text()
    checks = json.loads((proot / ".work/pr/host/check.json").read_text())["checks"]
    assert all(c["ok"] in (True, None) for c in checks), checks
    assert (proot / ".work/pr/host/title.txt").read_text() == "[Kernel] Host reduce\n"


def test_body_follows_the_target_tree_template(each_template_root):
    proot = each_template_root
    run(proot)
    body = (proot / ".work/pr/host/body.md").read_text()
    template = (series.work_repo(proot) / pr.TEMPLATE).read_text()
    headings = [line for line in template.splitlines() if line.startswith("## ")]
    assert headings and [line for line in body.splitlines() if line.startswith("## ")] == headings
    assert pr.empty_sections(body) == []
    assert template.splitlines()[-1] in body  # the checklist and footer stay
    assert "PLEASE FILL IN" not in body  # the template's instruction goes
    assert "0.598 ms" in body and "results/bench.json" not in body  # a file the reviewer lacks
    assert "two NVIDIA H200: H200 results, not Turing or Volta ones" in body
    assert "Targets vLLM 0.0.2" in body and "Not yet checked against upstream `main`" in body
    assert body.count("python -m pytest tests/test_a.py") == 1
    assert "| host reduce | FP16 | two ranks |" in body
    assert "How it is switched and measured" in body and "python bench.py" in body
    if "## Claims" in template:  # 0.33.0: the figures go under Claims
        claims_part = body.split("## Claims")[1].split("## Validation")[0]
        assert "0.598 ms" in claims_part


def test_test_results_come_from_runs_on_the_pr_s_base(proot):
    """A port's run on another release is not evidence for this branch."""
    for name, ran_on, passed in (("ours", "vllm==0.0.2", 7), ("port", "vllm==9.9.9", 5)):
        data = {
            "schema": claims.SCHEMA,
            "kind": "tests",
            "date": "2026-12-01",
            "machine": {"name": f"{name} machine", "gpu": f"GPU {name}", "gpus": 1},
            "series": {"base": ran_on, "commit": None, "tree": None, "files": {}},
            "test_files": {
                "tests/test_a.py": {"passed": passed, "failed": 0, "skipped": 0, "errors": 0}
            },
            "command": f"pytest on {name}",
            "figures": {},
        }
        (proot / f"results/tests_{name}.json").write_text(json.dumps(data))
    run(proot)
    body = (proot / ".work/pr/host/body.md").read_text()
    row = next(x for x in body.splitlines() if x.startswith("| `tests/test_a.py` |"))
    assert "one GPU ours" in row and "| 7 | 0 | 0 |" in row
    assert "GPU port" not in body and "tests_" not in body


def test_stale_missing_and_wrong_claims_fail_check(proot):
    repo = series.work_repo(proot)
    head = gitpython.Repo(repo).commit("HEAD")
    fresh = {
        p: (head.tree / p).hexsha
        for p in ("vllm/host_reduce.py", "tests/test_a.py", "vllm/overlap.py", "tests/test_c.py")
    }
    write_results(proot, "results/bench.json", files=fresh | {"vllm/config/kernel.py": "0" * 40})
    with pytest.raises(ToolkitError) as e:
        run(proot, check=True)
    assert (
        "host: claims: stale: results/bench.json ran on a series where "
        "vllm/config/kernel.py changed since the run"
    ) in str(e.value)
    body = (proot / ".work/pr/host/body.md").read_text()  # the reviewer reads words
    assert "an earlier revision of this change (to be re-run on this one)" in body
    assert "stale" not in body and "check.json" not in body
    # the change named with a reason is accepted, and the body says why
    ack = '[pr.changed_since."results/bench.json"]\n"vllm/config/kernel.py" = "a docstring"\n'
    text = (proot / "patches/manifest.toml").read_text()
    text = text.replace("[[pr.path]]", ack + "\n[[pr.path]]", 1) + "\n" + ack
    (proot / "patches/manifest.toml").write_text(text)
    assert run(proot, check=True)
    assert "`vllm/config/kernel.py`: a docstring" in (proot / ".work/pr/host/body.md").read_text()
    (proot / "patches/manifest.toml").write_text(text.replace(ack, ""))
    write_results(proot, "results/bench.json", files=fresh)  # kernel.py as on the base
    with pytest.raises(ToolkitError, match="kernel.py was not changed by the series that ran"):
        run(proot, check=True)
    (proot / "results/bench.json").unlink()
    with pytest.raises(ToolkitError, match="results/bench.json does not exist"):
        run(proot, check=True)
    write_results(proot, "results/bench.json")
    (proot / "patches/manifest.toml").write_text(
        (proot / "patches/manifest.toml").read_text().replace("['copy_ms']", "['nope']")
    )
    with pytest.raises(ToolkitError, match=r"the path figures\['nope'\].value is missing"):
        run(proot, check=True)
    assert git.rev(repo, "refs/series/pr/host/v1")


def test_duplicate_check_names_the_overlapping_pr(proot, tmp_path):
    others = tmp_path / "others"
    others.mkdir()
    # 17 changes the same function of the same file, differently: overlap and conflict
    (others / "17.diff").write_text(
        "diff --git a/vllm/config/kernel.py b/vllm/config/kernel.py\n"
        "--- a/vllm/config/kernel.py\n+++ b/vllm/config/kernel.py\n"
        "@@ -1,4 +1,6 @@ class KernelConfig:\n class KernelConfig:\n"
        "     a = 1\n     b = 2\n     c = 3\n+\n+    def host_reduce_limit(self):\n"
    )
    (others / "17.diff").write_text(
        (others / "17.diff").read_text().replace("@@ -1,4 +1,6 @@", "@@ -1,4 +1,6 @@") + ""
    )
    (others / "18.diff").write_text(
        "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n"
        "@@ -1 +1 @@\n-print('setup')\n+print('set up')\n"
    )
    (others / "list.json").write_text(
        json.dumps(
            [
                {
                    "number": 17,
                    "title": "Topology-aware all-reduce",
                    "body": "uses the copy engine",
                },
                {"number": 18, "title": "Typo"},
            ]
        )
    )
    run(proot, others=others)
    body = (proot / ".work/pr/host/body.md").read_text()
    line = next(x for x in body.splitlines() if x.startswith("- #17"))
    assert "Topology-aware all-reduce" in line
    assert "same files `vllm/config/kernel.py`" in line
    assert "their changed lines name `host_reduce_limit`" in line
    assert "merge: conflicts in `vllm/config/kernel.py`" in line
    assert "keywords all-reduce, copy engine" in line
    assert "- #18" not in body and "No overlap of any kind with the other 1 PR(s)" in body
    # a Python function both change: the AST of our base names it
    repo = series.work_repo(proot)
    start = State.load(proot).base
    us, found = duplicates.check_all(
        repo, start, git.rev(repo, "refs/series/pr/host/v1"), start, [], others
    )
    assert (
        "KernelConfig" in us.functions["vllm/config/kernel.py"]
        or "KernelConfig.host_reduce_limit" in us.functions["vllm/config/kernel.py"]
    )
    assert found[0].number == "17" and found[0].functions


def test_stack_over_the_limit_and_bad_title_fail_check(tmp_path, cache):
    chain = "".join(
        f'\n[[pr]]\nname = "g{i}"\ntitle = "[Core] Part {i}"\npatches = []\n'
        f'text = "overview/host.md"\n' + (f'depends = ["g{i - 1}"]\n' if i else "")
        for i in range(6)
    )
    groups = GROUPS.replace(
        'title = "[Perf] Overlap in two halves"', 'title = "Overlap"'
    ) + chain.replace('depends = ["g-1"]\n', "")
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md", groups)
    with pytest.raises(ToolkitError) as e:
        run(root, check=True)
    msg = str(e.value)
    assert "at most 6 pull requests in a stack: 8 pull requests in the set" in msg
    assert "'Overlap' fails vLLM's title check" in msg


def test_versions_and_range_diff(tmp_path, cache):
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md")
    run(root)
    run(root)  # unchanged: the same version, v1
    repo = series.work_repo(root)
    assert git.rev(repo, "refs/series/pr/host/v2") is None
    assert "v1: no previous version" in (root / ".work/pr/host/range-diff.txt").read_text()
    run(root, signoff="Other Person <other@example.com>")
    assert git.rev(repo, "refs/series/pr/host/v2")
    assert "Other Person" in (root / ".work/pr/host/range-diff.txt").read_text()
    with pytest.raises(ToolkitError, match="exists with other commits"):
        run(root, version=1, signoff="Third Person <third@example.com>")


def test_resign_message_and_arguments(tmp_path, cache):
    msg = f"[Kernel] X\n\nWhy.\n\n{PLACEHOLDER}\n{series.NAME_TRAILER}: x\n"
    once = branches.resign_message(msg, WHO)
    assert once == f"[Kernel] X\n\nWhy.\n\nSigned-off-by: {WHO}\n"
    assert branches.resign_message(once, WHO) == once
    # every earlier sign-off goes (the contributor certifies the branch); the
    # original author is credited once, before the sign-off
    msg = "[Kernel] X\n\nWhy.\n\nSigned-off-by: Maintainers <m@example.org>\n"
    credited = branches.resign_message(msg, WHO, CO_AUTHOR)
    assert credited == (
        f"[Kernel] X\n\nWhy.\n\nCo-authored-by: {CO_AUTHOR}\nSigned-off-by: {WHO}\n"
    )
    assert branches.resign_message(credited, WHO, CO_AUTHOR) == credited
    assert pr.TITLE.match("[Kernel][Attention] Turing prefill")
    assert not pr.TITLE.match("[Kernel]Turing") and not pr.TITLE.match("Turing [Kernel]")
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md")
    with pytest.raises(ToolkitError, match="no series tree for vLLM 0.33.0 yet"):
        pr.session(root, "vllm==0.33.0", WHO, log=quiet)
    with pytest.raises(ToolkitError, match="--signoff takes"):
        pr.session(root, None, "just a name", log=quiet)


def test_json_paths_and_figures():
    data = {"figures": {"a.b": {"value": 1.5}}, "rows": [{"x": 2}]}
    assert claims.resolve(data, "figures['a.b'].value") == 1.5
    assert claims.resolve(data, "rows[0].x") == 2
    with pytest.raises(KeyError, match="'y' is not in rows.0"):
        claims.resolve(data, "rows[0].y")
    assert claims.fmt(0.4394, "fraction") == "43.9 %"
    assert claims.fmt(87449, "MiB") == "87,449 MiB"
    assert pr.empty_sections("## A\n\n<!-- c -->\n\n## B\n\ntext\n") == ["A"]


def test_real_results_files_share_the_schema():
    root = Path(__file__).resolve().parent.parent
    for f in sorted((root / "results").glob("*.json")):
        data = claims.load(root, f"results/{f.name}")
        assert data["machine"]["name"] and data["series"]["base"]
        for name, fig in data["figures"].items():
            assert {"value", "unit", "label"} <= set(fig), (f.name, name)
    for g in read_groups(root):
        for c in g.claims:
            data = claims.load(root, c.file)
            for path in [c.path] + ([c.vs] if c.vs else []):
                assert claims.resolve(data, path) is not None, (g.name, c.label, path)


def test_line_coverage_lists_changed_lines_no_test_executed(tmp_path, cache):
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md")
    repo = series.work_repo(root)
    head = gitpython.Repo(repo).commit("HEAD")
    ran = {
        "commit": head.hexsha,
        "files": {"vllm/config/kernel.py": (head.tree / "vllm/config/kernel.py").hexsha},
    }
    folder = root / ".work/pr/coverage"
    folder.mkdir(parents=True)
    # kernel.py lines 6-7 are the PR's (host_reduce_limit): 6 ran in a test, 7 did
    # not; the run measured the whole series, where the overlap PR's line before
    # them moves them to 7-8
    report = {
        "series": ran,
        "files": {
            str(repo / "vllm/config/kernel.py"): {
                "executed_lines": [1, 2, 7],
                "missing_lines": [8],
                "contexts": {"7": ["tests/test_a.py::test_a|run"]},
            }
        },
    }
    (folder / "cpu.json").write_text(json.dumps(report))
    run(root)
    body = (root / ".work/pr/host/body.md").read_text()
    row = next(x for x in body.splitlines() if x.startswith("| `vllm/config/kernel.py` | cpu |"))
    assert "| 1 / 2 | 7 | tests/test_a.py::test_a\\|run |" in row
    assert "| `vllm/host_reduce.py` | cpu |  | not imported by any test |" in body
    assert "No coverage data from a GPU machine" in body
    # a GPU machine's report of an older kernel.py: its rows say stale
    ran["files"]["vllm/config/kernel.py"] = "0" * 40
    (folder / "h200x2.json").write_text(json.dumps(report))
    run(root)
    body = (root / ".work/pr/host/body.md").read_text()
    row = next(x for x in body.splitlines() if x.startswith("| `vllm/config/kernel.py` | h200"))
    assert f"(measured before the last change of this file (at {head.hexsha[:12]})) |" in row
    assert "No coverage data from a GPU machine" not in body


def test_no_line_coverage_data_claims_nothing(proot):
    run(proot)
    body = (proot / ".work/pr/host/body.md").read_text()
    assert "Line coverage" not in body and "coverage.py" not in body


def test_route_lines_of_the_boots_count_as_evidence(tmp_path, cache):
    groups = GROUPS.replace('unverified = "Turing"', 'unverified = "Turing"\nroute = "HOST_REDUCE"')
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md", groups)
    data = json.loads((root / "results/bench.json").read_text())
    data["boots"] = [
        {"route_lines": ["Using ['HOST_REDUCE', 'PYNCCL']"]},
        {"route_lines": ["Using ['PYNCCL']"]},
    ]
    (root / "results/bench.json").write_text(json.dumps(data))
    run(root)
    assert (
        "route logged in 1 of 2 server boots on two NVIDIA H200"
        in (root / ".work/pr/host/body.md").read_text()
    )


def test_a_branch_that_does_not_apply_fails_check(tmp_path, cache):
    # the overlap without the PR it needs: its kernel.py hunk conflicts on the base
    root = make_root(
        tmp_path,
        cache,
        "PULL_REQUEST_TEMPLATE-0.26.0.md",
        GROUPS.replace('depends = ["host"]\n', ""),
    )
    with pytest.raises(ToolkitError) as e:
        run(root, check=True)
    msg = "overlap: applies to its ref: [Perf] Overlap in two halves does not apply"
    assert msg in str(e.value)
    checks = json.loads((root / ".work/pr/overlap/check.json").read_text())
    assert checks["ref"] is None
    assert git.rev(series.work_repo(root), "refs/series/pr/host/v1")  # the other one is built


# The target tree's own hooks: pygrep needs no environment (offline).
PRECOMMIT = """\
repos:
- repo: local
  hooks:
  - id: no-copy-engine-name
    name: no copy_engine_mode
    entry: copy_engine_mode
    language: pygrep
    files: ^vllm/
  - id: no-f19
    name: the base's own finding
    entry: return 19
    language: pygrep
    files: ^vllm/
"""


def test_check_fails_on_the_target_tree_s_pre_commit(tmp_path, cache):
    pytest.importorskip("pre_commit")
    pytest.importorskip("yaml")
    root = make_root(
        tmp_path,
        cache,
        "PULL_REQUEST_TEMPLATE-0.26.0.md",
        extra={".pre-commit-config.yaml": PRECOMMIT},
    )
    with pytest.raises(ToolkitError) as e:
        run(root, check=True)
    msg = str(e.value)
    # host's own commits add copy_engine_mode; the overlap's (c1) do not, and
    # vllm/utils.py's "return 19" is the base's, in no PR's changed files
    assert "host: pre-commit on the changed files: hook no-copy-engine-name fails" in msg
    assert "overlap: pre-commit" not in msg and "no-f19" not in msg
    log = (root / ".work/pr/host/pre-commit.txt").read_text()
    assert "vllm/host_reduce.py" in log
    checks = json.loads((root / ".work/pr/overlap/check.json").read_text())["checks"]
    assert next(c for c in checks if c["check"].startswith("pre-commit"))["ok"] is True


def test_pre_commit_not_installed_is_not_a_pass_under_check(tmp_path, cache, monkeypatch):
    def missing() -> None:
        raise ToolkitError("lint needs pre_commit: run it through `nox -s lint`")

    monkeypatch.setattr(lint, "require_tools", missing)
    root = make_root(
        tmp_path,
        cache,
        "PULL_REQUEST_TEMPLATE-0.26.0.md",
        extra={".pre-commit-config.yaml": PRECOMMIT},
    )
    run(root)  # without --check: reported as not run
    checks = json.loads((root / ".work/pr/host/check.json").read_text())["checks"]
    pre = next(c for c in checks if c["check"].startswith("pre-commit"))
    assert pre["ok"] is None and pre["detail"].startswith("not run: lint needs pre_commit")
    with pytest.raises(ToolkitError, match="pre-commit on the changed files: not run"):
        run(root, check=True)


def test_push_is_a_separate_step_after_every_check(tmp_path, cache):
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.26.0.md")
    fork = tmp_path / "fork.git"
    git.git(None, "init", "-q", "--bare", str(fork))
    run(root)
    assert git.rev(fork, "refs/heads/series-pr/host-v1") is None  # never by default
    with pytest.raises(ToolkitError, match="--push needs --remote"):
        run(root, push=True)
    run(root, push=True, remote=str(fork))
    repo = series.work_repo(root)
    assert git.rev(fork, "refs/heads/series-pr/host-v1") == git.rev(repo, "refs/series/pr/host/v1")
    assert git.rev(fork, "refs/heads/series-pr/overlap-v1")


def test_line_map_follows_later_changes(tmp_path):
    from conftest import commit_file

    repo = tmp_path / "r"
    git.git(None, "init", "-q", str(repo))
    head = commit_file(repo, "m.py", "a\nb\nc\nd\n", "pr head")
    ran = commit_file(repo, "m.py", "new\na\nB\nc\nd\nmore\n", "a later PR")
    assert coverage.line_map(repo, head, ran, "m.py") == {1: 2, 2: None, 3: 4, 4: 5}


def _claim_fields(text: str, occurrence: str, extra: str) -> str:
    """The manifest ``text`` with ``extra`` lines in the first claim after ``occurrence``."""
    at = text.index(occurrence)
    end = text.index('unit = "ms"\n', at) + len('unit = "ms"\n')
    return text[:end] + extra + text[end:]


def test_a_figure_from_another_base_needs_words_that_say_so(proot):
    """A run on another release is evidence only when its claim says so in
    words naming that release; the body prints them, never "stale"."""
    data = json.loads((proot / "results/bench.json").read_text())
    data["series"]["base"] = "vllm==0.0.1"
    data["machine"] = {
        "name": "2 x NVIDIA H200",
        "gpu": "NVIDIA H200",
        "gpus": 2,
        "p2p": "off (NCCL_P2P_DISABLE=1)",
    }
    (proot / "results/old.json").write_text(json.dumps(data))
    manifest = proot / "patches/manifest.toml"
    plain = manifest.read_text().replace(
        'file = "results/bench.json"', 'file = "results/old.json"', 1
    )
    manifest.write_text(plain)
    with pytest.raises(ToolkitError) as e:
        run(proot, check=True)
    assert "host: claims: results/old.json ran on vLLM 0.0.1, not on vLLM 0.0.2" in str(e.value)
    assert "stale" not in str(e.value)  # no file-by-file comparison across releases
    manifest.write_text(
        _claim_fields(plain, "results/old.json", 'prior = "measured with an earlier version"\n')
    )
    with pytest.raises(ToolkitError, match=r"does not name the base it ran on \(0.0.1\)"):
        run(proot, check=True)
    words = "measured on vLLM 0.0.1 with the earlier version of this change"
    manifest.write_text(_claim_fields(plain, "results/old.json", f'prior = "{words}"\n'))
    run(proot, check=True)
    body = (proot / ".work/pr/host/body.md").read_text()
    row = next(x for x in body.splitlines() if x.startswith("| copy-engine mode, time per call |"))
    assert (
        "| 0.598 ms | two NVIDIA H200 with P2P disabled (`NCCL_P2P_DISABLE=1`): H200 results, "
        f"not Turing or Volta ones; {words}; 2026-11-30 |"
    ) in row
    assert "stale" not in body and "None" not in body
    # prior on a run of the pull request's own base: refused (changed_since or a re-run)
    manifest.write_text(
        _claim_fields(
            _claim_fields(plain, "results/old.json", f'prior = "{words}"\n'),
            "copy-engine mode beside",
            f'prior = "{words}"\n',
        )
    )
    with pytest.raises(
        ToolkitError,
        match="overlap: claims: results/bench.json ran on vLLM 0.0.2, "
        "the base of this pull request: prior labels a figure from another base",
    ):
        run(proot, check=True)
    # a figure from outside any release (the original fork's): words, no version needed
    data["kind"], data["series"]["base"] = "external", "fork main c59b3c4"
    (proot / "results/old.json").write_text(json.dumps(data))
    manifest.write_text(plain)
    with pytest.raises(ToolkitError, match="results/old.json ran on fork main c59b3c4, not on"):
        run(proot, check=True)
    fork = "measured by the original pull request in a fork"
    manifest.write_text(_claim_fields(plain, "results/old.json", f'prior = "{fork}"\n'))
    run(proot, check=True)
    assert f"; {fork}; 2026-11-30 |" in (proot / ".work/pr/host/body.md").read_text()


def test_headline_figures_lead_with_their_machine_and_method(tmp_path, cache):
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.33.0.md")
    extra = (
        'headline = true\nhow = "two processes, median of 100 calls"\n'
        'vs = "figures[\'nccl_ms\'].value"\nvs_label = "NCCL, the same payload"\n'
    )
    text = (root / "patches/manifest.toml").read_text()
    (root / "patches/manifest.toml").write_text(_claim_fields(text, "results/bench.json", extra))
    run(root, check=True)
    claims_part = (root / ".work/pr/host/body.md").read_text().split("## Claims")[1]
    claims_part = claims_part.split("## Validation")[0]
    first = next(x for x in claims_part.splitlines() if x.startswith("- "))
    assert first == (
        "- copy-engine mode, time per call: **0.598 ms**; NCCL, the same payload: **0.746 ms** "
        "(1.2x faster). Two processes, median of 100 calls. On two NVIDIA H200: H200 results, "
        "not Turing or Volta ones; vLLM 0.0.2; 2026-11-30."
    )
    assert "| copy-engine mode, time per call |" not in claims_part  # not twice


def test_body_reads_without_this_repository(tmp_path, cache):
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.33.0.md")
    said: list[str] = []
    pr.session(root, None, WHO, log=said.append)
    body = (root / ".work/pr/host/body.md").read_text()
    # what only a person can vouch for is the contributor's: no box ticked
    # for them, one line saying what is left, each statement asked for once
    assert "- [x]" not in body
    for item in ("Design Fit", "Testing and Validation", "Code Quality and Style"):
        assert f"- [ ] **{item}:**" in body
    assert "- [ ] AI assistance was used during the creation of this PR." in body
    assert body.count("**Left to the contributor:**") == 1
    details = body.split("## Details")[1]
    for label in ("Tests I ran locally", "AI assistance", "Not a duplicate"):
        assert details.count(f"- {label}: [contributor: ") == 1
    left = "the checklist's 6 boxes; Tests I ran locally; AI assistance; Not a duplicate"
    assert bodycheck.left(body) == left
    assert f"pr host: left to you in body.md: {left}" in said
    checks = json.loads((root / ".work/pr/host/check.json").read_text())["checks"]
    assert all(c["ok"] in (True, None) for c in checks), checks
    # the group's text in this project's words, naming files the reviewer does not have
    (root / "overview/host.md").write_text(
        "## Overview\n\nThe seed's kernel, as the series measured (results/bench.json, "
        "`bash gpu/stage2.sh`).\n\n## Details\n\n- details.\n"
    )
    with pytest.raises(ToolkitError) as e:
        run(root, check=True)
    msg = str(e.value)
    assert 'host: words a reviewer knows: "seed\'s" in' in msg
    assert "host: words a reviewer knows: 'series' in" in msg
    assert "host: every path the body names is in the pull request: the body names " in msg
    assert "results/bench.json, which is not in the pull request's tree" in msg
    assert "gpu/stage2.sh, which is not in" in msg
    assert "overlap: words" not in msg
    # a name in code format that the patched tree lacks (serieskit/checks/names.py)
    assert "names: overview/host.md:3: `gpu/stage2.sh` is not in the patched tree" in msg
    (root / "overview/overlap.md").write_text(
        "## Overview\n\nThe halves (`vllm/overlap.py`), on with `kernel_config.host_reduce`.\n"
    )
    with pytest.raises(ToolkitError) as e:
        run(root, check=True)
    gone = "names: overview/overlap.md:3: `kernel_config.host_reduce` is not in the patched tree"
    assert gone in str(e.value)
    assert "`vllm/overlap.py`" not in str(e.value)
    # the template's instruction line never stays
    assert bodycheck.placeholders("PLEASE FILL IN THE PR DESCRIPTION HERE\n`TODO` in code\n") == [
        "template placeholder left: 'PLEASE FILL IN THE PR DESCRIPTION HERE'"
    ]


def test_says_whether_each_branch_applies_on_upstream_main(proot, tmp_path):
    """--upstream: the branch's commits (a stacked one's lower commits too)
    replayed on a snapshot of upstream main with git am -3."""
    repo = series.work_repo(proot)
    up = tmp_path / "upstream"
    git.git(None, "clone", "-q", str(repo), str(up))
    git.git(up, "checkout", "-q", "-B", "main", State.load(proot).base)
    from conftest import commit_file

    commit_file(up, "vllm/utils.py", "# moved on\n", "upstream work elsewhere")
    run(proot, upstream=str(up), upstream_ref="main")
    head = git.rev(up, "main") or ""
    day = git.git(up, "log", "-1", "--format=%cs", head).strip()
    body = (proot / ".work/pr/overlap/body.md").read_text()
    assert f"It applies cleanly on upstream `main` at `{head[:12]}` (committed {day})." in body
    kernel = (up / "vllm/config/kernel.py").read_text() + "    d = 4\n"
    commit_file(up, "vllm/config/kernel.py", kernel, "upstream grows KernelConfig")
    run(proot, upstream=str(up), upstream_ref="main")
    head = git.rev(up, "main") or ""
    day = git.git(up, "log", "-1", "--format=%cs", head).strip()
    for name in ("host", "overlap"):
        body = (proot / f".work/pr/{name}/body.md").read_text()
        assert (
            f"It does not apply on upstream `main` at `{head[:12]}` (committed {day}): "
            "conflicts in `vllm/config/kernel.py`; it will be rebased."
        ) in body
    checks = json.loads((proot / ".work/pr/host/check.json").read_text())["checks"]
    on_main = next(c for c in checks if c["check"] == "applies on upstream main")
    assert on_main["ok"] is None and head[:12] in on_main["detail"]  # informs, never fails
    assert git.git(repo, "worktree", "list").count("\n") == 1  # the scratch worktree is gone


def test_each_qualifier_is_said_once_in_a_body():
    """Figures from one machine and one earlier version: the machine's
    qualifier and the prior words' parenthesis come once; later figures
    name the machine and release without them."""
    machine = {
        "name": "2 x NVIDIA H200",
        "gpu": "NVIDIA H200",
        "gpus": 2,
        "p2p": "NCCL_P2P_DISABLE=1",
    }
    prior = "measured on vLLM 0.0.1 with the earlier version of this change (before the rework)"

    def checked(label: str, headline: bool, words: str, date: str) -> claims.Checked:
        claim = claims.Claim("results/x.json", "p", label, "ms", "2 x NVIDIA H200", words, headline)
        return claims.Checked(claim, 1.0, machine=machine, date=date, other_base=True)

    figures = [
        checked("first", True, prior, "2026-11-30"),
        checked("second", False, prior, "2026-11-30"),
        checked(
            "tests", False, prior.replace("change (", "change and of its tests ("), "2026-12-01"
        ),
    ]
    said = evidence.Said()
    text = evidence.claims_block(figures, said=said)
    assert text.count("H200 results, not Turing or Volta ones") == 1
    assert text.count("(before the rework)") == 1
    assert "| second | 1 ms | the same run as above |" in text
    assert (
        "two NVIDIA H200 with P2P disabled (`NCCL_P2P_DISABLE=1`); measured on vLLM 0.0.1 "
        "with the earlier version of this change and of its tests; 2026-12-01" in text
    )
    # without a Said (a figure on its own) every qualifier is there
    assert evidence.machine_words(machine).endswith(": H200 results, not Turing or Volta ones")
    assert evidence.prior_words(prior) == prior


def test_derived_commits_credit_the_original_author(tmp_path, cache):
    """A patch whose manifest `seed` names original work carries the group's
    co_author as Co-authored-by on every branch it is in; `--check` fails on a
    derived commit without it and on a sign-off by anyone but the contributor."""
    groups = GROUPS.replace(
        'text = "overview/host.md"\n', f'text = "overview/host.md"\nco_author = "{CO_AUTHOR}"\n'
    ).replace(
        'text = "overview/overlap.md"\n',
        f'text = "overview/overlap.md"\nco_author = "{CO_AUTHOR}"\n',
    )
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.33.0.md", groups)
    text = (root / "patches/manifest.toml").read_text()
    for name, seed in (("a1", "commit 1 (the host reduce)"), ("c1", "extends commits 1 and 2")):
        text = text.replace(f'name = "{name}"\nseed = "x"', f'name = "{name}"\nseed = "{seed}"')
    (root / "patches/manifest.toml").write_text(text)
    run(root, check=True)
    repo = gitpython.Repo(series.work_repo(root))
    base_commit = State.load(root).base
    credit = f"Co-authored-by: {CO_AUTHOR}"
    commits = {c.summary: c for c in repo.iter_commits(f"{base_commit}..refs/series/pr/overlap/v1")}
    assert commits["[Kernel] Host reduce, kernel mode"].message.count(credit) == 1
    assert commits["[Perf] Overlap in two halves"].message.count(credit) == 1
    assert credit not in commits["[Kernel] Copy-engine mode"].message  # seed "x": not derived
    for c in commits.values():
        assert c.message.rstrip("\n").endswith(f"Signed-off-by: {WHO}")
    body = (root / ".work/pr/host/body.md").read_text()
    assert f"`{credit}`" in body
    lower = commits["[Kernel] Copy-engine mode"]
    assert pr.check_signoff(
        repo, f"{lower.hexsha}~1..{lower.hexsha}", WHO, {lower.hexsha: CO_AUTHOR}
    ) == [
        f"{lower.hexsha[:12]} [Kernel] Copy-engine mode: derives from the original work but "
        f"lacks {credit}"
    ]
    # the series' own commits: another author, the placeholder sign-off
    problems = pr.check_signoff(repo, f"{base_commit}..HEAD~1", WHO, {})
    assert any("signed off by vLLM series <series@vllm-series.invalid> too" in p for p in problems)
    assert any(": author Ada <ada@example.com>" in p for p in problems)


def test_committed_examples_are_checked_against_a_fresh_session(tmp_path, cache):
    """`pr --examples` writes reports/pr/<name>/ as the example contributor
    (the branch's version as vN); with --check it fails where they differ."""
    root = make_root(tmp_path, cache, "PULL_REQUEST_TEMPLATE-0.33.0.md")
    pr.session(root, None, None, examples=True, log=quiet)
    body = root / "reports/pr/host/body.md"
    assert body.read_text() == (root / ".work/pr/host/body.md").read_text()
    record = json.loads((root / "reports/pr/host/check.json").read_text())
    assert record["ref"] == "refs/series/pr/host/vN" and "version" not in record
    run(root, signoff="Other Person <other@example.com>")  # makes v2 of each branch
    pr.session(root, None, None, examples=True, check=True, log=quiet)  # the same examples
    body.write_text(body.read_text().replace("The host change.", "An older text."))
    with pytest.raises(ToolkitError) as e:
        pr.session(root, None, None, examples=True, check=True, log=quiet)
    assert "reports/pr/host/body.md is not what the session writes now" in str(e.value)
    assert "-An older text." in str(e.value) and "+The host change." in str(e.value)
    with pytest.raises(ToolkitError, match="pr --examples makes reports/pr/ as CI does"):
        pr.session(root, None, WHO.replace("Example", "Other"), examples=True, log=quiet)


def test_cpu_counts_say_which_revision_they_ran(proot):
    """The CPU test run's counts are "this revision" only where the run
    recorded the series it tested and the pull request's files are the same."""
    out = proot / ".work/test-results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tests__test_a.py.xml").write_text(
        '<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1">'
        '<testcase classname="tests.test_a" name="a"/><testcase classname="tests.test_a" name="b"/>'
        '<testcase classname="tests.test_a" name="c"><skipped/></testcase></testsuite></testsuites>'
    )
    run(proot)
    row = next(
        x
        for x in (proot / ".work/pr/host/body.md").read_text().splitlines()
        if "`tests/test_a.py`" in x
    )
    assert "| 2 | 0 | 1 | an earlier revision of this change (" in row  # no record of what ran
    repo = series.work_repo(proot)
    state = State.load(proot)
    ran = results.series_block(repo, state.base, git.rev(repo, "HEAD"), "0.0.2")
    (out / runner.RAN).write_text(json.dumps(ran))
    run(proot)
    body = (proot / ".work/pr/host/body.md").read_text()
    assert "| `tests/test_a.py` | CPU, vLLM 0.0.2 | 2 | 0 | 1 | this revision |" in body


def test_an_rfc_draft_gives_the_count_the_commits_have(tmp_path):
    # The review's drift: RFC drafts kept 550 / 919 / "about 130" by hand
    # after the commits changed 552 / 941 / 135 lines.
    rfc = tmp_path / "rfc.md"
    rfc.write_text("Against vLLM 0.34.0 the pull request changes\n941 lines outside kernels.\n")
    assert bodycheck.rfc_count(rfc, 941) == []
    assert bodycheck.rfc_count(rfc, 919) == [
        "rfc.md says the change has 941 lines outside them; it has 919"
    ]
    rfc.write_text("the change adds about 130 lines outside config, tests and docs\n")
    assert bodycheck.rfc_count(rfc, 135) != []
    rfc.write_text("an RFC that gives no count\n")
    assert bodycheck.rfc_count(rfc, 135) == []
