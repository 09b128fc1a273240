"""Move the series onto another vLLM release or a fork's ref, with a range-diff.

The work tree's commits are replayed with ``git rebase --onto`` (a three-way
merge per patch). A conflict stops the rebase where git stops it, and the
toolkit prints the patch, the files and the commands to continue or abort.
On success a markdown report under reports/ holds the ``git range-diff`` of
the series before and after. The pin (and with it patches/) moves with
``--update-pin``, given with the target or alone after a finished rebase onto
a release; a fork's ref never becomes the pin.

Help at each stop (:mod:`.stops`, with ``--continue`` and ``--abort``): each
unresolved file in words (its conflict hunks, or deleted / renamed / added on
a side), upstream's own change to those files between the old and the new
base, the commands that resolve each. A resolution is made once:
``git rerere`` records it during the rebase, and the records are kept with
the series in ``patches/resolutions/`` (loaded into the work tree before
every rebase, saved after), so the same conflict on the next rebase, or on
another machine, resolves itself.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from serieskit import files, git, killpoint
from serieskit.errors import ToolkitError, last_line
from serieskit.series import base, export, safety, series, target
from serieskit.series.target import Target
from serieskit.state import RebaseState, State
from serieskit.upstream import stops
from serieskit.upstream.stops import (
    load_resolutions,
    run_git,
    run_to_stop,
    save_resolutions,
)

REPORTS = "reports"


def parse_target(target: str) -> tuple[str, str | None, str | None]:
    """``vllm==X.Y.Z`` -> ("pypi", version, None); ``REPO@REF`` -> ("git", repo, ref)."""
    if m := re.fullmatch(r"vllm==(\S+)", target):
        base.check_version(m.group(1))
        return "pypi", m.group(1), None
    if "@" in target:
        repo, ref = target.rsplit("@", 1)
        if repo and ref:
            return "git", repo, ref
    raise ToolkitError(
        f"unknown rebase target {target!r}: use vllm==VERSION (a PyPI release) "
        "or REPO@REF (a git repository path or URL and a branch, tag or commit)"
    )


def start(
    root: Path, target: str, update_pin: bool = False, force: bool = False, log=print
) -> Path | None:
    git.require_version()
    repo = series.work_repo(root)
    state = State.load(root)
    if state.rebase_stopped:
        raise ToolkitError(series.stopped_message(_pin(root), state))
    if not git.is_repo(repo) or not state.complete:
        raise ToolkitError("the work tree is not a complete series: run `nox -s apply` first")
    if op := git.operation_in_progress(repo):
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish it first")
    if git.branch(repo) != series.BRANCH:
        raise ToolkitError(
            f"HEAD is not on the branch `{series.BRANCH}` in {repo}: "
            f"`git -C {repo} checkout {series.BRANCH}` first"
        )
    kind, what, ref = parse_target(target)
    if update_pin and kind != "pypi":
        raise ToolkitError(
            "--update-pin needs a PyPI release target (vllm==VERSION): a fork's ref is not a pin"
        )
    assert state.base and state.base_label and what
    if not force:  # a refusal moves nothing: before the target is fetched
        safety.guard(root, repo, state, "rebase", force, log)
    # The target is fetched and checked before --force moves anything aside.
    if kind == "pypi":
        onto, sha = base.ensure_base(repo, what, None, log=log)
        version, label = what, what
    else:
        assert ref is not None
        onto, sha, version, label = _fetch_git(repo, what, ref, log), "", None, f"{what}@{ref}"
    if force:
        safety.guard(root, repo, state, "rebase", force, log)
    old_head = git.rev(repo, "HEAD")
    assert old_head
    state.rebase = RebaseState(
        target=label,
        onto=onto,
        old_base=state.base,
        old_label=state.base_label,
        old_head=old_head,
        version=version,
        sha256=sha,
        update_pin=update_pin,
    )
    state.save(root)
    n = len(git.commits(repo, f"{state.base}..HEAD"))
    log(f"rebase: {n} patch(es) from vLLM {state.base_label} onto {label} ({onto[:12]})")
    load_resolutions(root, repo, log)
    killpoint.reach("rebase.started")
    proc = run_git(
        root,
        "--committer-date-is-author-date",
        "--no-autosquash",
        "--onto",
        onto,
        state.base,
        series.BRANCH,
    )
    return _after_git(root, proc, log)


def _pin(root: Path) -> Target:
    return target.of(root)


def cont(root: Path, log=print) -> Path | None:
    """``rebase --continue``: on after a resolved conflict (:func:`.stops.cont`)."""
    return stops.cont(root, lambda: _finish(root, log), log)


def abort(root: Path, log=print) -> None:
    """``rebase --abort``: back to where it started (:func:`.stops.abort`)."""
    stops.abort(root, log)


def update_pin(root: Path, log=print) -> None:
    """After a finished rebase onto a release: move the pin there and export."""
    state = State.load(root)
    rb = state.rebase
    if rb is None or not rb.done:
        raise ToolkitError(
            "no finished rebase to take into the pin: "
            "`nox -s rebase -- vllm==VERSION --update-pin` does both"
        )
    if not rb.is_release:
        raise ToolkitError(
            f"the series is rebased onto {rb.target}, a fork's ref: the pin "
            "names a PyPI release; `nox -s apply -- --force` goes back to it"
        )
    assert rb.version
    repo = series.work_repo(root)
    sha = rb.sha256 or base.recorded_sha256(repo, rb.onto) or ""
    old = base.read_pin(root)
    base.write_pin(root, base.Pin(rb.version, sha, rb.onto, old.torch))
    state.rebase = None
    state.fingerprint = None  # patches/ are about to be written from the tree
    state.save(root)
    log(f"rebase: pin moved from vLLM {old.version} to {rb.version}; exporting patches/")
    was, now = base.torch_required(repo, rb.old_base), base.torch_required(repo, rb.onto)
    if old.torch and was != now:  # the same torch on both: pin.toml's torch still holds
        log(
            f"rebase: vLLM {rb.version} pins torch {now or '(none found)'}, vLLM "
            f"{rb.old_label} pinned {was or '(none found)'}: the CPU tests still install "
            f"torch {old.torch} (pin.toml: torch); set the one to test {rb.version} with"
        )
    export.export(root, force=True, log=log)


def _fetch_git(repo: Path, url: str, ref: str, log) -> str:
    local = Path(url).expanduser()
    if url.startswith(("/", ".", "~")) and not local.exists():
        raise ToolkitError(f"no repository at {url}: give an existing path or a URL")
    source = str(local.resolve()) if local.exists() else url
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{source}@{ref}").strip("_")[-120:]
    dest = f"refs/series/base/git/{safe}"
    log(f"rebase: fetching {ref} from {source}")
    proc = git.run(repo, "fetch", "--no-tags", "--quiet", source, f"+{ref}:{dest}", isolated=False)
    if proc.returncode != 0:
        # A commit id is not a ref name: fetch it, then point our ref at it.
        proc = git.run(repo, "fetch", "--no-tags", "--quiet", source, ref, isolated=False)
        if proc.returncode != 0:
            reason = last_line(proc.stderr, "git fetch failed").removeprefix("fatal: ")
            raise ToolkitError(f"cannot fetch {ref} from {source}: {reason}")
        git.git(repo, "update-ref", dest, "FETCH_HEAD")
    commit = git.rev(repo, dest)
    assert commit
    return commit


def _after_git(root: Path, proc, log) -> Path | None:
    return run_to_stop(root, proc, lambda: _finish(root, log), log)


def _finish(root: Path, log) -> Path:
    repo = series.work_repo(root)
    state = State.load(root)
    rb = state.rebase
    assert rb
    new_head = git.rev(repo, "HEAD")
    assert new_head
    killpoint.reach("rebase.finishing")
    save_resolutions(root, repo, log)
    rd = git.git(
        repo, "range-diff", "--no-color", f"{rb.old_base}..{rb.old_head}", f"{rb.onto}..{new_head}"
    )
    counts = summarize(rd)
    report = write_report(root, rb, new_head, rd, counts)
    # patches/ still as the tree was made from it (the fingerprint the rebase
    # started with): the rebased tree is made from it too, so export may write
    # it (a rebase onto the pin's own release is exported at once). Otherwise
    # none: export refuses until apply or --force.
    unchanged = state.fingerprint == series.fingerprint(root, rb.old_base)
    state.base, state.base_label, state.head = rb.onto, rb.target, new_head
    state.applied = state.total = len(git.commits(repo, f"{rb.onto}..HEAD"))
    rb.done = True
    state.fingerprint = series.fingerprint(root, rb.onto) if unchanged else None
    state.moved = {"label": rb.old_label, "base": rb.old_base, "onto": rb.onto}
    state.save(root)
    base.mark_current(repo, rb.onto)
    log(f"rebase: done, {format_counts(counts)}; report {report.relative_to(root)}")
    if rb.update_pin:
        update_pin(root, log)
    elif rb.is_release:
        log("rebase: pin and patches/ unchanged; `nox -s rebase -- --update-pin` moves them")
    else:
        log(f"rebase: pin and patches/ stay on vLLM {rb.old_label} (a fork's ref is no pin)")
    return report


def summarize(range_diff: str) -> dict[str, int]:
    """Count range-diff pairs: = unchanged, ! changed, < dropped, > added."""
    counts = {"unchanged": 0, "changed": 0, "dropped": 0, "added": 0}
    names = {"=": "unchanged", "!": "changed", "<": "dropped", ">": "added"}
    for line in range_diff.splitlines():
        m = re.match(r"^\s*(?:\d+|-):\s+[0-9a-f-]+\s+([=!<>])\s+(?:\d+|-):", line)
        if m:
            counts[names[m.group(1)]] += 1
    return counts


def format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def classify(range_diff: str) -> list[tuple[str, int, int]]:
    """Per changed pair of a range-diff: (subject, changed lines of the patch's
    own (+/- lines of its diff), changed context and hunk headers). A port
    that only moved context shows 0 in the first column."""
    rows: list[tuple[str, int, int]] = []
    for line in range_diff.splitlines():
        if m := re.match(r"^\s*(?:\d+|-):\s+[0-9a-f-]+\s+!\s+(?:\d+|-):\s+[0-9a-f]+\s+(.*)$", line):
            rows.append((m.group(1), 0, 0))
        elif rows and line.startswith("    ") and len(line) > 5 and line[4] in "+-":
            subject, own, context = rows[-1]
            if line[5] in "+-" and not line[5:].startswith(("+++", "---")):
                rows[-1] = (subject, own + 1, context)
            else:
                rows[-1] = (subject, own, context + 1)
    return rows


def write_report(
    root: Path, rb: RebaseState, new_head: str, range_diff: str, counts: dict[str, int]
) -> Path:
    """reports/rebase-FROM-to-TO-<UTC time>.md: one file per run."""
    reports = root / REPORTS
    reports.mkdir(exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{rb.old_label}-to-{rb.target}")
    path = reports / f"rebase-{slug}-{safety.stamp()}.md"
    n = 1
    while path.exists():
        n += 1
        path = path.with_name(f"rebase-{slug}-{safety.stamp()}-{n}.md")
    resolved = "".join(f"- {s}\n" for s in rb.resolved) or "- none\n"
    changed = "".join(
        f"| {subject} | {own} | {context} |\n" for subject, own, context in classify(range_diff)
    )
    files.write(
        path,
        f"# Rebase of the series: vLLM {rb.old_label} -> {rb.target}\n\n"
        f"- date: {time.strftime('%Y-%m-%d', time.gmtime())}\n"
        f"- before: base {rb.old_base[:12]}, head {rb.old_head[:12]}\n"
        f"- after: base {rb.onto[:12]}, head {new_head[:12]}\n"
        f"- patches: {format_counts(counts)}\n\n"
        "Stops resolved by hand (or by a recorded resolution):\n\n"
        + resolved
        + "\n"
        + (
            "Changed patches: lines of the patch's own diff that changed, and lines of\n"
            "moved context or hunk headers (a patch with 0 in the first column only moved):\n\n"
            "| patch | own lines | context |\n|---|---|---|\n" + changed + "\n"
            if changed
            else ""
        )
        + "`git range-diff` of the series before and after (`=` unchanged, `!` changed,\n"
        "`<` only before, `>` only after):\n\n"
        "```diff\n" + range_diff.rstrip("\n") + "\n```\n",
    )
    return path


# Where text naming the old release or a removed file is looked for after a move.
SCANNED = ("README.md", "docs/*.md", f"{series.PATCHES}/manifest.toml")
MENTIONS_MAX = 20


def stale_mentions(root: Path, repo: Path, old_label: str, old_base: str, onto: str) -> list[str]:
    """``path:line: text`` for each line of the README, docs/*.md and the
    manifest that names the old release (``old_label``, where it is a
    version other than the new base's) or a file the new base removed (as a
    path, or as a dotted module for a .py file). A list to review: lines
    about history are among them."""
    removed = set(
        git.git(
            repo, "diff", "--name-only", "--no-renames", "--diff-filter=D", "-z", old_base, onto
        ).split("\0")
    ) - {""}
    modules = {
        p.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for p in removed
        if p.endswith(".py")
    }
    version = (
        re.compile(rf"(?<![\w.]){re.escape(old_label)}(?![\w]|\.\d)")
        if re.fullmatch(r"\d+(\.\d+)+", old_label)
        and git.rev(repo, base.base_ref(old_label)) != onto
        else None
    )
    found: list[str] = []
    paths = sorted({p for pattern in SCANNED for p in root.glob(pattern) if p.is_file()})
    for path in paths:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            at = _named_at(line, version, removed, modules)
            if at is not None:
                text = line.strip()
                i = max(0, text.find(at) - 60)
                snippet = (
                    ("..." if i else "")
                    + text[i : i + 150]
                    + ("..." if len(text) > i + 150 else "")
                )
                found.append(f"{path.relative_to(root)}:{n}: {snippet}")
    return found


def _named_at(
    line: str, version: re.Pattern | None, removed: set[str], modules: set[str]
) -> str | None:
    """What ``line`` names of the old release or the removed files, or None."""
    if version and (m := version.search(line)):
        return m.group(0)
    for token in re.findall(r"[\w./-]+", line):
        token = token.strip("./-")
        if token in removed:
            return token
        parts = token.split(".")
        for k in range(len(parts), 1, -1):  # vllm.a.b.Class names module vllm.a.b
            if ".".join(parts[:k]) in modules:
                return token
    return None
