"""The one error type of the toolkit, and how a failed subprocess becomes one."""

from __future__ import annotations

import re
import subprocess


class ToolkitError(Exception):
    """A failure the user can act on: printed as ``error: <first line>``
    (further lines indented), exit status 1, never a traceback."""


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def last_line(text: str | bytes | None, default: str = "no output") -> str:
    """The last non-empty line of a tool's output: usually its reason."""
    lines = [line.strip() for line in _text(text).splitlines() if line.strip()]
    return lines[-1] if lines else default


# git's words when another git holds (or a killed one left) a lock file.
_LOCKED = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def stale_lock(path: str) -> str:
    """What to do about a git lock file that is in the way."""
    return (f"{path} exists: a git is running in that repository, or one was killed "
            "there; if none is running, remove that file and run this again")


def failed(what: str, proc: subprocess.CompletedProcess) -> ToolkitError:
    """``<what> failed: <the last line it printed on stderr, else stdout>``;
    a lock file in the way is named with what to do (git's last line is not)."""
    if m := _LOCKED.search(_text(proc.stderr)):
        return ToolkitError(f"{what} failed: {stale_lock(m.group(1))}")
    reason = last_line(proc.stderr) if proc.stderr and last_line(proc.stderr, "") else \
        last_line(proc.stdout, f"exit status {proc.returncode}")
    return ToolkitError(f"{what} failed: {reason}")
