"""``nox -s lint``: the linted tree's own pre-commit configuration, offline.

The configuration is the tree's ``.pre-commit-config.yaml`` (so a series on a
newer release is held to that release's rules). From it this module writes an
offline configuration under ``.work/lint/``:

- every ``repo: local`` hook as written (pre-commit installs its
  ``additional_dependencies`` from PyPI once, into its cache);
- every hook of a GitHub repository whose tool is published on PyPI (ruff,
  clang-format, typos, mypy) as a ``repo: local`` hook that runs the same
  tool at the version of the repository's ``rev:``, with the repository's
  hook definition under the tree's own settings;
- every other hook is listed as "not run" with the reason.

pre-commit runs it with ``--from-ref BASE --to-ref HEAD`` in a detached
checkout of the series head (``.work/lint/head``), so formatters that rewrite
files never touch the work tree. It runs the ``manual`` stage, the one vLLM's
CI runs (mypy for every supported Python); hooks that run only on a local
commit are run in the same pass. Every hook is listed: passed, failed,
skipped by pre-commit (no files), or not run and why.

Two verdicts compare with the base, because upstream's own state is not the
series': a mypy hook fails only on errors the base's version of the same files
does not have (the base is checked out in ``.work/lint/base``), and
check-layering fails only on coupling increases over the base that no patch
declares in the manifest (:mod:`serieskit.checks.layering`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.checks import layering
from serieskit.errors import ToolkitError
from serieskit.series import series, target
from serieskit.series.base import cache_dir
from serieskit.state import State

PRE_COMMIT = "pre-commit==4.7.0"
PYYAML = "PyYAML==6.0.3"
# The session's own: pre-commit, the config reader, and regex for the tree's
# check_layering.py, which the toolkit runs itself for the base-vs-head counts.
REQUIREMENTS = (PRE_COMMIT, PYYAML, "regex")
CONFIG = ".pre-commit-config.yaml"
STAGE = "manual"  # the stage vLLM's CI runs ("manual # Run in CI")
LOCAL_STAGES = {"pre-commit", "commit"}  # what a contributor's commit runs

# The hook definitions of GitHub repositories whose tool is on PyPI: package,
# then per hook id the fields of the repository's .pre-commit-hooks.yaml.
_RUFF_CHECK = {
    "entry": "ruff check --force-exclude",
    "types_or": ["python", "pyi", "jupyter"],
    "require_serial": True,
}
PYPI_HOOKS: dict[str, tuple[str, dict[str, dict]]] = {
    "https://github.com/astral-sh/ruff-pre-commit": (
        "ruff",
        {
            "ruff": _RUFF_CHECK,
            "ruff-check": _RUFF_CHECK,
            "ruff-format": {
                "entry": "ruff format --force-exclude",
                "types_or": ["python", "pyi", "jupyter"],
                "require_serial": True,
            },
        },
    ),
    "https://github.com/pre-commit/mirrors-clang-format": (
        "clang-format",
        {
            "clang-format": {
                "entry": "clang-format -i",
                "args": ["-style=file"],
                "types_or": [
                    "c++",
                    "c",
                    "c#",
                    "cuda",
                    "java",
                    "javascript",
                    "json",
                    "objective-c",
                    "proto",
                    "textproto",
                ],
            },
        },
    ),
    "https://github.com/crate-ci/typos": (
        "typos",
        {
            "typos": {"entry": "typos", "args": ["--write-changes"], "types": ["text"]},
        },
    ),
    "https://github.com/pre-commit/mirrors-mypy": (
        "mypy",
        {
            "mypy": {
                "entry": "mypy",
                "types_or": ["python", "pyi"],
                "require_serial": True,
                "args": ["--ignore-missing-imports", "--scroll-output"],
            },
        },
    ),
}

# Hooks that cannot run here, by repository and by local hook id.
NOT_RUN_REPOS = {
    "https://github.com/DavidAnson/markdownlint-cli2": (
        "a node hook that pre-commit builds from its GitHub repository with npm (offline here)"
    ),
    "https://github.com/rhysd/actionlint": (
        "a Go hook that pre-commit builds from its GitHub repository (offline here)"
    ),
    "https://github.com/astral-sh/uv-pre-commit": (
        "uv pip compile resolves requirements against the package index (needs the network)"
    ),
}
NEEDS_ON_PATH = {  # local hook id -> the program its script needs
    "shellcheck": "shellcheck",
}


@dataclass
class Hook:
    id: str
    repo: str
    verdict: str = ""  # passed / failed / skipped (no files) / not run: why
    output: str = ""


def version_of(rev: str) -> str:
    """``v0.14.0`` -> ``0.14.0``: mirrors tag the PyPI version with a ``v``."""
    return rev[1:] if re.fullmatch(r"v\d.*", rev) else rev


_FROZEN = re.compile(r"^\s*rev:\s*([0-9a-f]{40})\s*#\s*frozen:\s*(\S+)", re.M)


def unfreeze(config: dict, text: str) -> dict:
    """Revs that ``pre-commit autoupdate --freeze`` pinned to a commit, with
    the tag it wrote beside them (``rev: <sha>  # frozen: v0.17.2``), read as
    that tag: the release a PyPI package of the hook has (YAML drops the
    comment, so it is read from the text)."""
    tags = dict(_FROZEN.findall(text))
    for repo in config.get("repos", []):
        rev = str(repo.get("rev", ""))
        if rev in tags:
            repo["rev"] = tags[rev]
    return config


def _stages(hook: dict, default: list[str] | None) -> set[str]:
    return set(hook.get("stages") or default or [STAGE, *LOCAL_STAGES])


def _unknown(url: str, repo: dict) -> str:
    """Why a GitHub repository's hook is not run, and what would run it."""
    rev = str(repo.get("rev", ""))
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        # A commit names no release: no PyPI version to install in its place.
        return (
            f"pinned to a commit ({rev[:12]}), not a release, so there is no PyPI "
            "version to run in its place offline; upstream's CI runs it"
        )
    return (
        f"no PyPI package known for {url} (a hook from GitHub runs here as its PyPI "
        "package: add one to PYPI_HOOKS in serieskit/checks/lint.py)"
    )


def offline_config(config: dict, which=shutil.which) -> tuple[dict, list[Hook]]:
    """(the offline configuration, every hook of ``config`` in order). Hooks
    that will not run carry their ``not run: ...`` verdict already."""
    hooks: list[Hook] = []
    local: list[dict] = []
    default = config.get("default_stages")
    for repo in config.get("repos", []):
        url = repo.get("repo", "")
        for hook in repo.get("hooks", []):
            entry = Hook(hook.get("alias") or hook["id"], url)
            hooks.append(entry)
            stages = _stages(hook, default)
            if not stages & (LOCAL_STAGES | {STAGE}):
                entry.verdict = (
                    f"not run: stage {', '.join(sorted(stages))} only "
                    "(acts on a commit being made; lint makes none)"
                )
            elif url in ("local", "meta"):
                program = NEEDS_ON_PATH.get(hook["id"])
                if program and not which(program):
                    entry.verdict = f"not run: {program} is not installed (its script downloads it)"
                else:
                    local.append({**hook, "stages": [STAGE]})
            elif url in PYPI_HOOKS and hook["id"] in PYPI_HOOKS[url][1]:
                package, defs = PYPI_HOOKS[url]
                pin = f"{package}=={version_of(repo['rev'])}"
                local.append(
                    {
                        "name": hook["id"],
                        **defs[hook["id"]],
                        **hook,
                        "language": "python",
                        "stages": [STAGE],
                        "additional_dependencies": [pin, *hook.get("additional_dependencies", [])],
                    }
                )
            else:
                entry.verdict = "not run: " + NOT_RUN_REPOS.get(url, _unknown(url, repo))
    share_python_env(local)
    offline = {
        k: v
        for k, v in config.items()
        if k not in ("repos", "default_stages", "default_install_hook_types")
    }
    offline["repos"] = [{"repo": "local", "hooks": local}] if local else []
    return offline, hooks


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def _requirement(requirement: str) -> tuple[str, str]:
    """(normalised package name, the rest: version, extras, markers) of a
    requirement line."""
    m = _REQUIREMENT_NAME.match(requirement)
    if not m:
        return requirement, ""
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2).strip()


