"""What the toolkit last did to the work tree, in ``.work/state.json``.

Anything in the work tree beyond what this records (uncommitted changes, new
commits) is the user's. Writes are atomic: a kill never leaves half a file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from serieskit import files
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
    kind: str = "rebase"  # or "carry": changes of the pin's series carried to a port
    # True while its git rebase runs (set before, cleared when it returns): a
    # rebase found stopped with this set was killed inside a step, not stopped
    # at a conflict.
    running: bool = False
    # For a carry: what to record in the port's carried.toml once it finishes.
    carried: dict[str, dict[str, str]] = field(default_factory=dict)

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
    # "apply" while an apply runs, "continue" while `apply --continue` runs.
    in_progress: str | None = None
    # While an apply runs: the commits HEAD and the series branch were at when
    # it passed its guard (so none of the user's unsaved work). A kill before
    # its checkout leaves them in place, and the rerun must not take them for
    # the user's; state.head then says only the base. None: HEAD was unborn
    # and the guard found the tree empty, so while HEAD stays unborn the tree
    # holds what the apply's first checkout wrote, and what the user put there.
    started_from: list[str] = field(default_factory=list)
    failed: str | None = None  # the patch a failed apply stopped at
    # Set by `apply --continue`: the last commit of the branch it took or made.
    # `head..continued_head` holds a patch finished by hand, which is in the
    # patch folder only once exported, so `head` (what the guard takes as the
    # toolkit's) stays below it until export.
    continued_head: str | None = None
    # The patches in the work tree, in order, each as [name, sha256 of the file
    # it was applied from], "" for one finished by hand: `apply --continue`
    # goes on only while those files are unchanged.
    sources: list[list[str]] = field(default_factory=list)
    rebase: RebaseState | None = None  # a rebase stopped, or finished off the pin
    # While export writes the patch folder: the commit it writes, and the
    # fingerprint the folder has once every file is written. Left set by a
    # killed export: the next session finishes its record, or export redoes it.
    exporting: str | None = None
    export_fingerprint: str | None = None
    # Set by a finished rebase, kept until the next apply starts afresh: where
    # the series moved from ("label", "base") and onto ("onto"), for the move's
    # chores (status lists them).
    moved: dict[str, str] | None = None
    # A whole passing `test` (every series test file) or `lint` run, by name:
    # the work tree's HEAD and base it ran on. The move's chores count it done
    # while HEAD is still that commit (status.chores).
    passed: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def path(cls, where: Any) -> Path:
        """The state file of a target (``where.state_file``: one per work
        tree), or the pin's for a toolkit root."""
        return getattr(where, "state_file", None) or Path(where) / WORK / "state.json"

    @classmethod
    def exists(cls, where: Any) -> bool:
        return cls.path(where).exists()

    @classmethod
    def load(cls, where: Any) -> State:
        path = cls.path(where)
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            rebase = data.pop("rebase", None)
            return cls(**data, rebase=RebaseState(**rebase) if rebase else None)
        except (ValueError, TypeError):
            raise ToolkitError(
                f"{path} is corrupt: move it aside and run "
                "`nox -s apply` (`-- --port VERSION` for a port's), which checks "
                "the work tree for your work"
            ) from None

    def save(self, where: Any) -> None:
        path = self.path(where)
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    def passed_at(self, what: str, head: str | None) -> bool:
        """``what`` ("test", "lint") passed whole on ``head`` over this base."""
        return bool(head) and self.passed.get(what) == {"head": head, "base": self.base}

    @property
    def complete(self) -> bool:
        """The last apply (or export) left the whole series, nothing half done."""
        return (
            self.base is not None
            and self.in_progress is None
            and self.failed is None
            and not self.rebase_stopped
        )

    @property
    def rebase_stopped(self) -> bool:
        return self.rebase is not None and not self.rebase.done

    @property
    def rebase_interrupted(self) -> bool:
        """A rebase or carry killed inside a step (or before git began it)."""
        return self.rebase is not None and not self.rebase.done and self.rebase.running
