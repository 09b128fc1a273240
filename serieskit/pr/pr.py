"""Upstream pull requests from the series, with their evidence.

The manifest's ``[[pr]]`` tables group the patches into pull requests
(:mod:`.groups`). For each group the session builds its branch
(:mod:`.branches`: the lower groups' commits first, then its own, re-signed
by the contributor), checks it (DCO, title, template sections, claims,
vLLM's limits, the tree's pre-commit) and writes ``.work/pr/<name>/``:
``title.txt``, ``body.md`` (the target tree's own pull-request template,
filled from results files through claims, :mod:`.prbody`),
``range-diff.txt`` against the previous version and ``check.json``.

Commits, trailers and refs are read through GitPython; am, format-patch and
range-diff are git porcelain run through :mod:`serieskit.git`.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.checks import lint, names, stated
from serieskit.errors import ToolkitError
from serieskit.pr import bodycheck, claims, duplicates, mainline, prbody
from serieskit.pr.branches import (
    PLACEHOLDER,
    REF,
    Built,
    build_branches,
    identity,
    onto_target,
    versions,
)
from serieskit.pr.groups import gitpython, head_blobs, order, read_groups, stacks
from serieskit.series import safety, series
from serieskit.series.target import Target
from serieskit.state import State

MAX_OPEN = 6  # vLLM's contributing guide: at most 6 open pull requests
RFC_LINES = 500  # ... and an RFC issue first for more changed lines outside these:
NOT_COUNTED = ("tests/", "csrc/", "vllm/config/", "vllm/kernels/", "docs/")
TITLE = re.compile(r"^(\[[^][]+\])+ +[^\s].*$")  # vLLM's pr-title check
TEMPLATE = ".github/PULL_REQUEST_TEMPLATE.md"
NO_HOOKS = "no hooks"  # pre-commit detail: nothing to run, so nothing fails
# The committed examples (reports/pr/<name>/): made by this contributor, with
# no --others or --upstream, line coverage or per-PR pre-commit (CI's lint
# stage runs the tree's hooks on the whole series), so that CI can make them
# again and compare (`pr --examples --check`).
EXAMPLES = "reports/pr"
EXAMPLE_SIGNOFF = "Example Contributor <contributor@example.com>"
EXAMPLE_FILES = ("body.md", "check.json")


# --- checks -----------------------------------------------------------------


def check_signoff(repo, rng: str, signoff: str, credit: dict[str, str]) -> list[str]:
    """Every commit by the contributor, signed off by them alone; those in
    ``credit`` (commit -> co-author) credit the original author."""
    name, mail = identity(signoff)
    problems = []
    for c in repo.iter_commits(rng):
        trailers = c.trailers_list
        who = f"{c.hexsha[:12]} {c.summary}"
        if (c.author.name, c.author.email) != (name, mail):
            problems.append(f"{who}: author {c.author.name} <{c.author.email}>")
        if (c.committer.name, c.committer.email) != (name, mail):
            problems.append(f"{who}: committer {c.committer.name} <{c.committer.email}>")
        sobs = [v for k, v in trailers if k == "Signed-off-by"]
        if f"{name} <{mail}>" not in sobs:
            problems.append(f"{who}: no Signed-off-by: {signoff}")
        problems += [f"{who}: signed off by {s} too" for s in sobs if s != f"{name} <{mail}>"]
        co = credit.get(c.hexsha)
        if co and co not in [v for k, v in trailers if k == "Co-authored-by"]:
            problems.append(f"{who}: derives from the original work but lacks Co-authored-by: {co}")
        if any(k == series.NAME_TRAILER for k, _ in trailers) or PLACEHOLDER in c.message:
            problems.append(f"{who}: still carries the toolkit's trailers")
    return problems


def empty_sections(body: str) -> list[str]:
    """Template sections (## headings) with nothing but comments and blanks."""
    out = []
    parts = re.split(r"^## +(.+?)\s*$", body, flags=re.M)
    for heading, text in zip(parts[1::2], parts[2::2], strict=True):
        text = re.sub(r"<!--.*?-->", "", text.split("\n---")[0], flags=re.S)
        if not text.strip():
            out.append(heading)
    return out


def run_checks(
    t: Target,
    tree: Path,
    b: Built,
    body: str,
    checked: list[claims.Checked],
    signoff: str,
    n_groups: int,
    stack_len: int,
    counted: int,
    pre: tuple[list[str] | None, str],
    on_main: mainline.OnMain | None = None,
) -> list[dict]:
    gp = gitpython()
    repo = gp.Repo(tree)
    state = State.load(t)
    out: list[dict] = []

    def add(name: str, problems: list[str] | None, detail: str = "") -> None:
        out.append(
            {
                "check": name,
                "ok": None if problems is None else not problems,
                "problems": problems or [],
                "detail": detail,
            }
        )

    applies = list(b.problems)
    if b.ref and not applies:
        if repo.commit(b.ref).hexsha != b.head:
            applies.append(f"{b.ref} does not point at the built head")
        if b.lower and not repo.is_ancestor(b.lower, b.ref):
            applies.append("the lower pull request's head is not in this branch")
    add("applies to its ref", applies, b.ref or "")
    add(
        "applies on upstream main",
        None,
        on_main.words() if on_main else "not checked (no --upstream given)",
    )
    add(
        "Signed-off-by of the contributor",
        check_signoff(repo, f"{state.base}..{b.head}", signoff, b.credit)
        if b.head
        else ["not built"],
    )
    add(
        "title",
        []
        if TITLE.match(b.group.title)
        else [f"{b.group.title!r} fails vLLM's title check {TITLE.pattern}"],
    )
    add("template sections", [f"section {s!r} is empty" for s in empty_sections(body)])
    add(
        "template placeholders and checklist",
        bodycheck.placeholders(body),
        "left to the contributor: " + bodycheck.left(body),
    )
    add("words a reviewer knows", bodycheck.jargon(body))
    add(
        "every path the body names is in the pull request",
        bodycheck.missing_paths(
            body, lambda p: git.run(tree, "cat-file", "-e", f"{b.head}:{p}").returncode == 0
        )
        if b.head
        else None,
    )
    add("claims", list(dict.fromkeys(p for c in checked for p in c.problems)))
    add(
        f"at most {MAX_OPEN} pull requests in a stack",
        [f"{n_groups} pull requests in the set, {stack_len} in this stack"]
        if max(n_groups, stack_len) > MAX_OPEN
        else [],
    )
    rfc = b.group.rfc
    add(
        f"RFC for more than {RFC_LINES} lines outside kernels, config and tests",
        (
            []
            if counted <= RFC_LINES or (rfc and (t.root / rfc).is_file())
            else [
                f"{counted} changed lines outside {', '.join(NOT_COUNTED)}: write the RFC and "
                'name it as rfc = "..." in its [[pr]]' + (f" ({rfc} is missing)" if rfc else "")
            ]
        )
        + (bodycheck.rfc_count(t.root / rfc, counted) if rfc else []),
        f"{counted} lines" + (f"; RFC draft {rfc}" if rfc and counted > RFC_LINES else ""),
    )
    add("pre-commit on the changed files", *pre)
    return out


def precommit(
    t: Target, tree: Path, b: Built, base_commit: str, strict: bool, log_dir: Path | None = None
) -> tuple[list[str] | None, str]:
    """(problems or None when not run, detail): the PR head's own pre-commit
    config on its commits (:func:`serieskit.checks.lint.precommit_changed`), the log
    in ``pre-commit.txt`` beside its body (``.work/pr/<name>/``). Without
    pre-commit installed it is "not run", and a problem under ``strict``
    (``--check``)."""
    if not b.head:
        return None, "not built"
    if git.run(tree, "cat-file", "-e", f"{b.head}:{lint.CONFIG}").returncode != 0:
        return [], f"{NO_HOOKS}: the target tree has no {lint.CONFIG}"
    try:
        lint.require_tools()
    except ToolkitError as e:
        return ([f"not run: {e}"] if strict else None), f"not run: {e}"
    lines: list[str] = []
    failed = lint.precommit_changed(
        tree, t.out("lint") / "pr", b.lower or base_commit, b.head, log=lines.append
    )
    dest = (log_dir or t.out("pr") / b.group.name) / "pre-commit.txt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines) + "\n")
    rel = dest.relative_to(t.root) if dest.is_relative_to(t.root) else dest
    return [f"hook {h} fails (see {rel})" for h in failed], f"log: {rel}"


def rfc_lines(tree: Path, lower: str, head: str) -> int:
    """Lines a PR's own commits add or remove outside kernels, config and tests."""
    total = 0
    for line in git.git(tree, "diff", "--numstat", lower, head).splitlines():
        added, removed, path = line.split("\t", 2)
        if not path.startswith(NOT_COUNTED) and added != "-":
            total += int(added) + int(removed)
    return total


# --- the session -------------------------------------------------------------


def require_exported(t: Target) -> None:
    """The pull requests are made of the series as its patch folder holds it:
    refuse a work tree with work not written there (it would go on without
    it), or made from patch files that changed since."""
    tree, state = t.work, State.load(t)
    work = safety.unsaved_work(tree, state, log=lambda *_: None)
    if work:
        raise ToolkitError(
            "\n".join(
                [
                    f"pr: the work tree {tree} holds work not in {t.patches_label}/, which the "
                    "pull requests would leave out:",
                    *work.describe(tree),
                    f"  `{t.cmd('export')}` writes commits there (commit your changes first), "
                    f"or stash them (`git -C {tree} stash -u`)",
                ]
            )
        )
    if state.base and state.fingerprint != series.fingerprint(t, state.base):
        raise ToolkitError(
            f"pr: {t.patches_label}/ changed since the work tree was made from it: "
            f"`{t.cmd('apply')}` makes it anew (keeping your work)"
        )


def session(
    root: Path,
    onto: str | None,
    signoff: str | None,
    version: int | None = None,
    others: Path | None = None,
    check: bool = False,
    manifest: Path | None = None,
    out_dir: Path | None = None,
    push: bool = False,
    remote: str | None = None,
    gh: bool = False,
    upstream: str | None = None,
    upstream_ref: str = "HEAD",
    examples: bool = False,
    log=print,
) -> dict[str, list[dict]]:
    if examples:
        signoff = signoff or EXAMPLE_SIGNOFF
        if signoff != EXAMPLE_SIGNOFF or others or upstream or push:
            raise ToolkitError(
                f'pr --examples makes {EXAMPLES}/ as CI does: --signoff "{EXAMPLE_SIGNOFF}" '
                "(or none), without --others, --upstream or --push"
            )
    if not signoff:
        raise ToolkitError(
            'pr needs --signoff "Name <mail>": every commit is re-signed '
            "with the contributor's identity"
        )
    identity(signoff)
    t = onto_target(root, onto)
    tree = series.applied_tree(t)
    require_exported(t)
    safety.clear_stale_locks(tree, "pr", log)
    groups = read_groups(root, manifest)
    if not groups:
        raise ToolkitError("patches/manifest.toml has no [[pr]] tables")
    st = stacks(groups)
    built = build_branches(t, tree, groups, signoff, version, log)
    state = State.load(t)
    assert state.base
    head = git.rev(tree, "HEAD") or ""
    template = tree / TEMPLATE
    if not template.is_file():
        raise ToolkitError(f"{template} does not exist: the target tree has no PR template")
    main = mainline.fetch(tree, upstream, upstream_ref) if upstream else None
    if main:
        log(f"pr: upstream main {main[0][:12]} ({main[1]}) from {upstream} {upstream_ref}")
    out_root = out_dir or t.out("pr")
    results: dict[str, list[dict]] = {}
    failed = []
    run = Run(
        t,
        tree,
        built,
        st,
        state,
        head,
        template.read_text(),
        main,
        others,
        out_root,
        signoff,
        len(groups),
        check or push,
        log,
        examples,
    )
    for g in order(groups):
        res = run.one(g)
        results[g.name] = res
        for c in res:
            if c["ok"] is False:
                failed += [f"{g.name}: {c['check']}: {p}" for p in c["problems"]]
    # The texts the bodies are made of, the RFCs, commit messages and pages:
    # names the code has left behind (serieskit/checks/names.py). The same
    # check of the same texts is `docs --check`'s, a stage of CI before the
    # examples': --examples leaves it to that one.
    gone = [] if examples else names.check(t, tree, state.base)
    failed += [f"names: {p}" for p in gone]
    # Figures the texts state that their cited results files do not hold.
    failed += [f"figures: {p}" for p in stated.check(root, stated.pr_texts(root), cite=True)]
    # and that the path contracts state beside the files they name (evidence).
    for g in order(groups):
        for r in g.paths:
            said = " ".join(str(v) for k, v in r.items() if k not in ("evidence", "route"))
            for p in stated.contract(root, said, r.get("evidence", [])):
                failed.append(f"figures: {g.name}: the path {r.get('path')!r} {p}")
    if gone and not (check or push):
        log(f"pr: {len(gone)} name(s) in code format that the code lacks (--check lists them)")
    if examples:
        failed += compare_examples(root, out_root, [g.name for g in order(groups)], write=not check)
    if (check or push) and failed:
        raise ToolkitError(
            "pr --check failed:\n"
            + "\n".join(f"  {f}" for f in failed)
            + ("\n  nothing pushed" if push else "")
        )
    if push:
        publish(tree, [built[g.name] for g in order(groups)], out_root, remote, gh, log)
    return results


@dataclass
class Run:
    """What every pull request of one session shares."""

    t: Target
    tree: Path
    built: dict[str, Built]
    stacks: dict
    state: State
    head: str  # the series head
    template: str
    main: tuple[str, str] | None  # upstream main's (commit, date), with --upstream
    others: Path | None
    out_root: Path
    signoff: str
    n_groups: int
    strict: bool
    log: Callable[[str], object]
    examples: bool = False

    def one(self, g) -> list[dict]:
        """One pull request: its claims, body, range-diff and checks, into
        ``out_root/<name>``."""
        return _one(self, g)


def _one(run: Run, g) -> list[dict]:
    t, tree, state, b = run.t, run.tree, run.state, run.built[g.name]
    root, main, others, log = t.root, run.main, run.others, run.log
    base = state.base or ""
    start = b.lower or base
    files = sorted(git.git(tree, "diff", "--name-only", start, b.head).split()) if b.head else []
    blobs = head_blobs(tree, [b.head, run.head] if b.head else [run.head], files)
    checked = [claims.check(root, c, blobs, g.changed_since, state.base_label) for c in g.claims]
    dup = (
        duplicates.check(tree, base, b.head, start, g.keywords, others)
        if others and b.head
        else None
    )
    dest = run.out_root / g.name
    dest.mkdir(parents=True, exist_ok=True)
    pre = (
        (None, f"not run for {EXAMPLES}/ (the lint stage runs the tree's hooks on the series)")
        if run.examples
        else precommit(t, tree, b, base, run.strict, dest)
    )
    counted = rfc_lines(tree, start, b.head) if b.head else 0
    on_main = (
        mainline.check(tree, t.out("pr") / ".upstream", *main, base, b.head)
        if main and b.head
        else None
    )
    ctx = prbody.Context(
        state.base_label or "",
        state.base,
        on_main.words() if on_main else "",
        counted,
        None if pre[0] is None else not pre[0],
        hooks=not pre[1].startswith(NO_HOOKS),
    )
    body = prbody.render(
        root,
        tree,
        run.template,
        g,
        b,
        run.built,
        run.stacks,
        checked,
        dup,
        ctx,
        blobs,
        coverage="" if run.examples else None,
    )
    (dest / "title.txt").write_text(g.title + "\n")
    (dest / "body.md").write_text(body)
    prev = b.version - 1
    refs = versions(gitpython().Repo(tree), g.name)
    if b.head and prev in refs:
        rd = git.git(tree, "range-diff", "--no-color", base, refs[prev], b.head)
    else:
        rd = f"v{b.version}: no previous version\n"
    (dest / "range-diff.txt").write_text(rd)
    res = run_checks(
        t,
        tree,
        b,
        body,
        checked,
        run.signoff,
        run.n_groups,
        len(run.stacks[g.name]),
        counted,
        pre,
        on_main,
    )
    record = {
        "name": g.name,
        "ref": b.ref,
        "head": b.head,
        "version": b.version,
        "title": g.title,
        "checks": res,
    }
    (dest / "check.json").write_text(json.dumps(record, indent=2) + "\n")
    bad = [c for c in res if c["ok"] is False]
    log(f"pr {g.name}: {dest} ({'ok' if not bad else str(len(bad)) + ' check(s) failed'})")
    log(f"pr {g.name}: left to you in body.md: {bodycheck.left(body)}")
    if not others:
        log(f"pr {g.name}: no duplicate check (--others DIR of open pull requests not given)")
    return res


def example(name: str, file: str, text: str) -> str:
    """A file of the session as its committed example: the branch's version
    (which counts this clone's earlier sessions) as vN."""
    if file != "check.json":
        return text
    record = json.loads(re.sub(rf"({re.escape(REF)}/{re.escape(name)}/v)\d+", r"\1N", text))
    record.pop("version", None)
    return json.dumps(record, indent=2) + "\n"


def compare_examples(root: Path, out_root: Path, names: list[str], write: bool) -> list[str]:
    """Write the session's files as the examples, or (``write`` false) the
    examples that differ from them, each with its diff."""
    problems = []
    for name in names:
        for file in EXAMPLE_FILES:
            made = example(name, file, (out_root / name / file).read_text())
            path = root / EXAMPLES / name / file
            if write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(made)
                continue
            old = path.read_text() if path.is_file() else ""
            if old != made:
                diff = difflib.unified_diff(
                    old.splitlines(),
                    made.splitlines(),
                    str(path.relative_to(root)),
                    "now",
                    lineterm="",
                )
                problems.append(
                    f"{EXAMPLES}/{name}/{file} is not what the session writes now "
                    f"(`python -m serieskit pr --examples` after `nox -s apply` and `nox -s test` "
                    "writes it):\n" + "\n".join(list(diff)[:40])
                )
    return problems


def publish(
    tree: Path, built: list[Built], out_root: Path, remote: str | None, gh: bool, log=print
) -> None:
    """The optional last step: push each branch to the fork, open draft PRs."""
    if not remote:
        raise ToolkitError("--push needs --remote (the fork: a URL or a remote's name)")
    if gh and shutil.which("gh") is None:
        raise ToolkitError("--gh needs the GitHub CLI `gh` on PATH")
    for b in built:
        branch = f"series-pr/{b.group.name}-v{b.version}"
        proc = git.run(tree, "push", remote, f"{b.ref}:refs/heads/{branch}", isolated=False)
        if proc.returncode != 0:
            raise ToolkitError(
                f"git push of {b.ref} to {remote} failed:\n" + proc.stderr.decode(errors="replace")
            )
        log(f"pr: pushed {b.ref} to {remote} {branch}")
        if gh:
            dest = out_root / b.group.name
            cmd = [
                "gh",
                "pr",
                "create",
                "--draft",
                "--repo",
                "vllm-project/vllm",
                "--base",
                "main",
                "--head",
                branch,
                "--title",
                b.group.title,
                "--body-file",
                str(dest / "body.md"),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ToolkitError(
                    f"{' '.join(cmd[:4])} for {b.group.name} failed:\n" + done.stderr
                )
            log(f"pr: draft {done.stdout.strip()}")
