"""The series' side of the wheel: the patched tree its files come from.

That is the work tree at its head, or a tree assembled on the GPU machine;
either way every file comes with the blob id that says it is the series'
(the work tree's commit, or the overlay packer's stamps).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import git, results
from serieskit.build import recipe
from serieskit.errors import ToolkitError, failed
from serieskit.series import series
from serieskit.series.target import Target
from serieskit.state import State

SERIES_INFO = "vllm/_series.json"


def module_file() -> str:
    """Where the series' native module goes in the wheel (build/recipe.toml)."""
    return f"vllm/{recipe.native().module}.abi3.so"


@dataclass
class SeriesTree:
    """The patched tree the wheel is made of: its ``vllm/`` files, which of
    them the series changes, and the results' ``series`` block."""

    root: Path  # where csrc/sm7x lies, for the module
    label: str
    version: str  # the release it sits on
    series: dict
    files: dict[str, tuple[int, Callable[[], bytes]]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)


def work_tree(t: Target) -> SeriesTree:
    """The series' commit in the work tree, refused unless it holds the whole
    series on the release, committed."""
    tree = t.work
    state = State.load(t)
    if not git.is_repo(tree) or not state.base:
        raise ToolkitError(f"wheel: no work tree: run `{t.cmd('apply')}` first")
    if reason := series.unfinished(t, state):
        raise ToolkitError(f"wheel: {tree} holds a half-applied series ({reason})")
    if op := git.operation_in_progress(tree):
        raise ToolkitError(
            f"wheel: a git {op} is stopped in {tree}: finish it (git {op} --continue) or "
            f"abort it (git {op} --abort) first"
        )
    if state.base_label != t.version or (t.commit and state.base != t.commit):
        raise ToolkitError(
            f"wheel: {tree} is on {state.base_label}, not on vLLM {t.version}: the wheel "
            f"reuses the released {t.version} wheel; run `{t.cmd('apply')}` first"
        )
    dirty = [
        line
        for line in git.dirty_files(tree)
        if line[3:].startswith(("vllm/", recipe.native().sources + "/"))
    ]
    if dirty:
        raise ToolkitError(
            f"wheel: {tree} has uncommitted changes ({', '.join(d[3:] for d in dirty[:3])}"
            f"{', ...' if len(dirty) > 3 else ''}): the wheel is made of a commit; commit "
            "them (and `nox -s export`) or stash them"
        )
    head = git.rev(tree, "HEAD") or ""
    if git.run(tree, "merge-base", "--is-ancestor", state.base, head).returncode != 0:
        raise ToolkitError(f"wheel: HEAD of {tree} is not on the base {state.base[:12]}")
    out = SeriesTree(
        tree,
        f"{tree} at {head[:12]}",
        t.version,
        results.series_block(tree, state.base, head, t.version),
    )
    diff = git.git(
        tree, "diff", "--no-renames", "--name-status", "-z", state.base, head, "--", "vllm"
    )
    fields = diff.split("\0")
    for status, path in zip(fields[0:-1:2], fields[1::2], strict=False):
        (out.deleted if status == "D" else out.changed).add(path)
    for path, (mode, data) in _read_blobs(tree, head, out).items():
        out.files[path] = (mode, _constant(data))
    return out


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _read_blobs(tree: Path, head: str, out: SeriesTree) -> dict[str, tuple[int, bytes]]:
    """Every file under vllm/ at ``head``: (mode, content), read in one git call."""
    listing = git.git(tree, "ls-tree", "-r", "-z", head, "--", "vllm").split("\0")
    entries: list[tuple[str, int, str]] = []
    links: list[tuple[str, int, str]] = []
    for item in filter(None, listing):
        meta, path = item.split("\t", 1)
        git_mode, kind, blob = meta.split()
        if kind != "blob":
            raise ToolkitError(f"wheel: {path} in {out.label} is a {kind}, not a file")
        into = links if git_mode == "120000" else entries
        into.append((path, int(git_mode, 8) & 0o777, blob))
    proc = git.run(
        tree, "cat-file", "--batch", input="".join(f"{b}\n" for _, _, b in entries).encode()
    )
    if proc.returncode != 0:
        raise failed(f"wheel: reading {out.label}", proc)
    stream, pos = proc.stdout, 0
    blobs: dict[str, tuple[int, bytes]] = {}
    for path, mode, _ in entries:
        nl = stream.index(b"\n", pos)
        size = int(stream[pos:nl].split()[2])
        blobs[path] = (mode, stream[nl + 1 : nl + 1 + size])
        pos = nl + 2 + size
    # A symbolic link is packaged as the file it names (as setuptools does).
    for path, _, blob in links:
        text = git.git(tree, "cat-file", "blob", blob).strip()
        target_path = os.path.normpath(os.path.join(os.path.dirname(path), text))
        if target_path not in blobs:
            raise ToolkitError(f"wheel: {path} in {out.label} links to {text}, not a file of vllm/")
        blobs[path] = (0o644, blobs[target_path][1])
        if target_path in out.changed:  # the series changes what it packages
            out.changed.add(path)
    return blobs


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def assembled_tree(folder: Path) -> SeriesTree:
    """A tree assembled from the GPU machine's load (gpu/stage2.sh): its
    stamps name the series, and every file they list is checked by its git
    blob id."""
    if not (folder / results.STAMPS["commit"]).is_file():
        raise ToolkitError(
            f"wheel: {folder} has no {results.STAMPS['commit']} stamp: --tree takes a "
            "tree assembled from `nox -s overlay -- --gpu` (gpu/stage2.sh: /tmp/vllm-run/src)"
        )
    series = results.series_from_stamps(folder)
    commit, version = series.get("commit"), (series.get("base") or "").removeprefix("vllm==")
    if not commit or not version:
        raise ToolkitError(f"wheel: the stamps in {folder} name no series commit or base")
    out = SeriesTree(folder, f"{folder} (series {commit[:12]})", version, series)
    for path, blob in series["files"].items():
        f = folder / path
        if not f.is_file():
            if path.startswith("vllm/"):
                raise ToolkitError(f"wheel: {f} is missing: the stamps list it")
            continue  # the packer carries vllm/, csrc/sm7x and the test files only
        if git_blob_id(f.read_bytes()) != blob:
            raise ToolkitError(
                f"wheel: {f} is not the series' (git blob {blob[:12]}): the tree was changed "
                "after it was packed"
            )
        if path.startswith("vllm/"):
            out.changed.add(path)
    for f in sorted((folder / "vllm").rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.is_dir() or "__pycache__" in f.parts or rel == module_file() or f.suffix == ".pyc":
            continue
        mode = 0o755 if os.access(f, os.X_OK) else 0o644
        out.files[rel] = (mode, f.read_bytes)
        if f.is_symlink():  # packaged as the file it names: changed with it
            named = f.resolve()
            if named.is_relative_to(folder) and named.relative_to(folder).as_posix() in out.changed:
                out.changed.add(rel)
    return out
