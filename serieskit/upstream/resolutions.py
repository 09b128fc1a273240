"""Resolutions made once: recorded in the work tree, kept with the series, replayed.

Two kinds. git rerere records each text conflict's hunks (its ``rr-cache``).
And at ``--continue`` of a rebase or carry the whole stop is recorded
(:func:`record_stop`): the final content, or the deletion, of every file
that was unmerged at the stop or whose index entry changed during it (a file
deleted upstream, an edit to a file without a conflict), keyed by the trees
that make the stop, so that the same stop of the same move finds it again
and replays it (:func:`replay_stop`). Both are kept with the series in
``resolutions/`` of its patch folder, the whole stops under ``stops/KEY/``
(``stop.json`` and ``files/``): :func:`load_resolutions` before a rebase,
:func:`save_resolutions` after. A record is written whole or not at all,
and one that is not whole is never replayed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from serieskit import files, git, killpoint
from serieskit.series import target
from serieskit.series.target import Target
from serieskit.state import State
from serieskit.upstream import rebase_check

RESOLUTIONS = "resolutions"  # under patches/: git rerere's records of the series
STOPS = "stops"  # under resolutions/: whole stops resolved by hand, one folder each
# In the work tree's git folder, beside rerere's rr-cache: the stop records
# this work tree knows, and the index as the stop shown last found it.
STOP_CACHE = "serieskit-stops"
SNAPSHOT = "serieskit-stop.json"
STOP_META = "stop.json"  # in a stop's folder; the files it writes are under files/


def load_resolutions(where: Path | Target, repo: Path, log=print) -> None:
    """The target's resolutions/ into the work tree's git folder: rerere's
    records into its rr-cache, the whole stops (``stops/``) beside it."""
    t = target.of(where)
    src = t.patches / RESOLUTIONS
    if not src.is_dir():
        return
    n = _copy_records(_rerere_records(src), git.gitdir(repo) / "rr-cache")
    n += _copy_records(_stop_records(src / STOPS), git.gitdir(repo) / STOP_CACHE)
    if n:
        log(f"{n} recorded resolution(s) from {t.patches_label}/{RESOLUTIONS}/ loaded")


def save_resolutions(where: Path | Target, repo: Path, log=print) -> None:
    """Keep every resolution recorded in the work tree with the series:
    rerere's (preimage + postimage) and the whole stops."""
    t = target.of(where)
    dest = t.patches / RESOLUTIONS
    cache = git.gitdir(repo) / "rr-cache"
    done = [e for e in _rerere_records(cache) if (e / "postimage").exists()]
    n = _copy_records(done, dest, only=("preimage", "postimage"))
    n += _copy_records(_stop_records(git.gitdir(repo) / STOP_CACHE), dest / STOPS, replace=True)
    if n:
        log(
            f"{n} resolution(s) recorded in {t.patches_label}/{RESOLUTIONS}/ "
            "(commit them with the series: the next run reuses them)"
        )


def _rerere_records(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in (folder.iterdir() if folder.is_dir() else [])
        if p.is_dir() and p.name != STOPS and not p.name.startswith(".")
    )


def _stop_records(folder: Path) -> list[Path]:
    """The whole stop records in ``folder`` (a temporary folder of a killed
    write is no record: its name starts with a dot)."""
    return sorted(
        p
        for p in (folder.iterdir() if folder.is_dir() else [])
        if p.is_dir() and not p.name.startswith(".") and (p / STOP_META).is_file()
    )


def _copy_records(
    records: list[Path], dest: Path, only: tuple[str, ...] = (), replace: bool = False
) -> int:
    """Copy each record folder into ``dest``, whole or not at all (a kill
    never leaves a record without its files); one already there is kept,
    or with ``replace`` swapped where it differs. Returns how many it wrote."""
    n = 0
    for entry in records:
        data = {
            str(f.relative_to(entry)): f.read_bytes()
            for f in sorted(entry.rglob("*"))
            if f.is_file() and (not only or f.name in only)
        }
        there = _read_record(dest / entry.name)
        if there == data or (there is not None and not replace):
            continue
        _write_record(dest / entry.name, data)
        n += 1
    return n


