"""Is the pull request a duplicate? The seed's four checks, offline.

``--others DIR`` holds other pull requests as ``N.diff`` (what ``gh pr diff N``
prints) and optionally their metadata as JSON (``gh pr list --json
number,title,body`` into any ``*.json``, or one object per ``N.json``). Each is
compared with this pull request's own commits (``review_base..head``):

1. file overlap: the paths both change;
2. function overlap: Python by the enclosing ``def`` / ``class`` of the changed
   lines, read from the AST (ours at head and base, theirs at our base), C/C++
   and CUDA by the function git names in each hunk header; and this pull
   request's own symbols searched as words in their changed lines;
3. a three-way merge of their diff (applied to our base) with our branch,
   ``git merge-tree --write-tree``;
4. keyword hits in their title, body and changed lines.
"""

from __future__ import annotations

import ast
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import git

GENERIC = {
    "__init__",
    "forward",
    "main",
    "setup",
    "test",
    "run",
    "get",
    "apply",
    "update",
    "__call__",
    "__post_init__",
    "compute_hash",
}
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")


@dataclass
class FileDiff:
    path: str
    old: list[tuple[int, int]] = field(default_factory=list)  # changed line ranges, old side
    new: list[tuple[int, int]] = field(default_factory=list)
    funcs: set[str] = field(default_factory=set)  # from hunk headers
    lines: list[str] = field(default_factory=list)  # added and removed lines


def parse_diff(text: str) -> dict[str, FileDiff]:
    files: dict[str, FileDiff] = {}
    cur: FileDiff | None = None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)$", line)
            cur = None
            if m:
                path = m.group(2)
                cur = files.setdefault(path, FileDiff(path))
                if m.group(1) != path:
                    files.setdefault(m.group(1), cur)
            continue
        if cur is None:
            continue
        m = _HUNK.match(line)
        if m:
            o, oc, n, nc, ctx = m.groups()
            oc_i, nc_i = int(oc if oc is not None else 1), int(nc if nc is not None else 1)
            cur.old.append((int(o), int(o) + max(oc_i, 1) - 1))
            cur.new.append((int(n), int(n) + max(nc_i, 1) - 1))
            if f := _c_func(ctx):
                cur.funcs.add(f)
        elif line[:1] in "+-" and not line.startswith(("+++", "---")):
            cur.lines.append(line[1:])
    return files


def _c_func(context: str) -> str | None:
    m = re.search(r"([A-Za-z_][\w:]*)\s*\(", context)
    return m.group(1).split("::")[-1] if m else None


