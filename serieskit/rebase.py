"""Move the series onto another vLLM release or a fork's ref, with a range-diff.

The work tree's commits are replayed with ``git rebase --onto`` (a three-way
merge per patch). A conflict stops the rebase where git stops it, and the
toolkit prints the patch, the files and the commands to continue or abort.
On success a markdown report under reports/ holds the ``git range-diff`` of
the series before and after. The pin (and with it patches/) moves only with
``--update-pin``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from serieskit import base as b
from serieskit import git as g
from serieskit import series as s
from serieskit.errors import ToolkitError

REPORTS = "reports"
OLD_HEAD = "refs/series/rebase/old-head"


def parse_target(target: str) -> tuple[str, str | None, str | None]:
    """``vllm==X.Y.Z`` -> ("pypi", version, None); ``REPO@REF`` -> ("git", repo, ref)."""
    if m := re.fullmatch(r"vllm==(\S+)", target):
        b.check_version(m.group(1))
        return "pypi", m.group(1), None
    if "@" in target:
        repo, ref = target.rsplit("@", 1)
        if repo and ref:
            return "git", repo, ref
    raise ToolkitError(
        f"unknown rebase target {target!r}: use vllm==VERSION (a PyPI release) "
        "or REPO@REF (a git repository path or URL and a branch, tag or commit)"
    )


def start(root: Path, target: str, update_pin: bool = False, force: bool = False,
          log=print) -> Path | None:
    g.require_version()
    repo = s.work_repo(root)
    state = s.State.load(root)
    if state.rebase:
        raise ToolkitError("a rebase is already stopped at a conflict: "
                           "`nox -s rebase -- --continue` or `--abort`")
    if not g.is_repo(repo) or not state.base or state.in_progress or state.failed:
        raise ToolkitError("the work tree is not a complete series: run `nox -s apply` first")
    kind, what, ref = parse_target(target)
    if update_pin and kind != "pypi":
        raise ToolkitError("--update-pin needs a PyPI release target (vllm==VERSION)")
    if force:
        s.save_unsaved(repo, state, log)
    else:
        s.refuse_if_unsaved(repo, state, "rebase")
    if kind == "pypi":
        assert what is not None
        onto, sha = b.ensure_base(repo, what, None, log=log)
        label = what
    else:
        assert what is not None and ref is not None
        onto, sha, label = _fetch_git(repo, what, ref, log), "", f"{what}@{ref}"
    old_head = g.rev(repo, "HEAD")
    assert old_head
    g.git(repo, "update-ref", OLD_HEAD, old_head)
    state.rebase = {
        "target": label, "onto": onto, "sha256": sha, "old_base": state.base,
        "old_label": state.base_label, "old_head": old_head, "update_pin": update_pin,
        "version": what if kind == "pypi" else None,
    }
    state.save(root)
    n = len(g.commits(repo, f"{state.base}..HEAD"))
    log(f"rebase: {n} patch(es) from vLLM {state.base_label} onto {label} ({onto[:12]})")
    proc = g.run(repo, "rebase", "--committer-date-is-author-date", "--no-autosquash",
                 "--onto", onto, state.base, s.BRANCH)
    return _after_git(root, proc, log)


def cont(root: Path, log=print) -> Path | None:
    repo = s.work_repo(root)
    state = s.State.load(root)
    if not state.rebase:
        raise ToolkitError("no rebase is in progress")
    if g.operation_in_progress(repo) != "rebase":
        return _finish(root, log)
    unresolved = g.git(repo, "diff", "--name-only", "--diff-filter=U").split()
    if unresolved:
        raise ToolkitError(f"unresolved conflicts remain in {', '.join(unresolved)}: "
                           f"edit them, `git -C {repo} add` them, then continue")
    proc = g.run(repo, "rebase", "--continue")
    return _after_git(root, proc, log)


def abort(root: Path, log=print) -> None:
    repo = s.work_repo(root)
    state = s.State.load(root)
    if not state.rebase:
        raise ToolkitError("no rebase is in progress")
    if g.operation_in_progress(repo) == "rebase":
        g.git(repo, "rebase", "--abort")
    old = state.rebase["old_head"]
    if g.rev(repo, "HEAD") != old:
        g.git(repo, "checkout", "-q", "-B", s.BRANCH, old)
    state.rebase = {}
    state.save(root)
    log(f"rebase: aborted; the work tree is back at {old[:12]} on vLLM {state.base_label}")


def _fetch_git(repo: Path, url: str, ref: str, log) -> str:
    local = Path(url).expanduser()
    source = str(local.resolve()) if local.exists() else url
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{source}@{ref}").strip("_")[-120:]
    dest = f"refs/series/base/git/{safe}"
    log(f"rebase: fetching {ref} from {source}")
    proc = g.run(repo, "fetch", "--no-tags", "--quiet", source, f"+{ref}:{dest}",
                 isolated=False)
    if proc.returncode != 0:
        # A commit id is not a ref name: fetch it, then point our ref at it.
        proc = g.run(repo, "fetch", "--no-tags", "--quiet", source, ref, isolated=False)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise ToolkitError(f"cannot fetch {ref} from {source}: {err[-1] if err else 'git fetch failed'}")
        g.git(repo, "update-ref", dest, "FETCH_HEAD")
    commit = g.rev(repo, dest)
    assert commit
    return commit


def _after_git(root: Path, proc, log) -> Path | None:
    repo = s.work_repo(root)
    if proc.returncode == 0 and g.operation_in_progress(repo) is None:
        return _finish(root, log)
    if g.operation_in_progress(repo) != "rebase":
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ToolkitError(f"git rebase failed: {err[-1] if err else 'unknown error'}")
    _report_conflict(root, log)
    raise ToolkitError("rebase stopped at a conflict; nothing is lost (see above)")


def _report_conflict(root: Path, log) -> None:
    repo = s.work_repo(root)
    state = s.State.load(root)
    gitdir = Path(g.git(repo, "rev-parse", "--absolute-git-dir").strip())
    merge = gitdir / "rebase-merge"
    stopped = (merge / "stopped-sha").read_text().strip() if (merge / "stopped-sha").exists() else None
    done = _count_lines(merge / "done")
    total = done + _count_lines(merge / "git-rebase-todo")
    subject = g.git(repo, "log", "-1", "--format=%s", stopped).strip() if stopped else "?"
    patch = _patch_file(root, subject)
    files = g.git(repo, "diff", "--name-only", "--diff-filter=U").split()
    log(f"rebase: patch {done}/{total} does not apply cleanly on {state.rebase['target']}:")
    log(f"  patch:  {subject}" + (f" (patches/{patch})" if patch else ""))
    log("  files:  " + (", ".join(files) if files else "(none reported; see git status)"))
    log("  to resolve: edit the files in "
        f"{repo}, then `git -C {repo} add <files>` and `nox -s rebase -- --continue`")
    log("  to give up: `nox -s rebase -- --abort` (the work tree returns to "
        f"{state.rebase['old_head'][:12]}, nothing lost)")


def _patch_file(root: Path, subject: str) -> str | None:
    for name in s.read_series(root):
        if s.subject_of(root / s.PATCHES / name) == subject:
            return name
    return None


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines()
               if line.strip() and not line.startswith("#"))


def _finish(root: Path, log) -> Path:
    repo = s.work_repo(root)
    state = s.State.load(root)
    rb = state.rebase
    new_head = g.rev(repo, "HEAD")
    assert new_head
    rd = g.git(repo, "range-diff", "--no-color",
               f"{rb['old_base']}..{rb['old_head']}", f"{rb['onto']}..{new_head}")
    counts = summarize(rd)
    report = write_report(root, rb, new_head, rd, counts)
    state.base, state.base_label, state.head = rb["onto"], rb["target"], new_head
    state.applied = state.total = len(g.commits(repo, f"{rb['onto']}..HEAD"))
    state.rebase = {}
    state.fingerprint = None
    state.save(root)
    log(f"rebase: done, {format_counts(counts)}; report {report.relative_to(root)}")
    if rb.get("update_pin"):
        b.write_pin(root, b.Pin(rb["version"], rb["sha256"], rb["onto"]))
        log(f"rebase: pin moved to vLLM {rb['version']}; exporting patches/")
        s.export(root, log=log)
    else:
        log("rebase: pin and patches/ unchanged (`--update-pin` moves them)")
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


def write_report(root: Path, rb: dict, new_head: str, range_diff: str,
                 counts: dict[str, int]) -> Path:
    reports = root / REPORTS
    reports.mkdir(exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{rb['old_label']}-to-{rb['target']}")
    path = reports / f"rebase-{slug}.md"
    path.write_text(
        f"# Rebase of the series: vLLM {rb['old_label']} -> {rb['target']}\n\n"
        f"- date: {time.strftime('%Y-%m-%d', time.gmtime())}\n"
        f"- before: base {rb['old_base'][:12]}, head {rb['old_head'][:12]}\n"
        f"- after: base {rb['onto'][:12]}, head {new_head[:12]}\n"
        f"- patches: {format_counts(counts)}\n\n"
        "`git range-diff` of the series before and after (`=` unchanged, `!` changed,\n"
        "`<` only before, `>` only after):\n\n"
        "```diff\n" + range_diff.rstrip("\n") + "\n```\n"
    )
    return path