def _read_record(folder: Path) -> dict[str, bytes] | None:
    if not folder.is_dir():
        return None
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def _write_record(path: Path, data: dict[str, bytes]) -> None:
    """``path`` holds ``data``, whole or not at all: an old record is renamed
    out of the way before it goes (a kill in between leaves none, never half
    of one), and the new one is renamed into place once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.clear_leftovers(path.parent)
    if path.exists():
        old = path.with_name(f".{path.name}.serieskit-{os.getpid()}.tmp")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        shutil.rmtree(old)
    files.write_dir(path, data)


# --- whole stops: recorded at --continue, replayed at the same stop -----------------


def stop_key(repo: Path) -> str | None:
    """The stop a rebase is at, the same for the same move of the same series:
    the tree it stands on (the new base and the steps before), and the
    stopped commit's tree and its parent's (the patch)."""
    sha = _stopped(repo)
    if sha is None:
        return None
    proc = git.run(repo, "rev-parse", *(f"{c}^{{tree}}" for c in ("HEAD", sha, f"{sha}^")))
    if proc.returncode != 0:
        return None
    return hashlib.sha256(proc.stdout).hexdigest()[:40]


def _stopped(repo: Path) -> str | None:
    stopped = git.gitdir(repo) / "rebase-merge" / "stopped-sha"
    return stopped.read_text().strip() if stopped.is_file() else None


def _index(repo: Path) -> dict[str, list[str]]:
    """Every index entry (mode, blob, stage), by path."""
    entries: dict[str, list[str]] = {}
    for entry in filter(None, git.git(repo, "ls-files", "-s", "-z").split("\0")):
        info, path = entry.split("\t", 1)
        entries.setdefault(path, []).append(info)
    return entries


def snapshot(repo: Path, output: bytes) -> None:
    """The index as the stop shown finds it, and the files rerere resolved
    there: --continue records what changed from it."""
    key = stop_key(repo)
    if key is None:
        return
    rerere = re.findall(r"(?:Resolved|Staged) '(.+?)' using previous resolution", output.decode())
    files.write(
        git.gitdir(repo) / SNAPSHOT,
        json.dumps({"key": key, "rerere": rerere, "index": _index(repo)}),
    )


def record_stop(t: Target, repo: Path) -> Path | None:
    """At ``--continue``: record the resolution of the stop the snapshot was
    taken at, in the work tree's git folder (:func:`save_resolutions` keeps
    it with the series when the rebase finishes)."""
    snap_file = git.gitdir(repo) / SNAPSHOT
    key = stop_key(repo)
    try:
        snap = json.loads(snap_file.read_text())
    except (OSError, ValueError):
        return None
    state = State.load(t)
    if key is None or snap.get("key") != key or state.rebase is None:
        return None
    before, now = snap["index"], _index(repo)
    paths = sorted(
        {p for p in {*before, *now} if before.get(p) != now.get(p)} | set(snap["rerere"])
    )
    if not paths:
        return None
    subject = git.commit_subject(repo, _stopped(repo) or "HEAD")
    rb = state.rebase
    meta: dict = {"patch": subject, "from": rb.old_label, "onto": rb.target, "files": {}}
    data: dict[str, bytes] = {}
    for path in paths:
        entry = [e.split() for e in now.get(path, []) if e.split()[2] == "0"]
        if not entry:
            meta["files"][path] = "deleted"
            continue
        mode, blob, _ = entry[0]
        meta["files"][path] = mode
        if mode == "160000":  # a submodule: its commit, no content
            meta["files"][path] = f"{mode} {blob}"
        else:
            data[f"files/{path}"] = git.run(repo, "cat-file", "blob", blob).stdout
    data[STOP_META] = (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode()
    killpoint.reach("stops.recording")
    _write_record(git.gitdir(repo) / STOP_CACHE / key, data)
    return git.gitdir(repo) / STOP_CACHE / key


def replay_stop(t: Target, repo: Path) -> str | None:
    """At a stop with a record (same key): write or remove each file as
    recorded and stage it. Returns the record's place under resolutions/,
    or None where there is none (or it left a file unmerged)."""
    key = stop_key(repo)
    record = git.gitdir(repo) / STOP_CACHE / str(key)
    if key is None or not (record / STOP_META).is_file():
        return None
    meta = json.loads((record / STOP_META).read_text())
    wanted = meta["files"]
    if any(
        how != "deleted" and not how.startswith("160000") and not (record / "files" / p).is_file()
        for p, how in wanted.items()
    ):
        return None  # not whole (never written so by the toolkit): not replayed
    for path, how in wanted.items():
        if how == "deleted":
            git.git(repo, "rm", "-q", "-f", "--ignore-unmatch", "--", path)
            continue
        mode, _, blob = how.partition(" ")
        if not blob:
            content = (record / "files" / path).read_bytes()
            blob = git.git(repo, "hash-object", "-w", "--stdin", input=content).strip()
        git.git(repo, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}")
        if mode != "160000":
            git.git(repo, "checkout-index", "-f", "--", path)
    if rebase_check.unmerged(repo):
        return None
    return f"{STOPS}/{key}/"
