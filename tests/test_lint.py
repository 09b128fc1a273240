"""lint: the linted tree's own pre-commit configuration, run offline."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from conftest import commit_file
from serieskit.checks import lint

needs_pre_commit = pytest.mark.skipif(
    importlib.util.find_spec("pre_commit") is None or importlib.util.find_spec("yaml") is None,
    reason="needs pre-commit and PyYAML (installed by nox -s ci / lint)",
)

RUFF = "https://github.com/astral-sh/ruff-pre-commit"
CLANG = "https://github.com/pre-commit/mirrors-clang-format"


def _config() -> dict:
    return {
        "default_stages": ["pre-commit", "manual"],
        "exclude": "vllm/third_party/.*",
        "repos": [
            {
                "repo": RUFF,
                "rev": "v0.14.0",
                "hooks": [
                    {"id": "ruff-check", "args": ["--output-format", "github", "--fix"]},
                    {"id": "ruff-format"},
                ],
            },
            {
                "repo": CLANG,
                "rev": "v21.1.2",
                "hooks": [
                    {
                        "id": "clang-format",
                        "types_or": ["c++", "cuda"],
                        "args": ["--style=file", "--verbose"],
                    }
                ],
            },
            {
                "repo": "https://github.com/DavidAnson/markdownlint-cli2",
                "rev": "v0.21.0",
                "hooks": [{"id": "markdownlint-cli2"}],
            },
            {"repo": "https://github.com/example/unknown", "rev": "v1", "hooks": [{"id": "odd"}]},
            {
                "repo": "https://github.com/example/by-sha",
                "rev": "7" * 40,
                "hooks": [{"id": "sha"}],
            },
            {
                "repo": "local",
                "hooks": [
                    {
                        "id": "mypy-3.11",
                        "name": "mypy",
                        "entry": "python tools/mypy.py 3.11",
                        "language": "python",
                        "additional_dependencies": ["mypy==1.20.2"],
                        "stages": ["manual"],
                    },
                    {
                        "id": "shellcheck",
                        "name": "sh",
                        "entry": "tools/shellcheck.sh",
                        "language": "script",
                    },
                    {
                        "id": "signoff",
                        "name": "signoff",
                        "entry": "bash",
                        "language": "system",
                        "stages": ["commit-msg"],
                    },
                    {
                        "id": "rust-fmt",
                        "name": "rust",
                        "entry": "cargo fmt",
                        "language": "system",
                        "stages": ["pre-commit"],
                    },
                ],
            },
        ],
    }


def test_github_hooks_become_the_same_tool_from_pypi_at_the_rev():
    offline, hooks = lint.offline_config(_config(), which=lambda _: None)
    (repo,) = offline["repos"]
    assert repo["repo"] == "local"
    by_id = {h["id"]: h for h in repo["hooks"]}
    check = by_id["ruff-check"]
    assert check["entry"] == "ruff check --force-exclude"
    assert check["args"] == ["--output-format", "github", "--fix"]  # the tree's own args
    # The Python hooks share one environment: the union of their dependencies.
    shared = ["ruff==0.14.0", "clang-format==21.1.2", "mypy==1.20.2"]
    assert check["additional_dependencies"] == shared
    assert check["language"] == "python"
    assert by_id["ruff-format"]["entry"] == "ruff format --force-exclude"
    clang = by_id["clang-format"]
    assert clang["additional_dependencies"] == shared
    assert clang["types_or"] == ["c++", "cuda"]  # the tree's setting wins
    assert clang["entry"] == "clang-format -i"
    # Local hooks as written, all run in the one stage lint runs.
    assert by_id["mypy-3.11"]["entry"] == "python tools/mypy.py 3.11"
    assert by_id["mypy-3.11"]["additional_dependencies"] == shared
    assert "additional_dependencies" not in by_id["rust-fmt"]  # not a Python hook
    assert by_id["rust-fmt"]["stages"] == [lint.STAGE]
    assert offline["exclude"] == "vllm/third_party/.*"
    assert "default_stages" not in offline

    verdicts = {h.id: h.verdict for h in hooks}
    assert [h.id for h in hooks] == [
        "ruff-check",
        "ruff-format",
        "clang-format",
        "markdownlint-cli2",
        "odd",
        "sha",
        "mypy-3.11",
        "shellcheck",
        "signoff",
        "rust-fmt",
    ]  # every hook, in order
    assert verdicts["ruff-check"] == verdicts["mypy-3.11"] == ""  # to be run
    assert verdicts["markdownlint-cli2"].startswith("not run: a node hook")
    # Every hook not run says why, and what would run it.
    assert verdicts["odd"].startswith(
        "not run: no PyPI package known for https://github.com/example/unknown (a hook from "
    )
    assert verdicts["odd"].endswith("add one to PYPI_HOOKS in serieskit/checks/lint.py)")
    assert verdicts["sha"].startswith("not run: pinned to a commit (777777777777), not a release")
    assert verdicts["shellcheck"].startswith("not run: shellcheck is not installed")
    assert verdicts["signoff"].startswith("not run: stage commit-msg only")
    assert {h["id"] for h in repo["hooks"]} == {
        "ruff-check",
        "ruff-format",
        "clang-format",
        "mypy-3.11",
        "rust-fmt",
    }


def test_python_hooks_share_an_environment_unless_their_pins_contradict():
    def hook(id, deps, **kw):
        return {"id": id, "language": "python", "additional_dependencies": deps, **kw}

    hooks = [
        hook("a", ["PyYAML", "regex"]),
        hook("b", ["mypy==1.20.2", "pyyaml==6.0.3"]),  # pins what a left bare
        hook("c", []),
        hook("d", ["mypy==1.19.0"]),  # contradicts b's pin
        hook("e", ["regex"], language_version="python3.12"),  # its own Python
        {"id": "f", "language": "system"},
    ]
    lint.share_python_env(hooks)
    union = ["pyyaml==6.0.3", "regex", "mypy==1.20.2"]
    assert [h.get("additional_dependencies") for h in hooks] == [
        union,
        union,
        union,
        ["mypy==1.19.0"],
        ["regex"],
        None,
    ]


def test_shellcheck_runs_where_installed_and_versions_lose_their_v():
    _, hooks = lint.offline_config(_config(), which=lambda name: f"/usr/bin/{name}")
    assert {h.id: h.verdict for h in hooks}["shellcheck"] == ""
    assert lint.version_of("v0.14.0") == "0.14.0"
    assert lint.version_of("0.11.1") == "0.11.1"
    assert lint.version_of("vendor-1") == "vendor-1"


VERBOSE = """\
ruff check...............................................................Passed
- hook id: ruff-check
- duration: 0.05s
clang-format.............................................................Failed
- hook id: clang-format
- files were modified by this hook

