"""``nox -s carry -- VERSION``: carry changes of the pin's series to a port.

A port (a ``[[port]]`` table of pin.toml, its patches in ``ports/VERSION``)
is the series on another release. When a patch of the pin changes, the
port's patch of the same ``Patch-Name`` has to change the same way; this
module does that and checks that it was done.

``ports/VERSION/carried.toml`` records, per patch name, the pin's patch as
the port last took it: its patch-id (``git patch-id --stable``: the diff's
content, whatever its line numbers, blob ids or message, so a re-export or
a moved context is no change) and the git blob id of the file, by which the
carry finds that text again in the toolkit's history.

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

import io
import json
import shlex
import shutil
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError, failed
from serieskit.series import apply, base, export, safety, series
from serieskit.series.target import Target
from serieskit.state import RebaseState, State
from serieskit.upstream import rebase

CARRIED = "carried.toml"
# The interdiff commits' author (a fixup keeps the port's own author and message).
_IDENT = {
    "GIT_AUTHOR_NAME": git.COMMITTER[0],
    "GIT_AUTHOR_EMAIL": git.COMMITTER[1],
    "GIT_AUTHOR_DATE": base.BASE_DATE,
}
KERNELS = "csrc/sm7x"  # must be byte-identical in the pin's series and every port


@dataclass(frozen=True)
class PinPatch:
    """One patch of the pin's series, as carry keys it."""

    name: str  # its Patch-Name trailer
    file: str
    patch_id: str
    blob: str

    def record(self) -> dict[str, str]:
        return {"patch_id": self.patch_id, "blob": self.blob}


# --- what the pin's series is, and what the port took of it -----------------


def patch_id(path: Path) -> str:
    """``git patch-id --stable`` of a patch file: its diff, not its message."""
    proc = git.run(None, "patch-id", "--stable", input=path.read_bytes())
    if proc.returncode != 0 or not proc.stdout.split():
        raise failed(f"git patch-id of {path.name}", proc)
    return proc.stdout.split()[0].decode()


def pin_patches(pin: Target) -> list[PinPatch]:
    """The pin's patches in order, each with its name, patch-id and blob id."""
    out = []
    for file in series.read_series(pin):
        path = pin.patches / file
        name = series.read_patch(path).name
        if name is None:
            raise ToolkitError(
                f"{pin.patches_label}/{file} has no {series.NAME_TRAILER}: "
                "trailer: carry matches the pin's patches to the port's by it"
            )
        blob = git.git(None, "hash-object", "--stdin", input=path.read_bytes()).strip()
        out.append(PinPatch(name, file, patch_id(path), blob))
    return out


def read_carried(port: Target) -> dict[str, dict[str, str]]:
    """carried.toml of the port: {patch name: {patch_id, blob}}."""
    path = port.patches / CARRIED
    if not path.exists():
        return {}
    try:
        table = tomllib.loads(path.read_text()).get("carried", {})
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{port.patches_label}/{CARRIED} is not valid TOML: {e}") from None
    bad = [
        n
        for n, v in table.items()
        if not (
            isinstance(v, dict)
            and isinstance(v.get("patch_id"), str)
            and isinstance(v.get("blob"), str)
        )
    ]
    if bad:
        raise ToolkitError(
            f"{port.patches_label}/{CARRIED}: entry {bad[0]} needs patch_id and blob strings"
        )
    return table


def read_pending(port: Target) -> dict[str, dict[str, str]]:
    """carried.toml's ``[pending]``: {patch name: {patch_id, why}}, changes of
    the pin's series that the port knowingly lacks. Each names the patch-id of
    the pin's patch it is about, so a later change to that patch fails again."""
    path = port.patches / CARRIED
    if not path.exists():
        return {}
    table = tomllib.loads(path.read_text()).get("pending", {})
    bad = [
        n
        for n, v in table.items()
        if not (
            isinstance(v, dict)
            and isinstance(v.get("patch_id"), str)
            and isinstance(v.get("why"), str)
            and v["why"].strip()
        )
    ]
    if bad:
        raise ToolkitError(
            f"{port.patches_label}/{CARRIED}: [pending] entry {bad[0]} needs "
            "patch_id and a non-empty why"
        )
    return table


