"""``export``: the work tree's commits written back to patches/, byte-stable.

Every drifting detail (commit ids, git version, numbering) is held fixed, so
apply + export changes no byte. The patch folder is written only from a
complete series at the branch head, and the previous version of every patch
file rewritten or removed is kept first.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from serieskit import files, git, killpoint
from serieskit.errors import ToolkitError
from serieskit.series import safety, target
from serieskit.series.apply import stopped_ways
from serieskit.series.series import (
    BRANCH,
    SERIES,
    Where,
    check_manifest,
    fingerprint,
    fingerprint_of,
    finish_interrupted_export,
    format_patches,
    read_series,
    record_export,
    stopped_message,
)
from serieskit.state import State


def require_exportable(where: Where, state: State, force: bool = False) -> Path:
    """Refuse to write the patch folder unless the work tree holds a complete,
    applied series at the head of its branch, on the target's base, made from
    the patch files that are there now."""
    t = target.of(where)
    repo, label = t.work, t.patches_label
    if not git.is_repo(repo) or not state.base:
        raise ToolkitError(f"no work tree: run `{t.cmd('apply')}` first")
    if state.rebase_stopped:
        raise ToolkitError(stopped_message(t, state))
    safety.check_left_by(repo, "export", made=None)  # no git operation is export's own
    if state.in_progress == "continue":
        raise ToolkitError(
            f"an apply --continue was interrupted at {state.applied}/{state.total}: "
            f"the work tree is not the whole series; `{t.cmd('apply', '--continue')}` goes on"
        )
    if state.in_progress:
        raise ToolkitError(
            f"an apply was interrupted at {state.applied}/{state.total}: "
            f"the work tree is not the whole series; `{t.cmd('apply')}` redoes it"
        )
    if state.failed:
        raise ToolkitError(
            f"the last apply stopped at {label}/{state.failed}: the work tree "
            f"holds {state.applied}/{state.total} patches, and export would "
            f"drop the rest; {stopped_ways(t, state)}"
        )
    if state.base != t.commit and (t.commit is None or state.base_label == t.version):
        # Same release, another commit: the file's commit is the difference.
        file = "pin.toml" + (f" (port {t.version})" if t.port else "")
        have = f"records {t.commit[:12]}" if t.commit else "records none"
        raise ToolkitError(
            f"the work tree is on vLLM {t.version}'s base {state.base[:12]}, and {file} "
            f"{have} as that base's commit: set its commit to {state.base} if the base is "
            f"right (`git diff pin.toml` shows what changed), then `{t.cmd('apply', '--force')}`"
        )
    if state.base != t.commit:
        owner = f"the port's ({label})" if t.port else "the pin's"
        raise ToolkitError(
            f"the work tree is on {state.base_label} ({state.base[:12]}), {owner} base on "
            f"{t.version}: export writes patches for {owner} base"
            + (
                " (`nox -s rebase -- --update-pin` moves the pin)"
                if state.rebase and state.rebase.is_release
                else ""
            )
        )
    if (on := git.branch(repo)) != BRANCH:
        where_ = "detached" if on is None else f"on branch {on}"
        raise ToolkitError(
            f"HEAD is {where_} in {repo}: export writes the branch "
            f"`{BRANCH}`; `git -C {repo} checkout {BRANCH}` first"
        )
    if not force and not state.exporting and state.fingerprint != fingerprint(t, state.base):
        raise ToolkitError(
            f"{label}/ changed since the work tree was made from it: `{t.cmd('apply')}` takes "
            f"those changes (it keeps your work first), or `{t.cmd('export', '--force')}` "
            f"overwrites them (keeping the current files under {safety.BACKUP_DIR}/)"
        )
    return repo


def export(where: Where, check: bool = False, force: bool = False, log=print) -> list[str]:
    """Regenerate the patch folder from the work tree's commits; return changed names.

    With ``check`` nothing is written: the names that would change are returned.
    """
    t = target.of(where)
    state = State.load(t)
    if not check:
        finish_interrupted_export(t, state, log)
    repo = require_exportable(t, state, force=force or check)
    assert state.base
    for left in files.clear_leftovers(t.patches):
        log(f"export: removed {left}, a file a killed export left half-made")
    if state.exporting and not check:
        log(
            f"export: an earlier export was interrupted as it wrote {t.patches_label}/; "
            "writing it again"
        )
    dirty = git.dirty_files(repo)
    if dirty:
        log(f"export: {len(dirty)} uncommitted file(s) in the work tree are not exported")
    pdir, label = t.patches, t.patches_label
    old = read_series(t) if (pdir / SERIES).exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, state.base, Path(tmp))
        new = {name: (Path(tmp) / name).read_bytes() for name in names}
    check_manifest(t, repo, state.base, names)
    changed = [n for n in names if not (pdir / n).exists() or (pdir / n).read_bytes() != new[n]]
    removed = [n for n in old if n not in names]
    series_text = "".join(n + "\n" for n in names)
    series_path = pdir / SERIES
    series_changed = not series_path.exists() or series_path.read_text() != series_text
    if check:
        drift = changed + removed + (["series"] if series_changed else [])
        log(
            "export --check: "
            + (
                f"{label}/ matches the work tree"
                if not drift
                else f"{label}/ differs: " + ", ".join(drift)
            )
        )
        return drift
    kept = safety.keep_files(
        t.root,
        [pdir / n for n in changed + removed] + ([series_path] if series_changed else []),
        "export",
    )
    # Noted first: a kill from here on leaves a record that the next session
    # finishes (every file written) or that makes export write them again.
    state.exporting = git.rev(repo, "HEAD")
    state.export_fingerprint = fingerprint_of(state.base, [(n, new[n]) for n in names])
    state.save(t)
    for name in changed:  # each file whole or not at all
        files.write(pdir / name, new[name])
    for name in removed:
        (pdir / name).unlink()
    if series_changed:
        files.write(series_path, series_text)
    killpoint.reach("export.written")
    record_export(t, state, state.exporting, state.export_fingerprint, len(names))
    log(f"export: {len(names)} patch(es); {len(changed)} written, {len(removed)} removed")
    for name in changed:
        log(f"  wrote {label}/{name}")
    for name in removed:
        log(f"  removed {label}/{name}")
    if kept:
        log(f"export: the previous versions are kept in {kept}")
    return changed
