"""Named steps at which the fault-injection tests stop the toolkit as a kill would.

``VLLM_SERIES_KILL_AT=STEP[#N]`` makes the toolkit send itself a signal the
N-th time (default: the first) it reaches ``STEP`` (:func:`reach`).
``VLLM_SERIES_KILL_SIGNAL`` names the signal: ``KILL`` (the default), ``TERM``
or ``INT`` (Ctrl-C); ``VLLM_SERIES_KILL_GROUP=1`` sends it to the whole
process group, the git running at that moment included, as a terminal's
Ctrl-C or ``kill -- -PGID`` does.

Steps: each module names its own (``apply.started``, ``export.written``,
...); ``git-CMD`` is reached just before every ``git CMD``; at
``in-git-CMD`` that git runs under a file-size limit of
``VLLM_SERIES_KILL_FSIZE`` bytes (default 0), so that git itself dies
(SIGXFSZ, which it does not catch) at its first write past the limit, as a
kill leaves it: a lock file held, a tree half checked out. The toolkit gets
its signal as soon as that git has ended.

With the variables unset (always, outside the tests) every call is a no-op.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable

AT = "VLLM_SERIES_KILL_AT"
SIGNAL = "VLLM_SERIES_KILL_SIGNAL"
GROUP = "VLLM_SERIES_KILL_GROUP"
FSIZE = "VLLM_SERIES_KILL_FSIZE"

_reached: dict[str, int] = {}


def _due(step: str) -> bool:
    spec = os.environ.get(AT)
    if not spec:
        return False
    name, _, nth = spec.partition("#")
    if name != step:
        return False
    _reached[step] = _reached.get(step, 0) + 1
    return _reached[step] == int(nth or 1)


def fire() -> None:
    """Send the configured signal now (to this process, or its whole group)."""
    sig = signal.Signals[f"SIG{os.environ.get(SIGNAL, 'KILL').upper()}"]
    if os.environ.get(GROUP) == "1":
        os.killpg(os.getpgid(0), sig)
    else:
        os.kill(os.getpid(), sig)


def reach(step: str) -> None:
    """The toolkit is at ``step``: stop here if a test asked for it."""
    if _due(step):
        fire()


def in_git(command: str) -> Callable[[], None] | None:
    """For the git about to run ``command``: a ``preexec_fn`` that makes it die
    at its first write past the limit, when a test asked for it (then call
    :func:`fire` once it has ended); None otherwise."""
    if not _due(f"in-git-{command}"):
        return None
    limit = int(os.environ.get(FSIZE, "0"))

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_file_size