_PENDING_HEADER = [
    "# Changes of the pin's series this port knowingly lacks (`carry --check`",
    "# reports them; each names the pin's patch as it is now, so a later change",
    "# of that patch fails CI again). A carry or --record that takes that",
    "# version of the patch drops its entry.",
    "[pending]",
]


def write_carried(
    port: Target, carried: dict[str, dict[str, str]], log=print, *, current: bool = True
) -> None:
    """Write [carried]; keep the [pending] entries that it does not settle.
    ``current``: ``carried`` holds the pin's patches as they are now, which
    settles every entry of a patch it records (one declared for an older
    version of it too); otherwise only entries of the version it records."""
    pending = read_pending(port)
    settled = [
        n
        for n, v in pending.items()
        if n in carried and (current or carried[n]["patch_id"] == v["patch_id"])
    ]
    for name in settled:
        log(f"carry: [pending] {name} is carried now; its entry is dropped")
    lines = [
        "# The pin's patches as this port last took them (written by `nox -s carry`):",
        "# per Patch-Name, the patch-id of the pin's patch (`git patch-id --stable`:",
        "# its diff, whatever its line numbers or message) and the git blob id of",
        "# the file, by which the next carry finds that text in the history.",
        "[carried]",
        *(
            f'{json.dumps(name)} = {{ patch_id = "{v["patch_id"]}", blob = "{v["blob"]}" }}'
            for name, v in carried.items()
        ),
    ]
    left = {n: v for n, v in pending.items() if n not in settled}
    if left:
        lines += [
            "",
            *_PENDING_HEADER,
            *(
                f'{json.dumps(name)} = {{ patch_id = "{v["patch_id"]}", why = '
                f"{json.dumps(v['why'])} }}"
                for name, v in left.items()
            ),
        ]
    (port.patches / CARRIED).write_text("\n".join(lines) + "\n")


@dataclass
class Plan:
    """How the port stands against the pin's series."""

    changed: list[PinPatch]  # carried before, changed since
    new: list[PinPatch]  # in the pin, never carried, not in the port
    dropped: list[str]  # carried before, gone from the pin
    unrecorded: list[str]  # in the port and the pin, but carried.toml has no record

    def __bool__(self) -> bool:
        return bool(self.changed or self.new or self.dropped)


def plan(pins: list[PinPatch], carried: dict[str, dict[str, str]], port_names: set[str]) -> Plan:
    names = {p.name for p in pins}
    return Plan(
        changed=[
            p for p in pins if p.name in carried and carried[p.name]["patch_id"] != p.patch_id
        ],
        new=[p for p in pins if p.name not in carried and p.name not in port_names],
        dropped=[n for n in carried if n not in names],
        unrecorded=[p.name for p in pins if p.name not in carried and p.name in port_names],
    )


def port_names(port: Target) -> set[str]:
    return {n for f in series.read_series(port) if (n := series.read_patch(port.patches / f).name)}


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


# --- --record ------------------------------------------------------------------


def record(
    pin: Target, port: Target, rev: str | None = None, log=print, *, current: bool = True
) -> None:
    """Take the pin's patches as they are now (or as they were at the toolkit's
    commit ``rev``, the series the port was made from) as carried, without
    touching the port: for a port just made by a rebase or by hand."""
    if rev:
        with tempfile.TemporaryDirectory() as tmp:
            record(
                _pin_at(pin, rev, Path(tmp)),
                port,
                log=lambda line: log(line.replace("as they are now", f"as they were at {rev}")),
                current=False,
            )
        return
    pins = pin_patches(pin)
    missing = [p.name for p in pins if p.name not in port_names(port)]
    if missing:
        raise ToolkitError(
            f"the port to vLLM {port.version} has no patch named "
            f"{', '.join(missing)}: --record takes only patches the port has "
            f"(`nox -s carry -- {port.version}` brings new ones)"
        )
    _keep_blobs(pin)
    write_carried(port, {p.name: p.record() for p in pins}, log, current=current)
    log(
        f"carry --record: {port.patches_label}/{CARRIED} now says the port has the pin's "
        f"{len(pins)} patch(es) as they are now"
    )


