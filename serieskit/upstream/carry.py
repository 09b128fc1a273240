"""``nox -s carry -- VERSION``: carry changes of the pin's series to a port.

A port (a ``[[port]]`` table of pin.toml, its patches in ``ports/VERSION``)
is the series on another release. When a patch of the pin changes, the
port's patch of the same ``Patch-Name`` has to change the same way; this
module does that and checks that it was done.

``ports/VERSION/carried.toml`` (:mod:`.carry_record`) records, per patch
name, the pin's patch as the port last took it.

A carry, in the port's work tree:

1. the pin's side, in a throwaway worktree: the pin's base with its patches
   as last carried (the old chain) and as they are now (the new chain); for a
   changed patch, a commit from the old chain at that patch (A) to the new
   chain there (B);
2. the port's commits replayed with ``git rebase -i``: after the port's
   commit of each changed patch a ``fixup`` of that commit (a three-way merge:
   base A, ours the port's series so far, theirs B: the patch's change, and
   the earlier patches' changes, already in the port, on both sides), with
   git rerere and the port's
   recorded resolutions (``ports/VERSION/resolutions/``). A patch new in the
   pin is picked after the port's commit of the patch before it; one the pin
   dropped is dropped;
3. a conflict stops it with the rebase's help (the files, upstream's change
   to them between the two releases, the commands); ``--continue`` and
   ``--abort`` as for a rebase;
4. at the end the port's folder is exported and carried.toml written.

``--check`` (CI) fails when carried.toml lags the pin's patches, and when
``csrc/sm7x/`` differs between the pin's series head and the port's (the
kernels' GPU evidence, measured on the pin, holds for the port only so).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from serieskit import files, git, killpoint
from serieskit.errors import ToolkitError
from serieskit.series import apply, base, export, safety, series
from serieskit.series.target import Target
from serieskit.state import RebaseState, State
from serieskit.upstream import stops
from serieskit.upstream.carry_record import (
    CARRIED,
    PinPatch,
    Plan,
    keep_blobs,
    old_text,
    pin_patches,
    plan,
    port_names,
    read_carried,
    read_pending,
    record,
    write_carried,
)

# The interdiff commits' author (a fixup keeps the port's own author and message).
_IDENT = {
    "GIT_AUTHOR_NAME": git.COMMITTER[0],
    "GIT_AUTHOR_EMAIL": git.COMMITTER[1],
    "GIT_AUTHOR_DATE": base.BASE_DATE,
}
KERNELS = "csrc/sm7x"  # must be byte-identical in the pin's series and every port


# --- --check -----------------------------------------------------------------


def check(pin: Target, port: Target, log=print) -> None:
    """CI's check of a port: it has every change of the pin's series, and the
    kernels are the pin's, byte for byte."""
    pins = pin_patches(pin)
    p = plan(pins, read_carried(port), port_names(port))
    pending = read_pending(port)
    # Declared in [pending] for the pin's patch as it is now: reported, not failed.
    declared = {
        x.name for x in p.changed + p.new if pending.get(x.name, {}).get("patch_id") == x.patch_id
    }
    for name in sorted(declared):
        log(f"carry --check: PENDING {name}: {pending[name]['why']}")
    problems = [
        f"{x.name} ({pin.patches_label}/{x.file}) changed since it was last carried"
        for x in p.changed
        if x.name not in declared
    ]
    problems += [
        f"{x.name} ({pin.patches_label}/{x.file}) is new in the pin's series"
        for x in p.new
        if x.name not in declared
    ]
    problems += [f"{n} left the pin's series and is still carried" for n in p.dropped]
    problems += [
        f"{n} is in the port, but {port.patches_label}/{CARRIED} does not say which "
        "version of the pin's patch it took"
        for n in p.unrecorded
    ]
    if problems:
        raise ToolkitError(
            "\n".join(
                [
                    f"the port to vLLM {port.version} lacks changes of the pin's series:",
                    *(f"  {line}" for line in problems),
                    f"  carry them: `nox -s carry -- {port.version}`"
                    + (
                        f"; or, where the port already has the pin's current patches, "
                        f"`nox -s carry -- {port.version} --record`"
                        if p.unrecorded
                        else ""
                    ),
                ]
            )
        )
    if declared:
        log(
            f"carry --check: the port to vLLM {port.version} lacks {len(declared)} declared "
            f"change(s) of the pin's series ({port.patches_label}/{CARRIED} [pending]); the "
            f"kernels are compared once they are carried"
        )
        return
    log(
        f"carry --check: the port to vLLM {port.version} has all {len(pins)} patch(es) of "
        "the pin's series as they are now"
    )
    check_kernels(pin, port, log)