Formatting [1/1] csrc/a.cu
png lint.............................................(no files to check)Skipped
- hook id: png-lint
Check torch.cuda.........................................................Failed
- hook id: check-torch-cuda-call
- exit code: 1

a.py:3: error: Found torch.cuda API call.
"""


def test_pre_commit_results_are_read_per_hook_id():
    results = lint.parse_results(VERBOSE)
    assert results["ruff-check"] == ("passed", "")
    assert results["clang-format"][0] == "failed"
    assert "csrc/a.cu" in results["clang-format"][1]
    assert results["png-lint"] == ("skipped (no files to check)", "")
    assert results["check-torch-cuda-call"] == (
        "failed",
        "a.py:3: error: Found torch.cuda API call.",
    )
    assert lint.mypy_errors("vllm/a.py:12: error: Bad [x]\nvllm/a.py: note: n\n") == {
        ("vllm/a.py", "Bad [x]")
    }
    output = "vllm/a.py:12: error: Bad [x]\nvllm/a.py:40: error: Old\nvllm/a.py: note: n\n"
    assert lint.new_mypy_error_lines(output, {("vllm/a.py", "Bad [x]")}) == [
        "vllm/a.py:12: error: Bad [x]"
    ]


FAKE_MYPY = """\
import sys
bad = False
for path in sys.argv[1:]:
    for n, line in enumerate(open(path), 1):
        if "ERR" in line:
            print(f"{path}:{n}: error: ERR {line.split('ERR')[1].strip()}")
            bad = True
sys.exit(1 if bad else 0)
"""

TREE_CONFIG = """\
repos:
- repo: https://github.com/DavidAnson/markdownlint-cli2
  rev: v0.21.0
  hooks:
  - id: markdownlint-cli2
- repo: local
  hooks:
  - id: no-bad
    name: no BAD
    entry: bash -c '! grep -n BAD "$@"' --
    language: system
    types: [python]
  - id: mypy-3.10
    name: fake mypy
    entry: python3 tools/fake_mypy.py
    language: system
    types: [python]
  - id: upper
    name: rewrites files
    entry: sed -i s/lower/UPPER/
    language: system
    files: ^notes/
  - id: only-md
    name: markdown only
    entry: "false"
    language: system
    files: \\.md$
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(tmp_path / "cache"))
    t = tmp_path / "tree"
    t.mkdir()
    subprocess.run(["git", "init", "-q", str(t)], check=True)
    commit_file(t, ".pre-commit-config.yaml", TREE_CONFIG, "config")
    commit_file(t, "tools/fake_mypy.py", FAKE_MYPY, "fake mypy")
    commit_file(t, "vllm/old.py", "x = 1  # BAD ERR upstream\n", "base with findings of its own")
    return t


