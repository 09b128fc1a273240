"""The manifest's pull-request groups: what each holds, how they stack, their blobs."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from serieskit.errors import ToolkitError
from serieskit.pr import claims
from serieskit.series import series


def gitpython():
    """GitPython, imported when first needed: only the `pr` session installs it."""
    import git as gitpython  # GitPython: installed by the `pr` session

    return gitpython


@dataclass
class Group:
    name: str
    title: str
    patches: list[str]
    depends: list[str]
    text: str  # hand-written Overview / Details file
    keywords: list[str] = field(default_factory=list)
    claims: list[claims.Claim] = field(default_factory=list)
    paths: list[dict] = field(default_factory=list)
    contract: dict = field(default_factory=dict)
    ab: str | None = None
    changed_since: dict[str, dict[str, str]] = field(default_factory=dict)
    rfc: str | None = None  # the RFC draft, where the change needs one
    rfc_issue: str | None = None  # the RFC issue once opened (a link or #number)
    origin: str | None = None  # words: the work the code derives from (its credit)
    # "Name <mail>" of that work's author: the Co-authored-by of every commit
    # whose patch derives from it (branches.derived)
    co_author: str | None = None


def read_groups(root: Path, manifest: Path | None = None) -> list[Group]:
    path = manifest or root / series.PATCHES / series.MANIFEST
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ToolkitError(f"cannot read {path}: {e}") from None
    names = [p.get("name") for p in data.get("patch", [])]
    groups: list[Group] = []
    for entry in data.get("pr", []):
        missing = [k for k in ("name", "title", "patches", "text") if k not in entry]
        if missing:
            raise ToolkitError(f"[[pr]] {entry.get('name', '?')} lacks {', '.join(missing)}")
        unknown = [p for p in entry["patches"] if p not in names]
        if unknown:
            raise ToolkitError(
                f"[[pr]] {entry['name']} names patches without a [[patch]] entry: "
                + ", ".join(unknown)
            )
        try:
            cl = [claims.Claim.from_manifest(c) for c in entry.get("claim", [])]
        except ValueError as e:
            raise ToolkitError(f"[[pr]] {entry['name']}: {e}") from None
        groups.append(
            Group(
                entry["name"],
                entry["title"],
                list(entry["patches"]),
                list(entry.get("depends", [])),
                entry["text"],
                list(entry.get("keywords", [])),
                cl,
                list(entry.get("path", [])),
                dict(entry.get("contract", {})),
                entry.get("ab"),
                dict(entry.get("changed_since", {})),
                entry.get("rfc"),
                entry.get("rfc_issue"),
                entry.get("origin"),
                entry.get("co_author"),
            )
        )
    seen: dict[str, str] = {}
    for g in groups:
        for p in g.patches:
            if p in seen:
                raise ToolkitError(f"patch {p} is in two pull requests: {seen[p]} and {g.name}")
            seen[p] = g.name
        if len(g.depends) > 1:
            raise ToolkitError(
                f"[[pr]] {g.name} depends on {len(g.depends)} pull requests: a "
                "fork PR stacks on one (name the upper one of a chain)"
            )
    return groups


def stacks(groups: list[Group]) -> dict[str, list[Group]]:
    """Each group's stack, lowest first, ending with the group itself."""
    by = {g.name: g for g in groups}
    out: dict[str, list[Group]] = {}
    for g in groups:
        chain, cur = [g], g
        while cur.depends:
            dep = cur.depends[0]
            if dep not in by:
                raise ToolkitError(f"[[pr]] {cur.name} depends on {dep}, which is no [[pr]]")
            cur = by[dep]
            if cur in chain:
                raise ToolkitError(f"[[pr]] dependencies form a cycle through {cur.name}")
            chain.insert(0, cur)
        out[g.name] = chain
    return out


def order(groups: list[Group]) -> list[Group]:
    """Groups with every dependency before its dependants."""
    st = stacks(groups)
    return sorted(groups, key=lambda g: len(st[g.name]))


def head_blobs(tree: Path, heads: list[str], paths: list[str]) -> dict[str, set[str | None]]:
    """path -> its blob ids at each of ``heads`` (None where it does not exist)."""
    repo = gitpython().Repo(tree)
    out: dict[str, set[str | None]] = {p: set() for p in paths}
    for head in heads:
        tree_obj = repo.commit(head).tree
        for p in paths:
            try:
                out[p].add((tree_obj / p).hexsha)
            except KeyError:
                out[p].add(None)
    return out