def py_scopes(source: str, ranges: list[tuple[int, int]]) -> set[str]:
    """Qualified names of the innermost def/class around each changed range."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    spans: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                spans.append((child.lineno, child.end_lineno or child.lineno, name))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    out = set()
    for lo, hi in ranges:
        inner = [s for s in spans if s[0] <= hi and s[1] >= lo]
        if inner:
            out.add(max(inner, key=lambda s: s[0])[2])
    return out


def _show(repo: Path, commit: str, path: str) -> str | None:
    proc = git.run(repo, "show", f"{commit}:{path}")
    return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None


@dataclass
class Ours:
    files: dict[str, FileDiff]
    functions: dict[str, set[str]]  # path -> qualified names (Python) / names (C++)
    symbols: set[str]


def ours(repo: Path, review_base: str, head: str) -> Ours:
    diff = parse_diff(git.git(repo, "diff", "-U0", "--no-color", review_base, head))
    functions: dict[str, set[str]] = {}
    symbols: set[str] = set()
    for path, fd in diff.items():
        if path.endswith(".py"):
            names = set()
            if (new := _show(repo, head, path)) is not None:
                names |= py_scopes(new, fd.new)
            if (old := _show(repo, review_base, path)) is not None:
                names |= py_scopes(old, fd.old)
            functions[path] = names
        else:
            functions[path] = set(fd.funcs)
        if path.startswith("tests/") or "/tests/" in path:
            continue  # our test helpers are no symbols of the change
        for line in fd.lines:
            m = re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", line)
            if m:
                symbols.add(m.group(1))
        symbols |= {n.split(".")[-1] for n in functions[path]}
    return Ours(
        diff,
        functions,
        {
            s
            for s in symbols
            if s not in GENERIC and len(s) >= 6 and not (s.startswith("__") and s.endswith("__"))
        },
    )


@dataclass
class Finding:
    number: str
    title: str = ""
    files: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    merge: str = ""
    conflicts: list[str] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)

    @property
    def overlaps(self) -> bool:
        return bool(self.files or self.functions or self.symbols or self.conflicts or self.keywords)


def _metadata(folder: Path) -> dict[str, dict]:
    meta: dict[str, dict] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        for item in data if isinstance(data, list) else [data]:
            if isinstance(item, dict) and "number" in item:
                meta[str(item["number"])] = item
    return meta


def _merge(repo: Path, base: str, head: str, diff_path: Path, number: str) -> tuple[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.git(repo, "read-tree", base, env=env)
        proc = git.run(repo, "apply", "--cached", str(diff_path), env=env)
        if proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip().splitlines()
            return "does not apply to this PR's base, merge not tried (" + (
                why[0] if why else "git apply failed"
            ) + ")", []
        tree = git.git(repo, "write-tree", env=env).strip()
    who = {
        "GIT_AUTHOR_NAME": git.COMMITTER[0],
        "GIT_AUTHOR_EMAIL": git.COMMITTER[1],
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    }
    theirs = git.git(repo, "commit-tree", tree, "-p", base, "-m", f"PR #{number}", env=who).strip()
    proc = git.run(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", head, theirs)
    out = proc.stdout.decode(errors="replace").splitlines()
    if proc.returncode == 0:
        return "merges cleanly", []
    if proc.returncode == 1:
        conflicts = sorted({p for p in out[1:] if p.strip()})
        return "conflicts", conflicts
    return "merge not tried (git merge-tree --write-tree needs git >= 2.38)", []


def check_all(
    repo: Path, base: str, head: str, review_base: str, keywords: list[str], folder: Path
) -> tuple[Ours, list[Finding]]:
    if not folder.is_dir():
        raise FileNotFoundError(f"--others {folder} is not a folder")
    us = ours(repo, review_base, head)
    meta = _metadata(folder)
    findings = []
    diffs = sorted(folder.glob("*.diff"), key=lambda p: (len(p.stem), p.stem))
    for path in diffs:
        number = path.stem
        text = path.read_text(errors="replace")
        theirs = parse_diff(text)
        f = Finding(number, str(meta.get(number, {}).get("title", "")))
        f.files = sorted(set(theirs) & set(us.files))
        for p in f.files:
            if p.endswith(".py"):
                src = _show(repo, base, p)
                names = py_scopes(src, theirs[p].old) if src else set()
            else:
                names = set(theirs[p].funcs)
            f.functions += sorted(f"{p}: {n}" for n in names & us.functions.get(p, set()))
        changed = "\n".join(line for fd in theirs.values() for line in fd.lines)
        f.symbols = sorted(s for s in us.symbols if re.search(rf"\b{re.escape(s)}\b", changed))
        f.merge, f.conflicts = _merge(repo, base, head, path, number)
        words = " ".join([f.title, str(meta.get(number, {}).get("body", "")), changed]).lower()
        f.keywords = [k for k in keywords if k.lower() in words]
        findings.append(f)
    return us, findings


def render(us: Ours, findings: list[Finding], keywords: list[str], folder: Path) -> str:
    symbols = ", ".join(f"`{s}`" for s in sorted(us.symbols)[:20])
    more = f" and {len(us.symbols) - 20} more" if len(us.symbols) > 20 else ""
    lines = [
        f"**Not a duplicate.** Checked offline against {len(findings)} other open PR(s) "
        f"(`{folder.name}/N.diff`, as `gh pr diff N` prints them) in four ways:",
        "",
        "- full file lists;",
        "- functions: Python by the enclosing def / class from the AST, C++ / CUDA by the "
        f"hunk headers; and this PR's symbols searched in their changed lines ({symbols}{more});",
        "- a three-way merge of each with this branch (`git merge-tree --write-tree`);",
        "- keywords: " + (", ".join(keywords) if keywords else "(none given)") + ".",
        "",
    ]
    hits = [f for f in findings if f.overlaps]
    if hits:
        lines.append("Findings:")
        lines.append("")
    for f in hits:
        parts = []
        if f.files:
            parts.append("same files " + ", ".join(f"`{p}`" for p in f.files))
        if f.functions:
            parts.append("same functions " + ", ".join(f"`{x}`" for x in f.functions))
        if f.symbols:
            parts.append("their changed lines name " + ", ".join(f"`{s}`" for s in f.symbols))
        parts.append(
            "merge: "
            + f.merge
            + (" in " + ", ".join(f"`{c}`" for c in f.conflicts) if f.conflicts else "")
        )
        if f.keywords:
            parts.append("keywords " + ", ".join(f.keywords))
        title = f" ({f.title})" if f.title else ""
        lines.append(f"- #{f.number}{title}: " + "; ".join(parts) + ".")
    rest = len(findings) - len(hits)
    if rest or not findings:
        lines += ["", f"No overlap of any kind with the other {rest} PR(s)."]
    return "\n".join(lines)


def check(
    repo: Path, base: str, head: str | None, review_base: str, keywords: list[str], folder: Path
) -> str:
    assert head
    us, findings = check_all(repo, base, head, review_base, keywords, folder)
    return render(us, findings, keywords, folder)
