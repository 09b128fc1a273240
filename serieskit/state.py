"""What the toolkit last did to the work tree, in ``.work/state.json``.

Anything in the work tree beyond what this records (uncommitted changes, new
commits) is the user's. Writes are atomic: a kill never leaves half a file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serieskit.errors import ToolkitError

WORK = ".work"


@dataclass
class RebaseState:
    """A rebase in progress, or finished and not yet taken into the pin."""

    target: str  # what the user asked for: "0.33.0" or "REPO@REF"
    onto: str  # the commit the series moves onto
    old_base: str
    old_label: str
    old_head: str
    version: str | None = None  # set for a PyPI release target
    sha256: str = ""  # of that release's sdist
    update_pin: bool = False  # move the pin when the rebase finishes
    resolved: list[str] = field(default_factory=list)  # subjects resolved by hand
    done: bool = False  # finished; kept until the pin moves or apply goes back

    @property
    def is_release(self) -> bool:
        return self.version is not None


@dataclass
class State:
    base: str | None = None  # the commit the series is applied on
    base_label: str | None = None  # its version, or REPO@REF after a fork rebase
    head: str | None = None  # the last commit the toolkit made or exported
    fingerprint: str | None = None  # of base + patches/ when they matched the tree
    total: int = 0
    applied: int = 0
    in_progress: str | None = None  # "apply" while an apply runs
    # While an apply runs: the commits HEAD and the series branch were at when
    # it passed its guard (so none of the user's unsaved work). A kill before
    # its checkout leaves them in place, and the rerun must not take them for
    # the user's; state.head then says only the base.
    started_from: list[str] = field(default_factory=list)
    failed: str | None = None  # the patch a failed apply stopped at
    rebase: RebaseState | None = None  # a rebase stopped, or finished off the pin

    @classmethod
    def path(cls, root: Path) -> Path:
        return root / WORK / "state.json"

    @classmethod
    def exists(cls, root: Path) -> bool:
        return cls.path(root).exists()

    @classmethod
    def load(cls, root: Path) -> State:
        path = cls.path(root)
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            rebase = data.pop("rebase", None)
            return cls(**data, rebase=RebaseState(**rebase) if rebase else None)
        except (ValueError, TypeError):
            raise ToolkitError(f"{path} is corrupt: move it aside and run "
                               "`nox -s apply`, which checks the work tree for your work") from None

    def save(self, root: Path) -> None:
        path = self.path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)

    @property
    def complete(self) -> bool:
        """The last apply (or export) left the whole series, nothing half done."""
        return (self.base is not None and self.in_progress is None and self.failed is None
                and not self.rebase_stopped)

    @property
    def rebase_stopped(self) -> bool:
        return self.rebase is not None and not self.rebase.done