def share_python_env(hooks: list[dict]) -> None:
    """Give the Python hooks one environment: each gets the union of their
    ``additional_dependencies``. pre-commit makes an environment per distinct
    set (virtualenv, then pip building its placeholder package): cold, vLLM
    0.33.0's nine sets took 4 to 5 minutes on a loaded 2-core machine. The
    tools and their versions stay the hooks' own; what a hook loses is only
    the check that its script imports nothing it does not declare. A hook
    whose pin contradicts the union (two versions of one package), or that
    asks for its own Python, keeps its own set."""
    union: dict[str, str] = {}  # package name -> requirement
    shared = []
    for hook in hooks:
        if hook.get("language") != "python" or hook.get("language_version"):
            continue
        wanted: dict[str, tuple[str, str]] = {}  # name -> (its version part, the line)
        for req in hook.get("additional_dependencies", []):
            name, rest = _requirement(req)
            wanted[name] = (rest, req)
        if any(
            rest and name in union and _requirement(union[name])[1] not in ("", rest)
            for name, (rest, _) in wanted.items()
        ):
            continue  # contradicting pins: its own environment
        for name, (rest, req) in wanted.items():
            if name not in union or (rest and not _requirement(union[name])[1]):
                union[name] = req  # a pinned requirement wins over a bare name
        shared.append(hook)
    for hook in shared:
        hook["additional_dependencies"] = list(union.values())


