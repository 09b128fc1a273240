"""Move the series onto another vLLM release or a fork's ref, with a range-diff.

The work tree's commits are replayed with ``git rebase --onto`` (a three-way
merge per patch). A conflict stops the rebase where git stops it, and the
toolkit prints the patch, the files and the commands to continue or abort.
On success a markdown report under reports/ holds the ``git range-diff`` of
the series before and after. The pin (and with it patches/) moves with
``--update-pin``, given with the target or alone after a finished rebase onto
a release; a fork's ref never becomes the pin.

Help at each stop: the conflict hunks per file, upstream's own change to those
files between the old and the new base, the command for zdiff3 markers. A
resolution is made once: ``git rerere`` records it during the rebase, and
the records are kept with the series in ``patches/resolutions/`` (loaded
into the work tree before every rebase, saved after), so the same conflict
on the next rebase, or on another machine, resolves itself.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from serieskit import base, git, rebase_check, safety, series, target
from serieskit.errors import ToolkitError, failed, last_line
from serieskit.state import RebaseState, State
from serieskit.target import Target

REPORTS = "reports"
RESOLUTIONS = "resolutions"  # under patches/: git rerere's records of the series
# rerere on for the rebase's own git calls only (git.STABLE_CONFIG turns it off);
# autoUpdate stages what a recorded resolution resolved.
RERERE = ("-c", "rerere.enabled=true", "-c", "rerere.autoUpdate=true")


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
        raise ToolkitError(
            "a rebase is already stopped at a conflict: `nox -s rebase -- --continue` or `--abort`"
        )
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
    safety.guard(root, repo, state, "rebase", force, log)
    assert state.base and state.base_label and what
    if kind == "pypi":
        onto, sha = base.ensure_base(repo, what, None, log=log)
        version, label = what, what
    else:
        assert ref is not None
        onto, sha, version, label = _fetch_git(repo, what, ref, log), "", None, f"{what}@{ref}"
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
    proc = git.run(
        repo,
        *RERERE,
        "rebase",
        "--committer-date-is-author-date",
        "--no-autosquash",
        "--onto",
        onto,
        state.base,
        series.BRANCH,
    )
    return _after_git(root, proc, log)


def cont(where: Path | Target, log=print, finish=None):
    """Go on after a conflict was resolved; ``finish()`` ends a carry (the
    toolkit's own rebase writes its report)."""
    t = target.of(where)
    repo = t.work
    state = State.load(t)
    if finish is None:

        def finish():
            return _finish(t.root, log)

    if not state.rebase_stopped:
        raise ToolkitError(
            f"no {_kind(state) if state.rebase else 'rebase'} is stopped: nothing to continue"
        )
    if git.operation_in_progress(repo) != "rebase":
        return finish()
    safety.check_index_lock(repo, "rebase --continue")  # else git's failure reads as a stop
    unresolved = git.git(repo, "diff", "--name-only", "--diff-filter=U").split()
    if unresolved:
        raise ToolkitError(
            f"unresolved conflicts remain in {', '.join(unresolved)}: "
            f"edit them, `git -C {repo} add` them, then continue"
        )
    stopped = progress(repo)
    if stopped and state.rebase:
        state.rebase.resolved.append(stopped[2])
        state.save(t)
    proc = git.run(repo, *RERERE, "rebase", "--continue")
    return run_to_stop(t, proc, finish, log)


def abort(where: Path | Target, log=print) -> None:
    """Back to where the rebase (or carry) started; commits it already made
    (resolutions included) are kept under a backup ref."""
    t = target.of(where)
    repo = t.work
    state = State.load(t)
    if not state.rebase_stopped or state.rebase is None:
        raise ToolkitError(f"no {_kind(state)} is stopped: nothing to abort")
    rb = state.rebase
    kind = rb.kind
    head = git.rev(repo, "HEAD")
    if (
        head
        and head != rb.onto
        and git.git(repo, "rev-list", "--count", f"{rb.onto}..{head}").strip() != "0"
    ):
        ref = safety.backup_ref(repo, head, f"{kind}-progress")
        log(f"{kind}: the patches already moved onto {rb.target} are kept as {ref}")
    if git.operation_in_progress(repo) == "rebase":
        git.git(repo, "rebase", "--abort")
    save_resolutions(t, repo, log)  # the stops already resolved need no second hand
    if git.rev(repo, "HEAD") != rb.old_head:
        git.git(repo, "checkout", "-q", "-B", series.BRANCH, rb.old_head)
    state.rebase = None
    state.save(t)
    log(f"{kind}: aborted; the work tree is back at {rb.old_head[:12]} on vLLM {state.base_label}")


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
    sha = rb.sha256 or base.recorded_sha256(series.work_repo(root), rb.onto) or ""
    old = base.read_pin(root)
    base.write_pin(root, base.Pin(rb.version, sha, rb.onto, old.torch))
    state.rebase = None
    state.fingerprint = None  # patches/ are about to be written from the tree
    state.save(root)
    log(f"rebase: pin moved from vLLM {old.version} to {rb.version}; exporting patches/")
    if old.torch:
        log(
            f"rebase: the CPU tests still install torch {old.torch} (pin.toml: torch): "
            f"set the torch vLLM {rb.version} pins"
        )
    series.export(root, force=True, log=log)


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


def run_to_stop(at: Path | Target, proc, finish, log):
    """Drive a ``git rebase`` (the toolkit's rebase, or a carry) until it
    finishes (then ``finish()``) or stops at a conflict that no recorded
    resolution resolves (then the help and an error)."""
    t = target.of(at)
    repo = t.work
    # A stop that recorded resolutions resolved whole goes on by itself.
    last = None
    while True:
        if proc.returncode == 0 and git.operation_in_progress(repo) is None:
            return finish()
        if git.operation_in_progress(repo) != "rebase":
            raise failed("git rebase", proc)  # names a lock file in the way
        where = progress(repo)
        if where == last or git.git(repo, "diff", "--name-only", "--diff-filter=U").split():
            break
        last = where
        state = State.load(t)
        if where and state.rebase:
            state.rebase.resolved.append(f"{where[2]} (recorded resolution)")
            state.save(t)
        log(
            f"{_kind(state)}: step {where[0] if where else '?'} resolved by a recorded "
            f"resolution ({t.patches_label}/{RESOLUTIONS}/); going on"
        )
        proc = git.run(repo, *RERERE, "rebase", "--continue")
    for line in conflict_lines(t):
        log(line)
    raise ToolkitError(f"{_kind(State.load(t))} stopped at a conflict; nothing is lost (see above)")


def _kind(state: State) -> str:
    return state.rebase.kind if state.rebase else "rebase"


def load_resolutions(where: Path | Target, repo: Path, log=print) -> None:
    """The target's resolutions/ into the work tree's rr-cache (git rerere's records)."""
    t = target.of(where)
    src = t.patches / RESOLUTIONS
    if not src.is_dir():
        return
    dest = git.gitdir(repo) / "rr-cache"
    n = 0
    for entry in sorted(p for p in src.iterdir() if p.is_dir()):
        if not (dest / entry.name).exists():
            shutil.copytree(entry, dest / entry.name)
            n += 1
    if n:
        log(f"{n} recorded resolution(s) from {t.patches_label}/{RESOLUTIONS}/ loaded")


def save_resolutions(where: Path | Target, repo: Path, log=print) -> None:
    """Keep every resolution rerere recorded (preimage + postimage) with the series."""
    t = target.of(where)
    cache = git.gitdir(repo) / "rr-cache"
    dest = t.patches / RESOLUTIONS
    new = []
    for entry in sorted(cache.iterdir()) if cache.is_dir() else []:
        if (entry / "postimage").exists() and not (dest / entry.name).exists():
            (dest / entry.name).mkdir(parents=True)
            for name in ("preimage", "postimage"):
                shutil.copy2(entry / name, dest / entry.name / name)
            new.append(entry.name)
    if new:
        log(
            f"{len(new)} resolution(s) recorded in {t.patches_label}/{RESOLUTIONS}/ "
            "(commit them with the series: the next run reuses them)"
        )


def progress(repo: Path) -> tuple[int, int, str] | None:
    """(patch number, of how many, its subject) where a rebase is stopped."""
    merge = git.gitdir(repo) / "rebase-merge"
    if not merge.exists():
        return None
    stopped_file = merge / "stopped-sha"
    stopped = stopped_file.read_text().strip() if stopped_file.exists() else None
    done = _count_lines(merge / "done")
    total = done + _count_lines(merge / "git-rebase-todo")
    subject = git.commit_subject(repo, stopped) if stopped else "?"
    return done, total, subject


def conflict_lines(at: Path | Target) -> list[str]:
    """Where a stopped rebase (or carry) is, what upstream changed there, and
    the commands that go on from there."""
    t = target.of(at)
    repo = t.work
    state = State.load(t)
    rb = state.rebase
    assert rb
    carry = rb.kind == "carry"
    session = f"carry -- {t.version}" if carry else "rebase --"
    where = progress(repo)
    done, total, subject = where or (0, 0, "?")
    patch = _patch_file(t, subject)
    files = git.git(repo, "diff", "--name-only", "--diff-filter=U").split()
    lines = [
        (
            f"carry: the pin's changes onto the port to {t.version}, "
            f"stopped at step {done}/{total}:"
            if carry
            else f"rebase: onto {rb.target}, stopped at patch {done}/{total}:"
        ),
        f"  patch:  {subject}" + (f" ({t.patches_label}/{patch})" if patch else ""),
        "  files:  "
        + (
            ", ".join(
                f"{f} ({rebase_check.conflict_hunks(repo / f)} conflict hunk(s))" for f in files
            )
            if files
            else "(none unresolved; see git status)"
        ),
    ]
    if files:
        stat = git.git(repo, "diff", "--stat=100", rb.old_base, rb.onto, "--", *files)
        lines.append(f"  upstream changed them from {rb.old_label} to {rb.target}:")
        lines += [f"    {line.strip()}" for line in stat.splitlines()]
        lines.append(
            f"    whole diff: `git -C {repo} diff {rb.old_base[:12]} {rb.onto[:12]} "
            f"-- {' '.join(files)}`"
        )
        lines += added_beside(repo, rb.old_base, rb.onto, files + patch_added_files(repo))
        lines.append(
            f"  three-way markers (base in the middle): `git -C {repo} checkout "
            f"--conflict=zdiff3 -- {' '.join(files)}`"
        )
    if carry:
        lines.append(
            f"  the pin's change being carried: `git -C {repo} show "
            "REBASE_HEAD` (its interdiff since it was last carried)"
        )
    lines += [
        f"  to resolve: edit the files in {repo}, `git -C {repo} add <files>`, then "
        f"`nox -s {session} --continue` (the resolution is recorded for next time)",
        f"  to give up: `nox -s {session} --abort` (back to "
        f"{rb.old_head[:12]}; patches already moved are kept under a backup ref)",
    ]
    return lines


# How many of upstream's new files beside the conflicted ones a stop names.
ADDED_BESIDE_MAX = 12


def patch_added_files(repo: Path) -> list[str]:
    """Files that the patch a rebase is stopped at adds (new in its commit)."""
    stopped_file = git.gitdir(repo) / "rebase-merge" / "stopped-sha"
    if not stopped_file.exists():
        return []
    sha = stopped_file.read_text().strip()
    out = git.git(
        repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "--diff-filter=A", "--root", sha
    )
    return out.split()


def added_beside(repo: Path, old_base: str, onto: str, paths: list[str]) -> list[str]:
    """Files upstream added between the two bases in the folders of ``paths``
    (the conflicted files and the files the stopped patch adds), direct
    children only: a new module beside the conflict is often upstream's own
    version of what the patch does, a semantic conflict without a marker."""
    folders = sorted({str(Path(p).parent) for p in paths})
    if not folders:
        return []
    out = git.git(repo, "diff", "--name-only", "--diff-filter=A", old_base, onto, "--", *folders)
    added = [f for f in out.split() if str(Path(f).parent) in folders and f not in paths]
    if not added:
        return []
    lines = [
        "  upstream added beside them (the same folders; check that the patch "
        "does not duplicate one):"
    ]
    lines += [f"    {f}" for f in added[:ADDED_BESIDE_MAX]]
    if len(added) > ADDED_BESIDE_MAX:
        lines.append(
            f"    ... and {len(added) - ADDED_BESIDE_MAX} more: `git -C {repo} "
            f"diff --name-only --diff-filter=A {old_base[:12]} {onto[:12]} -- "
            f"{' '.join(folders)}`"
        )
    return lines


def _patch_file(t: Target, subject: str) -> str | None:
    for name in series.read_series(t):
        if series.read_patch(t.patches / name).subject == subject:
            return name
    return None


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(
        1 for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    )


def _finish(root: Path, log) -> Path:
    repo = series.work_repo(root)
    state = State.load(root)
    rb = state.rebase
    assert rb
    new_head = git.rev(repo, "HEAD")
    assert new_head
    save_resolutions(root, repo, log)
    rd = git.git(
        repo, "range-diff", "--no-color", f"{rb.old_base}..{rb.old_head}", f"{rb.onto}..{new_head}"
    )
    counts = summarize(rd)
    report = write_report(root, rb, new_head, rd, counts)
    state.base, state.base_label, state.head = rb.onto, rb.target, new_head
    state.applied = state.total = len(git.commits(repo, f"{rb.onto}..HEAD"))
    rb.done = True
    state.fingerprint = None
    state.save(root)
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
    path.write_text(
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
        "```diff\n" + range_diff.rstrip("\n") + "\n```\n"
    )
    return path
