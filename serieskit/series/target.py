"""What a session acts on: the pin's series, or a port of it to another release.

A :class:`Target` is resolved once (``cli.py``, from ``--port VERSION``) and
passed down, so the modules never branch on "pin or port": each reads its
base, patch folder, work tree, state file and output folders from it. A plain
root path still means the pin's target (:func:`of`).

| | the pin | a port to VERSION |
|---|---|---|
| base | pin.toml ``[base]`` | pin.toml ``[[port]]`` |
| patches | ``patches/`` | its ``patches`` folder (``ports/VERSION``) |
| work tree | ``.work/vllm`` | ``.work/vllm-VERSION`` |
| state | ``.work/state.json`` | ``.work/state-VERSION.json`` |
| outputs | ``.work/build``, ... | ``.work/build-VERSION``, ... |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from serieskit.errors import ToolkitError
from serieskit.series import base
from serieskit.state import WORK

PIN_TORCH = "2.14.1"  # what CPU tests install where pin.toml names no torch


@dataclass(frozen=True)
class Target:
    root: Path
    version: str
    sha256: str
    commit: str | None
    patches: Path
    port: bool = False
    torch: str = PIN_TORCH

    @property
    def work(self) -> Path:
        return self.out("vllm")

    @property
    def state_file(self) -> Path:
        return self.root / WORK / (f"state-{self.version}.json" if self.port else "state.json")

    @property
    def patches_label(self) -> str:
        """The patch folder as the user names it: ``patches`` or ``ports/0.33.0``."""
        return self.patches.relative_to(self.root).as_posix()

    @property
    def what(self) -> str:
        return f"the port to vLLM {self.version}" if self.port else "the series"

    def out(self, name: str) -> Path:
        """``.work/NAME`` for the pin, ``.work/NAME-VERSION`` for a port: two
        targets never share a work tree or an output folder."""
        return self.root / WORK / (f"{name}-{self.version}" if self.port else name)

    def cmd(self, session: str, *args: str) -> str:
        """The nox command that does ``session`` for this target (for messages)."""
        extra = [*args, *(["--port", self.version] if self.port else [])]
        return f"nox -s {session}" + (f" -- {' '.join(extra)}" if extra else "")


def pin(root: Path) -> Target:
    p = base.read_pin(root)
    return Target(root, p.version, p.sha256, p.commit, root / "patches", torch=p.torch or PIN_TORCH)


def port(root: Path, version: str) -> Target:
    ports = base.read_ports(root)
    found = next((p for p in ports if p.version == version), None)
    if found is None:
        listed = ", ".join(p.version for p in ports) or "none"
        raise ToolkitError(
            f"pin.toml lists no port to vLLM {version} (ports: {listed}): "
            'add a [[port]] table (README: "Ports: moving to the next release")'
        )
    folder = root / found.patches
    if not folder.is_dir():
        raise ToolkitError(
            f"the port to vLLM {version}: its patch folder {found.patches} "
            "(pin.toml) does not exist"
        )
    return Target(
        root,
        found.version,
        found.sha256,
        found.commit,
        folder,
        port=True,
        torch=found.torch or PIN_TORCH,
    )


def resolve(root: Path, version: str | None = None) -> Target:
    """The pin's target, or the port to ``version``."""
    return port(root, version) if version else pin(root)


def ports(root: Path) -> list[Target]:
    return [port(root, p.version) for p in base.read_ports(root)]


def of(where: Path | Target) -> Target:
    """A Target as given, or the pin's for a toolkit root."""
    return where if isinstance(where, Target) else pin(where)