def write_offline_config(tree: Path, dest: Path) -> list[Hook]:
    import yaml

    path = tree / CONFIG
    if not path.is_file():
        raise ToolkitError(f"the linted tree has no {CONFIG}")
    try:
        text = path.read_text()
        config = unfreeze(yaml.safe_load(text), text)
    except yaml.YAMLError as e:
        raise ToolkitError(f"{CONFIG} of the linted tree does not parse: {e}") from None
    offline, hooks = offline_config(config)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(offline, sort_keys=False, width=100))
    return hooks


_RESULT = re.compile(
    r"^(?P<name>.*?)\.*(?:\((?P<why>[^()]*)\))?"
    r"(?P<status>Passed|Failed|Skipped)$"
)
_HOOK_ID = re.compile(r"^- hook id: (?P<id>\S+)$")


def parse_results(output: str) -> dict[str, tuple[str, str]]:
    """{hook id: (verdict, the hook's output)} from ``pre-commit run
    --verbose --color never``: a result line, ``- hook id: ID``, then the
    hook's own lines up to the next result line."""
    results: dict[str, tuple[str, str]] = {}
    current: str | None = None
    status = ""
    body: list[str] = []
    pending: tuple[str, str] | None = None
    for line in output.splitlines():
        if m := _RESULT.match(line):
            if current:
                results[current] = (status, "\n".join(body).strip())
            current, body = None, []
            why = m["why"]
            pending = (m["status"].lower() + (f" ({why})" if why else ""), line)
        elif (m := _HOOK_ID.match(line)) and pending:
            current, status, pending = m["id"], pending[0], None
        elif current and not line.startswith(("- duration:", "- exit code:")):
            body.append(line)
    if current:
        results[current] = (status, "\n".join(body).strip())
    return results


def pre_commit_home() -> Path:
    """pre-commit's hook environments, beside the toolkit's other caches."""
    return cache_dir().parent / "pre-commit"