def _head(tree):
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@needs_pre_commit
def test_series_findings_fail_and_the_base_s_own_do_not(tree, tmp_path):
    base = _head(tree)
    work = tmp_path / "lint"
    # The series changes old.py but keeps the base's mypy error: not the series'.
    commit_file(tree, "vllm/old.py", "x = 2  # ERR upstream\n", "series edit, base error kept")
    commit_file(tree, "notes/a.txt", "all UPPER\n", "clean note")
    lines: list[str] = []
    assert lint.run(tree, work, base, log=lines.append) == []
    # The verdict against the base first, then each hook's.
    assert lines[lines.index("hooks:") - 1].startswith(
        "lint: no hook fails on what the series changes, against the base (3 passed, 1 skipped"
    )
    table = dict(line.split(None, 1) for line in lines[lines.index("hooks:") + 1 :][:5])
    assert table["no-bad"] == "passed"
    assert table["mypy-3.10"] == "passed (its errors are the base's too)"
    assert table["upper"] == "passed"
    assert table["only-md"] == "skipped (no files to check)"
    assert table["markdownlint-cli2"].startswith("not run: ")

    commit_file(tree, "vllm/new.py", "y = 1  # BAD ERR series\n", "series finding")
    commit_file(tree, "notes/b.txt", "lower\n", "note a formatter rewrites")
    lines = []
    assert lint.run(tree, work, base, log=lines.append) == ["no-bad", "mypy-3.10", "upper"]
    assert lines[lines.index("hooks:") - 1].startswith(
        "lint: 3 hook(s) FAIL on what the series changes, against the base: "
        "no-bad, mypy-3.10, upper"
    )
    text = "\n".join(lines)
    # The new mypy error, named as mypy names it: with its line, to be found.
    assert "vllm/new.py:1: error: ERR series" in text
    assert "upstream" not in text.split("--- mypy-3.10 failed:")[1].split("---")[0]
    assert "notes/b.txt" in text  # the rewritten file is listed
    # The formatter rewrote the lint checkout, never the work tree.
    assert (tree / "notes/b.txt").read_text() == "lower\n"
    assert (
        subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True
        ).stdout
        == ""
    )


@needs_pre_commit
def test_check_layering_verdict_is_the_toolkit_s(tree, tmp_path):
    config = (tree / ".pre-commit-config.yaml").read_text()
    commit_file(
        tree,
        ".pre-commit-config.yaml",
        config
        + """\
  - id: check-layering
    name: layering
    entry: "false"
    language: system
    pass_filenames: false
""",
        "a layering hook that always fails",
    )
    base = _head(tree)
    commit_file(tree, "vllm/c.py", "z = 1\n", "series")
    calls = []

    def passes(say) -> bool:
        calls.append(1)
        return True

    assert lint.run(tree, tmp_path / "lint", base, passes, log=lambda _: None) == []
    assert calls == [1]

    def raises(say) -> bool:
        say("  vllm/c.py (platform coupling 0 -> 1)")
        return False

    lines: list[str] = []
    assert lint.run(tree, tmp_path / "lint", base, raises, log=lines.append) == ["check-layering"]
    # What is shown is the toolkit's count against the base, not the hook's own
    # output (which compared with its own reference).
    shown = "\n".join(lines).split("--- check-layering failed:\n", 1)[1]
    assert shown.startswith("the counts of the base against the series head:\n")
    assert "vllm/c.py (platform coupling 0 -> 1)" in shown


def test_a_tree_without_config_is_named(tmp_path):
    pytest.importorskip("yaml")
    with pytest.raises(lint.ToolkitError, match="no .pre-commit-config.yaml"):
        lint.write_offline_config(tmp_path, tmp_path / "out.yaml")


def test_the_first_run_says_it_installs_the_hooks(tmp_path, monkeypatch):
    home = tmp_path / "pre-commit"
    monkeypatch.setattr(lint, "pre_commit_home", lambda: home)
    note = lint.first_run_note()
    assert note and str(home) in note and "several minutes" in note
    home.mkdir()
    (home / "db.db").write_bytes(b"")  # what pre-commit leaves after its first run
    assert lint.first_run_note() is None


def test_a_frozen_rev_is_read_as_the_tag_beside_it():
    """vLLM 0.34.0 pins its hook repositories with `pre-commit autoupdate
    --freeze`: a commit, with the tag in a comment. The PyPI package of the
    hook is installed at that tag, not at the commit (which pip refuses)."""
    import yaml

    sha = "f368fb366ff7f2f808dd324b83a6d32267799e19"
    text = (
        "repos:\n"
        "- repo: https://github.com/astral-sh/ruff-pre-commit\n"
        f"  rev: {sha}  # frozen: v0.17.2\n"
        "  hooks:\n"
        "  - id: ruff-check\n"
        "- repo: https://github.com/example/unknown\n"
        "  rev: 7777777777777777777777777777777777777777\n"
        "  hooks:\n"
        "  - id: sha\n"
    )
    config = lint.unfreeze(yaml.safe_load(text), text)
    offline, hooks = lint.offline_config(config, which=lambda _: None)
    (ruff,) = offline["repos"][0]["hooks"]
    assert "ruff==0.17.2" in ruff["additional_dependencies"]
    verdicts = {h.id: h.verdict for h in hooks}
    assert verdicts["sha"].startswith("not run: pinned to a commit (777777777777)")