def _pin_at(pin: Target, rev: str, tmp: Path) -> Target:
    """The pin's patch folder as it was at ``rev`` of the toolkit's history."""
    label = pin.patches_label
    proc = git.run(pin.root, "archive", "--format=tar", rev, "--", label)
    if proc.returncode != 0:
        raise failed(f"reading {label}/ at {rev}", proc)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(tmp, filter="data")
    return replace(pin, root=tmp, patches=tmp / label)


def _keep_blobs(pin: Target) -> None:
    """Write the pin's patch files into the toolkit's own git objects, so a
    later carry finds them by blob id even before they are committed."""
    if git.run(pin.root, "rev-parse", "--git-dir").returncode != 0:
        return
    for file in series.read_series(pin):
        git.git(pin.root, "hash-object", "-w", "--", str(pin.patches / file))


def _old_text(pin: Target, name: str, blob: str) -> bytes:
    proc = git.run(pin.root, "cat-file", "blob", blob)
    if proc.returncode != 0:
        raise ToolkitError(
            f"the pin's patch {name} as last carried (blob {blob[:12]}) is not in this "
            "repository's history, so its change since then cannot be computed: fetch the "
            "history that has it, or carry that change by hand and `nox -s carry -- VERSION "
            "--record`"
        )
    return proc.stdout


# --- the carry itself ----------------------------------------------------------


def start(pin: Target, port: Target, force: bool = False, log=print) -> None:
    """Carry every change of the pin's patches since the last carry to the
    port (module docstring); nothing moves before every check has passed."""
    git.require_version()
    pins = pin_patches(pin)
    carried = read_carried(port)
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
    _keep_blobs(pin)
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
    rebase.load_resolutions(port, repo, log)
    todo_file = port.out("carry") / "todo"
    todo_file.write_text(todo)
    proc = git.run(
        repo,
        *rebase.RERERE,
        "rebase",
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
    rebase.run_to_stop(port, proc, lambda: finish(port, log), log)


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
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tree = work / "pin"
    git.git(port.work, "worktree", "add", "-q", "--detach", str(tree), pin_base)
    steps: dict[str, str] = {}
    try:
        old_chain: dict[str, str] = {}
        for x in pins[: last + 1]:
            if x.name in carried:
                path = work / f"{x.name}.old.patch"
                path.write_bytes(_old_text(pin, x.name, carried[x.name]["blob"]))
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
        git.run(port.work, "worktree", "remove", "--force", str(tree))
        git.run(port.work, "worktree", "prune")
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
    rebase.save_resolutions(port, repo, log)
    head = git.rev(repo, "HEAD")
    state.rebase, state.head = None, head
    state.applied = state.total = len(git.commits(repo, f"{state.base}..HEAD"))
    state.save(port)
    backup = safety.backup_ref(repo, rb.old_head, "carry")
    export.export(port, log=log)
    write_carried(port, rb.carried, log)
    shutil.rmtree(port.out("carry"), ignore_errors=True)
    log(
        f"carry: done; {port.patches_label}/ and {CARRIED} written (the port before the "
        f"carry is kept as {backup}); commit them with the pin's patches"
    )


def cont(port: Target, log=print) -> None:
    _require_carry(port)
    rebase.cont(port, log, finish=lambda: finish(port, log))


def abort(port: Target, log=print) -> None:
    _require_carry(port)
    rebase.abort(port, log)
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
