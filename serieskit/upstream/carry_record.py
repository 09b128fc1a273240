"""What a port took of the pin's series: ``carried.toml``, read, planned, recorded.

``ports/VERSION/carried.toml`` records, per patch name, the pin's patch as
the port last took it: its patch-id (``git patch-id --stable``: the diff's
content, whatever its line numbers, blob ids or message, so a re-export or
a moved context is no change) and the git blob id of the file, by which the
carry (:mod:`.carry`) finds that text again in the toolkit's history.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from serieskit import files, git
from serieskit.errors import ToolkitError, failed
from serieskit.series import series
from serieskit.series.target import Target

CARRIED = "carried.toml"


@dataclass(frozen=True)
class PinPatch:
    """One patch of the pin's series, as carry keys it."""

    name: str  # its Patch-Name trailer
    file: str
    patch_id: str
    blob: str

    def record(self) -> dict[str, str]:
        return {"patch_id": self.patch_id, "blob": self.blob}


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
    files.write(port.patches / CARRIED, "\n".join(lines) + "\n")


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
    keep_blobs(pin)
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


def keep_blobs(pin: Target) -> None:
    """Write the pin's patch files into the toolkit's own git objects, so a
    later carry finds them by blob id even before they are committed."""
    if git.run(pin.root, "rev-parse", "--git-dir").returncode != 0:
        return
    for file in series.read_series(pin):
        git.git(pin.root, "hash-object", "-w", "--", str(pin.patches / file))


def old_text(pin: Target, name: str, blob: str) -> bytes:
    proc = git.run(pin.root, "cat-file", "blob", blob)
    if proc.returncode != 0:
        raise ToolkitError(
            f"the pin's patch {name} as last carried (blob {blob[:12]}) is not in this "
            "repository's history, so its change since then cannot be computed: fetch the "
            "history that has it, or carry that change by hand and `nox -s carry -- VERSION "
            "--record`"
        )
    return proc.stdout