def first_run_note() -> str | None:
    """Said before pre-commit's first run with the toolkit's home, which
    installs every hook's environment (minutes, silent until done)."""
    home = pre_commit_home()
    if (home / "db.db").exists():  # pre-commit's record of what it installed
        return None
    return (
        f"lint: a first run installs the hooks' environments into {home} "
        "(several minutes; later runs reuse them)"
    )


def pre_commit(tree: Path, config: Path, *args: str) -> str:
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(pre_commit_home()),
        "SKIP": "",
        "PRE_COMMIT_COLOR": "never",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pre_commit",
            "run",
            "--config",
            str(config),
            "--hook-stage",
            STAGE,
            "--verbose",
            "--color",
            "never",
            *args,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        env=env,
    )
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1) or ("- hook id:" not in out and proc.returncode):
        raise ToolkitError(f"pre-commit failed to run: {out.strip()[-400:]}")
    return out


_MYPY_ERROR = re.compile(r"^(?P<path>[^:\s]+\.pyi?):\d+:(?:\d+:)? error: (?P<msg>.*)$")


def mypy_errors(output: str) -> set[tuple[str, str]]:
    """(path, message) of each mypy error, without line numbers: lines move
    between the base and the series, the errors do not."""
    return {(m["path"], m["msg"]) for line in output.splitlines() if (m := _MYPY_ERROR.match(line))}


def new_mypy_error_lines(output: str, new: set[tuple[str, str]]) -> list[str]:
    """mypy's own lines (path:line: error: ...) of the errors in ``new``, so
    that each can be found; the comparison with the base ignores the line."""
    return [
        line
        for line in output.splitlines()
        if (m := _MYPY_ERROR.match(line)) and (m["path"], m["msg"]) in new
    ]


def changed_files(tree: Path, base: str, head: str = "HEAD") -> list[str]:
    out = git.git(tree, "diff", "--name-only", "--diff-filter=ACMR", base, head)
    return out.split()


def base_mypy_errors(
    repo: Path, work: Path, config: Path, base: str, hook_id: str, files: list[str]
) -> set[tuple[str, str]]:
    """The same hook's errors on the base's version of the same files."""
    existing = [
        f
        for f in files
        if f.endswith((".py", ".pyi"))
        and git.run(repo, "cat-file", "-e", f"{base}:{f}").returncode == 0
    ]
    if not existing:
        return set()
    tree = git.detached_worktree(repo, work / "base", base)
    result = parse_results(pre_commit(tree, config, hook_id, "--files", *existing))
    return mypy_errors(result.get(hook_id, ("", ""))[1])


def _verdicts(hooks: list[Hook], results: dict[str, tuple[str, str]]) -> None:
    for hook in hooks:
        if hook.verdict:
            continue
        if hook.id not in results:
            raise ToolkitError(f"pre-commit reported nothing for hook {hook.id}")
        hook.verdict, hook.output = results[hook.id]


def table(hooks: list[Hook]) -> list[str]:
    width = max(len(h.id) for h in hooks)
    return [f"  {h.id:<{width}}  {h.verdict}" for h in hooks]


def verdict(hooks: list[Hook]) -> str:
    """The summary's first line: what fails against the base, then how many
    hooks passed, were skipped and were not run (each with its reason below)."""
    failed = [h.id for h in hooks if h.verdict == "failed"]
    tally = {
        word: sum(h.verdict.startswith(word) for h in hooks)
        for word in ("passed", "skipped", "not run")
    }
    lead = (
        f"{len(failed)} hook(s) FAIL on what the series changes, against the base: "
        + ", ".join(failed)
        if failed
        else "no hook fails on what the series changes, against the base"
    )
    return (
        f"lint: {lead} ({tally['passed']} passed, {tally['skipped']} skipped: no files of "
        f"theirs changed, {tally['not run']} not run: each with its reason below)"
    )


