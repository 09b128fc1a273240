"""Each pull request's branch: its commits re-signed by the contributor, as a ref.

For each group this builds a branch on the series' base in the work tree, as
``refs/series/pr/<name>/v<N>``: the commits of the groups it depends on first
(fork PRs cannot stack natively, so an upper PR carries the lower commits),
then its own, each re-signed with the contributor's identity and a DCO
``Signed-off-by`` (every earlier sign-off dropped: the contributor certifies
the branch), a commit derived from the original pull request crediting its
author (the group's ``co_author``) with ``Co-authored-by``; the toolkit's
``Patch-Name`` trailers and the files of patches in no group (the
toolkit-only ones) are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.pr.groups import Group, gitpython, order, stacks
from serieskit.series import base, series, target
from serieskit.series.target import Target
from serieskit.state import State

REF = "refs/series/pr"


PLACEHOLDER = f"Signed-off-by: {git.COMMITTER[0]} <{git.COMMITTER[1]}>"


SIGNOFF = re.compile(r"^[^<>]+ <[^<>@\s]+@[^<>\s]+>$")

# A manifest ``seed`` field that names a commit or a pull request of the
# original work ("commit 3 (...)", "stacked #1216", "extends commits 1 and 5"):
# the patch derives from it and credits its author; "none: ..." does not.
DERIVES = re.compile(r"\bcommits? \d|#\d+")


def derived(t: Target) -> set[str]:
    """Names of the patches whose manifest ``seed`` names original work."""
    return {
        e["name"]
        for e in series.read_manifest(t)
        if "name" in e and DERIVES.search(str(e.get("seed", "")))
    }


def onto_target(root: Path, onto: str | None) -> Target:
    """The series for ``onto`` (``vllm==X``): the pin's (the default) or a port's."""
    pin = base.read_pin(root)
    if not onto:
        return target.pin(root)
    m = re.fullmatch(r"vllm==(\S+)", onto)
    if not m:
        raise ToolkitError(f"--onto takes vllm==VERSION, not {onto!r}")
    if m.group(1) == pin.version:
        return target.pin(root)
    if any(p.version == m.group(1) for p in base.read_ports(root)):
        return target.port(root, m.group(1))
    raise ToolkitError(
        f"no series tree for vLLM {m.group(1)} yet: the series is on {pin.version} "
        "(.work/vllm); port it first (a [[port]] in pin.toml; "
        'docs/user-guide.md: "Ports: moving to the next release")'
    )


def series_commits(repo, base_commit: str) -> dict[str, Any]:
    """Patch-Name -> commit of the series (GitPython commits)."""
    out = {}
    for c in repo.iter_commits(f"{base_commit}..HEAD", reverse=True):
        name = dict(c.trailers_list).get(series.NAME_TRAILER)
        if name:
            out[name.strip()] = c
    return out


def resign_message(message: str, signoff: str, co_author: str | None = None) -> str:
    """Drop the toolkit's trailer and every sign-off; credit ``co_author``
    once; end with the contributor's sign-off."""
    lines = [
        line
        for line in message.rstrip("\n").split("\n")
        if not line.startswith((f"{series.NAME_TRAILER}:", "Signed-off-by:"))
    ]
    while lines and not lines[-1].strip():
        lines.pop()
    credit = f"Co-authored-by: {co_author}"
    trailers = [credit] if co_author and credit not in lines else []
    last = lines[-1] if lines else ""
    if not re.match(r"^[A-Za-z-]+: ", last) or len(lines) < 3:
        lines.append("")
    return "\n".join([*lines, *trailers, f"Signed-off-by: {signoff}"]) + "\n"


def identity(signoff: str) -> tuple[str, str]:
    if not SIGNOFF.match(signoff):
        raise ToolkitError(f'--signoff takes "Name <mail>", not {signoff!r}')
    name, mail = signoff[:-1].split(" <")
    return name.strip(), mail.strip()


@dataclass
class Built:
    group: Group
    ref: str | None = None
    head: str | None = None
    version: int = 0
    own: list[tuple[str, str]] = field(default_factory=list)  # (id, subject) to review
    lower: str | None = None  # head of the PR it stacks on
    problems: list[str] = field(default_factory=list)
    left_out: dict[str, list[str]] = field(default_factory=dict)
    # commit -> the Co-authored-by it must carry (its stack's derived commits)
    credit: dict[str, str] = field(default_factory=dict)


def _pick(wt: Path, commit, exclude: list[str], signoff: str, co_author: str | None) -> str | None:
    """One series commit onto the worktree's HEAD, re-signed (crediting
    ``co_author``); its problem or None."""
    spec = [":(exclude)" + p for p in exclude]
    mbox = git.git(
        wt,
        *series.FORMAT_PATCH_ARGS[:1],
        "--stdout",
        "-1",
        *series.FORMAT_PATCH_ARGS[1:],
        commit.hexsha,
        "--",
        ".",
        *spec,
    )
    if "\ndiff --git " not in mbox:
        return None  # only left-out files
    name, mail = identity(signoff)
    date = commit.authored_datetime.isoformat()
    who = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": mail, "GIT_COMMITTER_DATE": date}
    proc = git.run(
        wt,
        "am",
        "--3way",
        "--no-gpg-sign",
        "--committer-date-is-author-date",
        input=mbox.encode(),
        env=who,
    )
    if proc.returncode != 0:
        git.run(wt, "am", "--abort")
        out = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
        return f"{commit.summary} does not apply: " + " | ".join(out[-3:])
    message = resign_message(commit.message, signoff, co_author)
    git.git(
        wt,
        "commit",
        "-q",
        "--amend",
        "--no-verify",
        "--allow-empty",
        "-F",
        "-",
        f"--author={name} <{mail}>",
        input=message.encode(),
        env=who,
    )
    return None


