"""The one error type of the toolkit, and how a failed subprocess becomes one."""

from __future__ import annotations

import subprocess


class ToolkitError(Exception):
    """A failure the user can act on: printed as ``error: <first line>``
    (further lines indented), exit status 1, never a traceback."""


def last_line(text: str | bytes | None, default: str = "no output") -> str:
    """The last non-empty line of a tool's output: usually its reason."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else default


def failed(what: str, proc: subprocess.CompletedProcess) -> ToolkitError:
    """``<what> failed: <the last line it printed on stderr, else stdout>``."""
    reason = last_line(proc.stderr) if proc.stderr and last_line(proc.stderr, "") else \
        last_line(proc.stdout, f"exit status {proc.returncode}")
    return ToolkitError(f"{what} failed: {reason}")