def run(
    repo: Path, work: Path, base: str, layering_check=None, log=print, commit: str = "HEAD"
) -> list[str]:
    """Lint ``commit`` of ``repo`` (the series head) against ``base`` with
    that commit's own config; print the verdict, each hook's, then what the
    failing ones said, and return the hooks that failed. ``layering_check``
    (``(log) -> bool``) is the base-vs-head verdict of check-layering."""
    config = work / "pre-commit-config.yaml"
    head = git.detached_worktree(repo, work / "head", git.git(repo, "rev-parse", commit).strip())
    hooks = write_offline_config(head, config)
    log(f"lint: {CONFIG} of {commit} through pre-commit (offline config {config})")
    if note := first_run_note():
        log(note)
    _verdicts(
        hooks, parse_results(pre_commit(head, config, "--from-ref", base, "--to-ref", "HEAD"))
    )
    files = changed_files(repo, base, commit)
    for hook in hooks:
        if hook.verdict != "failed":
            continue
        if hook.id.startswith("mypy") and (errors := mypy_errors(hook.output)):
            # A failure without error lines (mypy crashed) stays a failure.
            new = errors - base_mypy_errors(repo, work, config, base, hook.id, files)
            if not new:
                hook.verdict = "passed (its errors are the base's too)"
            else:
                hook.output = "\n".join(new_mypy_error_lines(hook.output, new))
        elif hook.id == "check-layering" and layering_check is not None:
            # The hook's own output compares with whatever reference it found
            # and may list files the series never touches: the toolkit's count
            # of the base against the head, with the manifest's declarations,
            # is the verdict and what is shown.
            said: list[str] = ["the counts of the base against the series head:"]
            if layering_check(said.append):
                hook.verdict = "passed (every increase declared in the manifest)"
            hook.output = "\n".join(said)
    failed = [h for h in hooks if h.verdict == "failed"]
    log(verdict(hooks))
    log("hooks:")
    for line in table(hooks):
        log(line)
    for hook in failed:
        log(f"--- {hook.id} failed:")
        log(hook.output or "(no output)")
    if changes := git.git(head, "diff", "--stat").strip():
        log(f"--- files the hooks rewrote (git diff in {head}):")
        log(changes)
    return [h.id for h in failed]


def precommit_changed(tree: Path, work: Path, lower: str, head: str, log=print) -> list[str]:
    """The hooks of ``head``'s own config that fail on what ``lower..head``
    changes (a pull request's commits): :func:`run` on that range."""
    return run(tree, work, lower, None, log, commit=head)


def require_tools() -> None:
    for mod in ("pre_commit", "yaml"):
        if (
            subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True).returncode
            != 0
        ):
            raise ToolkitError(f"lint needs {mod}: run it through `nox -s lint`")


def session(where, log=print) -> str:
    """``nox -s lint``: the applied series (the pin's or a port's) through its
    tree's own hooks. Returns the commit that passed (the work tree's HEAD)."""
    t = target.of(where)
    tree = series.applied_tree(t)
    base_commit = State.load(t).base  # a local: mypy keeps its narrowing in the closure
    assert base_commit
    require_tools()

    def layering_check(say) -> bool:
        script = tree / layering.SCRIPT
        # On a rebased work tree (a fork's ref, say) the target's upstream base
        # is the reference: increases that the work tree's base has too are
        # reported as "base reports the same" and do not fail.
        ref = t.commit if t.commit and t.commit != base_commit else None
        return layering.check_series(
            tree, base_commit, script, series.layering_acknowledged(t), ref, log=say
        )

    head = git.git(tree, "rev-parse", "HEAD").strip()
    failed = run(tree, t.out("lint"), base_commit, layering_check, log, commit=head)
    if failed:
        raise ToolkitError(f"lint failed: {', '.join(failed)}")
    return head