def check_kernels(pin: Target, port: Target, log=print) -> None:
    """csrc/sm7x/ of the port's series head is the pin's, byte for byte."""
    trees = {t.version: _kernel_files(t) for t in (pin, port)}
    mine, theirs = trees[pin.version], trees[port.version]
    differ = sorted(f for f in set(mine) | set(theirs) if mine.get(f) != theirs.get(f))
    if differ:
        raise ToolkitError(
            "\n".join(
                [
                    f"{KERNELS}/ of the port to vLLM {port.version} is not the pin's: the kernels' "
                    "GPU evidence (measured on the pin's series) would not hold for it:",
                    *(
                        f"  {f}: "
                        + (
                            "only in the pin's"
                            if f not in theirs
                            else "only in the port's"
                            if f not in mine
                            else "differs"
                        )
                        for f in differ
                    ),
                    f"  carry the pin's change (`nox -s carry -- {port.version}`) or make it "
                    "in the pin's series first",
                ]
            )
        )
    log(
        f"carry --check: {KERNELS}/ is the same in the pin's series and the port to "
        f"vLLM {port.version} ({len(mine)} file(s))"
    )


def _kernel_files(t: Target) -> dict[str, str]:
    """{path: mode and blob id} under csrc/sm7x/ at the series head of ``t``'s
    work tree, which must be the whole series made from the current patches."""
    tree = series.applied_tree(t)
    state = State.load(t)
    if (
        not state.complete
        or state.head != git.rev(tree, "HEAD")
        or state.fingerprint != series.fingerprint(t, state.base or "")
    ):
        raise ToolkitError(
            f"{t.what}: the work tree is not the series as {t.patches_label}/ "
            f"holds it now: run `{t.cmd('apply')}` first"
        )
    out = git.git(tree, "ls-tree", "-r", "HEAD", "--", f"{KERNELS}/")
    return {
        line.split("\t", 1)[1]: line.split()[0] + " " + line.split()[2]
        for line in out.splitlines()
        if "\t" in line
    }


# --- the carry itself ----------------------------------------------------------


def start(pin: Target, port: Target, force: bool = False, log=print) -> None:
    """Carry every change of the pin's patches since the last carry to the
    port (module docstring); nothing moves before every check has passed."""
    git.require_version()
    before = State.load(port)
    if before.rebase and before.rebase.kind == "carry" and before.rebase.done:
        log(f"carry: an earlier carry to {port.version} was interrupted as it finished; finishing")
        finish(port, log)
        return
    pins = pin_patches(pin)
    carried = read_carried(port)
    if git.is_repo(port.work):  # the pin checked before anything is moved aside
        base.ensure_base(port.work, pin.version, pin.sha256, pin.commit, log=log)
    apply.apply(port, force=force, log=log)  # a no-op when current; refuses over your work
    repo = port.work
    state = State.load(port)
    export.require_exportable(port, state)
    assert state.base and state.head
    in_port = series.commit_names(repo, state.base)
    p = plan(pins, carried, {n for _, _, n in in_port if n})
    if p.unrecorded:
        raise ToolkitError(
            f"{port.patches_label}/{CARRIED} does not say which version of the pin's "
            f"{', '.join(p.unrecorded)} the port took: where the port has the pin's current "
            f"patches, `nox -s carry -- {port.version} --record` says so"
        )
    if not p:
        log(f"carry: the port to vLLM {port.version} has every change of the pin's series")
        return
    _require_manifest_entries(port, p)
    keep_blobs(pin)
    pin_base, _ = base.ensure_base(repo, pin.version, pin.sha256, pin.commit, log=log)
    subjects = {n: s for _, s, n in in_port if n}
    steps = _pin_side(pin, port, pins, p, carried, pin_base, subjects, log)
    todo = _todo(in_port, pins, p, steps)
    state.rebase = RebaseState(
        target=port.version,
        onto=state.base,
        old_base=pin_base,
        old_label=pin.version,
        old_head=state.head,
        kind="carry",
        carried={x.name: x.record() for x in pins},
    )
    state.save(port)
    for x in p.changed:
        log(f"carry: {x.name}: the pin's change since it was last carried")
    for x in p.new:
        log(f"carry: {x.name}: new in the pin's series, picked into the port")
    for n in p.dropped:
        log(f"carry: {n}: gone from the pin's series, dropped from the port")
    stops.load_resolutions(port, repo, log)
    todo_file = port.out("carry") / "todo"
    files.write(todo_file, todo)
    killpoint.reach("carry.started")
    proc = stops.run_git(
        port,
        "-i",
        "--committer-date-is-author-date",
        "--no-autosquash",
        "--empty=drop",
        "--onto",
        state.base,
        state.base,
        series.BRANCH,
        env={"GIT_SEQUENCE_EDITOR": f"cp {shlex.quote(str(todo_file))}"},
    )
    stops.run_to_stop(port, proc, lambda: finish(port, log), log)