WORKTREE_CONFIG = "extensions.worktreeConfig"


def _sparse_worktree(tree: Path, wt: Path, base_commit: str) -> None:
    """A detached worktree of ``tree`` at ``base_commit`` holding only the
    files the series' commits touch, the only ones a pick writes: a whole
    checkout of vLLM is thousands of files, most of the session's time on a
    slow disk. The index holds every file (the others marked skip-worktree),
    so the commits are whole trees."""
    touched = git.git(
        tree, "log", "--no-renames", "--name-only", "--format=", f"{base_commit}..HEAD"
    )
    paths = sorted({p for p in touched.splitlines() if p})
    # Non-cone patterns, anchored; a pattern's special characters escaped.
    patterns = "".join("/" + re.sub(r"([\\*?\[\]!#])", r"\\\1", p) + "\n" for p in paths)
    git.git(tree, "worktree", "add", "--no-checkout", "--detach", str(wt), base_commit)
    git.git(wt, "sparse-checkout", "set", "--no-cone", "--stdin", input=patterns.encode())
    git.git(wt, "reset", "-q", "--hard")


def versions(repo, name: str) -> dict[int, str]:
    out = {}
    for ref in repo.references:
        m = re.fullmatch(rf"{REF}/{re.escape(name)}/v(\d+)", ref.path)
        if m:
            out[int(m.group(1))] = ref.commit.hexsha
    return out


def build_branches(
    t: Target, tree: Path, groups: list[Group], signoff: str, version: int | None, log=print
) -> dict[str, Built]:
    gp = gitpython()
    repo = gp.Repo(tree)
    state = State.load(t)
    base_commit = state.base
    assert base_commit
    commits = series_commits(repo, base_commit)
    derives = derived(t)
    grouped = {p for g in groups for p in g.patches}
    names = list(commits)
    last = max((names.index(p) for p in grouped if p in commits), default=-1)
    # A patch in no pull request before a grouped one (the toolkit's own,
    # 0001) has files that later patches build on: they are left out of every
    # commit. One after every grouped patch (options kept for a measurement)
    # is only not picked: the pull requests hold their files as the grouped
    # patches leave them.
    toolkit = [name for name in names[: last + 1] if name not in grouped]
    trailing = [name for name in names[last + 1 :] if name not in grouped]
    exclude = sorted(
        {
            d.b_path or d.a_path
            for name in toolkit
            for d in commits[name].parents[0].diff(commits[name])
        }
    )
    if toolkit:
        log(
            f"pr: {', '.join(toolkit)} in no pull request (toolkit-only); their files are left "
            f"out of every commit: {', '.join(exclude)}"
        )
    if trailing:
        log(f"pr: {', '.join(trailing)} in no pull request, after them all: not picked")
    wt = t.out("pr") / ".worktree"
    git.drop_worktree(tree, wt)  # one a killed session left, locked or not
    had_config = git.run(tree, "config", "--get", WORKTREE_CONFIG).returncode == 0
    _sparse_worktree(tree, wt, base_commit)
    built: dict[str, Built] = {}
    st = stacks(groups)
    try:
        for g in order(groups):
            b = built[g.name] = Built(g)
            lower = built[st[g.name][-2].name] if len(st[g.name]) > 1 else None
            if lower and lower.head is None:
                b.problems.append(
                    f"the pull request it stacks on ({lower.group.name}) did not build"
                )
                continue
            b.lower = lower.head if lower else None
            b.credit = dict(lower.credit) if lower else {}
            git.git(wt, "checkout", "-q", "--detach", b.lower or base_commit)
            for p in sorted(g.patches, key=lambda x: names.index(x) if x in names else -1):
                if p not in commits:
                    b.problems.append(f"no commit of the series has Patch-Name: {p}")
                    continue
                touched = {d.b_path or d.a_path for d in commits[p].parents[0].diff(commits[p])}
                if left := sorted(touched & set(exclude)):
                    b.left_out[p] = left
                co_author = g.co_author if p in derives else None
                before = git.rev(wt, "HEAD")
                if problem := _pick(wt, commits[p], exclude, signoff, co_author):
                    b.problems.append(problem)
                    break
                if co_author and (picked := git.rev(wt, "HEAD")) != before and picked:
                    b.credit[picked] = co_author
            if b.problems:
                continue
            b.head = head = git.rev(wt, "HEAD") or ""
            b.own = [
                (c.hexsha, c.summary)
                for c in gp.Repo(wt).iter_commits(
                    f"{b.lower or base_commit}..{b.head}", reverse=True
                )
            ]
            have = versions(repo, g.name)
            if version is not None:
                n = version
                if n in have and have[n] != b.head:
                    raise ToolkitError(
                        f"{REF}/{g.name}/v{n} exists with other commits: pick "
                        "another --version (or leave it out for the next one)"
                    )
            elif have and have[max(have)] == b.head:
                n = max(have)
            else:
                n = max(have, default=0) + 1
            b.version, b.ref = n, f"{REF}/{g.name}/v{n}"
            gp.Reference.create(repo, b.ref, b.head, force=True)
            log(f"pr: {b.ref} = {head[:12]} ({len(b.own)} commit(s) to review)")
    finally:
        git.drop_worktree(tree, wt)
        if not had_config:  # sparse-checkout turned it on for the worktree's settings
            git.run(tree, "config", "--unset", WORKTREE_CONFIG)
    return built