def _require_manifest_entries(port: Target, p: Plan) -> None:
    """The export at the end checks the port's manifest against its commits:
    refuse before anything moves where it would fail."""
    if not (port.patches / series.MANIFEST).exists():
        return
    listed = {e.get("name") for e in series.read_manifest(port)}
    problems = [
        f"  add a [[patch]] entry named {x.name} (the pin's is in patches/{series.MANIFEST})"
        for x in p.new
        if x.name not in listed
    ]
    problems += [
        f"  remove the entry {n}, which the pin's series dropped" for n in p.dropped if n in listed
    ]
    if problems:
        raise ToolkitError(
            "\n".join(
                [
                    f"{port.patches_label}/{series.MANIFEST} does not "
                    "match the series the carry will make:",
                    *problems,
                ]
            )
        )


def _pin_side(
    pin: Target,
    port: Target,
    pins: list[PinPatch],
    p: Plan,
    carried: dict[str, dict[str, str]],
    pin_base: str,
    subjects: dict[str, str],
    log,
) -> dict[str, str]:
    """The commits to carry, made in a throwaway worktree of the port's
    repository from two chains on the pin's base: the patches as last carried
    (old) and as they are now (new). For a changed patch, a commit whose
    parent is the old chain at that patch and whose tree is the new chain's
    there: replayed onto the port after that patch, its three-way merge brings
    this patch's change (the earlier patches' changes, carried already, are on
    both sides). For a new patch, its commit in the new chain."""
    wanted = {x.name for x in p.changed} | {x.name for x in p.new}
    last = max(i for i, x in enumerate(pins) if x.name in wanted)
    work = port.out("carry")
    tree = work / "pin"
    if git.drop_worktree(port.work, tree):
        log(f"carry: removed the worktree {tree} that an interrupted carry left")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    git.git(port.work, "worktree", "add", "-q", "--detach", str(tree), pin_base)
    killpoint.reach("carry.pin-side")
    steps: dict[str, str] = {}
    try:
        old_chain: dict[str, str] = {}
        for x in pins[: last + 1]:
            if x.name in carried:
                path = work / f"{x.name}.old.patch"
                path.write_bytes(old_text(pin, x.name, carried[x.name]["blob"]))
                old_chain[x.name] = _am(tree, path, f"the pin's {x.name} as last carried")
        git.git(tree, "checkout", "-q", "--detach", pin_base)
        old = pin_base
        for x in pins[: last + 1]:
            new = _am(tree, pin.patches / x.file, f"the pin's {x.file}")
            old = old_chain.get(x.name, old)
            if x.name in carried and x.name in wanted:
                # Under the port's own subject, so that a stop names the port's patch.
                message = f"{subjects.get(x.name, x.name)}\n\ncarry: the pin's {x.name}\n"
                steps[x.name] = git.git(
                    tree, "commit-tree", f"{new}^{{tree}}", "-p", old, "-m", message, env=_IDENT
                ).strip()
            elif x.name in wanted:
                steps[x.name] = new
    finally:
        git.drop_worktree(port.work, tree)
    log(f"carry: {len(steps)} change(s) of the pin's series made on vLLM {pin.version}")
    return steps


def _am(tree: Path, patch: Path, what: str) -> str:
    proc = git.run(
        tree,
        "am",
        "--3way",
        "--keep-non-patch",
        "--committer-date-is-author-date",
        "--no-gpg-sign",
        str(patch),
    )
    if proc.returncode != 0:
        git.run(tree, "am", "--abort")
        raise ToolkitError(
            f"{what} does not apply on the pin's base and the patches before "
            "it: carry the change by hand (then `nox -s carry -- VERSION "
            "--record`)"
        )
    head = git.rev(tree, "HEAD")
    assert head
    return head


def _todo(
    in_port: list[tuple[str, str, str | None]], pins: list[PinPatch], p: Plan, steps: dict[str, str]
) -> str:
    """The rebase's todo: the port's commits in order, each changed one
    followed by the fixup of its change, new patches after the port's
    commit of the pin's patch before them, dropped ones left out."""
    have = {n for _, _, n in in_port if n}
    order = [x.name for x in pins]
    after: dict[str | None, list[str]] = {}  # anchor (port patch name) -> new names
    for x in p.new:
        before = [n for n in order[: order.index(x.name)] if n in have]
        after.setdefault(before[-1] if before else None, []).append(x.name)
    changed = {x.name for x in p.changed}
    lines = [f"pick {steps[n]} {n}" for n in after.get(None, [])]
    for cid, subject, name in in_port:
        if name in p.dropped:
            lines.append(f"# dropped: {cid} {subject}")
            continue
        lines.append(f"pick {cid} {subject}")
        if name in changed:
            lines.append(f"fixup {steps[name]} the pin's change to {name}")
        lines += [f"pick {steps[n]} {n}" for n in after.get(name, [])]
    return "\n".join(lines) + "\n"


def finish(port: Target, log=print) -> None:
    """After the replay: keep the resolutions, export the port, write carried.toml."""
    repo = port.work
    state = State.load(port)
    rb = state.rebase
    assert rb and rb.kind == "carry"
    stops.save_resolutions(port, repo, log)
    if not rb.done:
        # Done, but kept until carried.toml is written: a kill before that
        # leaves a carry that `carry` (or --continue) finishes.
        rb.done = True
        state.head = git.rev(repo, "HEAD")
        state.applied = state.total = len(git.commits(repo, f"{state.base}..HEAD"))
        state.save(port)
    killpoint.reach("carry.finishing")
    backup = safety.backup_ref(repo, rb.old_head, "carry")
    export.export(port, log=log)
    write_carried(port, rb.carried, log)
    state = State.load(port)
    state.rebase = None
    state.save(port)
    shutil.rmtree(port.out("carry"), ignore_errors=True)
    log(
        f"carry: done; {port.patches_label}/ and {CARRIED} written (the port before the "
        f"carry is kept as {backup}); commit them with the pin's patches"
    )


def cont(port: Target, log=print) -> None:
    rb = State.load(port).rebase
    if rb is not None and rb.kind == "carry" and rb.done:
        log("carry: the carry was interrupted as it finished; finishing it")
        finish(port, log)
        return
    _require_carry(port)
    stops.cont(port, lambda: finish(port, log), log)


def abort(port: Target, log=print) -> None:
    _require_carry(port)
    stops.abort(port, log)
    shutil.rmtree(port.out("carry"), ignore_errors=True)


def _require_carry(port: Target) -> None:
    rb = State.load(port).rebase
    if rb is None or rb.done or rb.kind != "carry":
        raise ToolkitError(f"no carry to the port to vLLM {port.version} is stopped")


def session(
    pin: Target,
    port: Target,
    *,
    check_only: bool = False,
    record_only: bool = False,
    cont_: bool = False,
    abort_: bool = False,
    force: bool = False,
    record_rev: str | None = None,
    log=print,
) -> None:
    """``nox -s carry -- VERSION [--check | --record [REV] | --continue | --abort]``."""
    if sum((check_only, record_only, cont_, abort_)) > 1:
        raise ToolkitError("carry takes at most one of --check, --record, --continue, --abort")
    if check_only:
        check(pin, port, log)
    elif record_only:
        record(pin, port, rev=record_rev or None, log=log)
    elif cont_:
        cont(port, log)
    elif abort_:
        abort(port, log)
    else:
        start(pin, port, force=force, log=log)
