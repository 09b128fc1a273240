"""One tree's files and definitions, for the names check (:mod:`.names`).

A tree (the patched vLLM tree, or the toolkit) is indexed once: its tracked
files, the words its code defines (searched with GNU grep, every word at
once), its classes' members (read with :mod:`ast`), and the modules its build
makes. The names check asks it whether a name a text gives exists.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError

# Where a tree's definitions are looked up: its code, tests and tools.
TREE_CODE = ("vllm/", "csrc/", "tests/", "tools/", "setup.py", "CMakeLists.txt", "cmake/")
TOOLKIT_CODE = (
    "serieskit/",
    "overlays/",
    "noxfile.py",
    "bench/",
    "e2e/",
    "gpu/",
    "tests/",
    "ci/",
    "build/",
    "patches/manifest.toml",
    "pin.toml",
    "pyproject.toml",
    ".pre-commit-config.yaml",
    "results/",  # the keys of the results files (results/README.md)
)
# Code and settings, not texts: a page's words are no definition.
PROGRAM_EXT = (".py", ".pyi", ".sh", ".cu", ".cuh", ".cpp", ".c", ".h", ".hpp")
CODE_EXT = PROGRAM_EXT + (".toml", ".yaml", ".yml", ".cmake", "CMakeLists.txt")
CONFIG_DIR = "vllm/config/"
# Where outputs, other machines' files and git refs live: not the trees' files.
NOT_OURS = (".work", ".nox", ".dev", ".git/", ".cache", "dist/", "refs/", "origin/", "/", "~", "$")
WORD = re.compile(r"--[\w-]+|\w+")
# Bases whose members are not the trees' to list.
FOREIGN_BASES = {"object", "Enum", "IntEnum", "StrEnum", "ABC", "Protocol", "Generic", "NamedTuple"}


@dataclass
class Tree:
    """One tree's files and definitions. Its code is searched with GNU grep,
    every word at once (git grep takes minutes for a few hundred words over
    vLLM's 80 MB of source, grep -F a second)."""

    root: Path
    code: tuple[str, ...]
    built: set[str] = field(default_factory=set)  # dotted modules its build makes
    ext: tuple[str, ...] = ()  # the code's files by their ends (CODE_EXT and these)
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    _lines: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    _classes: dict[str, set[str]] | None = None  # class name -> files that define it
    _asts: dict[str, dict[str, list[ast.ClassDef]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        listed = git.run(self.root, "ls-files", "-z")
        if listed.returncode == 0:
            self.files = set(listed.stdout.decode(errors="replace").split("\0")) - {""}
        else:  # a toolkit copy outside git: what it holds, outputs aside
            self.files = {
                p.relative_to(self.root).as_posix()
                for p in self.root.rglob("*")
                if p.is_file() and not p.relative_to(self.root).as_posix().startswith(NOT_OURS)
            }
        for f in self.files:
            parts = f.split("/")[:-1]
            self.dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        self.basenames = {p.rsplit("/", 1)[-1] for p in self.files | self.dirs}
        self.code_files = sorted(
            f
            for f in self.files
            if f.startswith(self.code)
            and f.endswith(CODE_EXT + self.ext)
            and (self.root / f).is_file()
        )

    def _grep(self, patterns: list[str], files: list[str]) -> list[tuple[str, str]]:
        """(path, line) of each line of ``files`` that holds one of the fixed strings."""
        out: list[tuple[str, str]] = []
        for i in range(0, len(files), 20000):  # one grep for vLLM's files
            proc = subprocess.run(
                ["grep", "-I", "-n", "-H", "-F", "-f", "-", "--"] + files[i : i + 20000],
                cwd=self.root,
                input="\n".join(patterns).encode(),
                capture_output=True,
            )
            if proc.returncode > 1:
                raise ToolkitError(f"grep in {self.root}: {proc.stderr.decode(errors='replace')}")
            for row in proc.stdout.decode(errors="replace").splitlines():
                path, _, rest = row.partition(":")
                out.append((path, rest.partition(":")[2]))
        return out

    def grep(self, words: Iterable[str]) -> None:
        """Read, in one pass over the code, the lines that hold each word (and,
        the first time, every class statement: :meth:`classes`)."""
        todo = sorted({w for w in words if w not in self._lines})
        first = self._classes is None
        if not todo and not first:
            return
        for w in todo:
            self._lines[w] = []
        other = [w for w in todo if not WORD.fullmatch(w)]  # files' names, paths
        classes: dict[str, set[str]] = {}
        wanted = set(todo)
        for path, text in self._grep(todo + ["class "] * first, self.code_files):
            for w in set(WORD.findall(text)) | {w for w in other if w in text}:
                if w in wanted:
                    self._lines[w].append((path, text))
            if first and path.endswith(".py") and (m := re.match(r"\s*class\s+(\w+)", text)):
                classes.setdefault(m.group(1), set()).add(path)
        if first:
            self._classes = classes

    def lines(self, word: str) -> list[tuple[str, str]]:
        if word not in self._lines:
            self.grep([word])
        return self._lines[word]

    def defines(self, name: str) -> bool:
        return any(_defines(name, p, x) for p, x in self.lines(name))

    def quoted(self, name: str) -> bool:
        """Whether the code has ``name`` as a string: a value it knows (a
        backend's name, a key it writes, a reason it gives)."""
        rx = re.compile(rf"[\"']{re.escape(name)}[\"']")
        return any(rx.search(x) for p, x in self.lines(name) if p.endswith(PROGRAM_EXT))

    def has_path(self, path: str) -> bool:
        path = path.rstrip("/")
        if "*" in path:
            rx = re.compile(re.escape(path).replace(r"\*", r"[^/]*"))
            return any(
                rx.fullmatch(f) for f in (self.files | self.dirs if "/" in path else self.basenames)
            )
        if "/" not in path:
            return path in self.basenames
        return path in self.files or path in self.dirs

    def module(self, dotted: str) -> tuple[str, str] | None:
        """(module, rest) of the longest prefix of ``dotted`` that is a module here."""
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            mod, stem = ".".join(parts[:i]), "/".join(parts[:i])
            if (
                mod in self.built
                or f"{stem}.py" in self.files
                or f"{stem}/__init__.py" in self.files
            ):
                return mod, ".".join(parts[i:])
        return None

    def module_defines(self, mod: str, name: str) -> bool:
        stem = mod.replace(".", "/")
        path = next((p for p in (f"{stem}.py", f"{stem}/__init__.py") if p in self.files), None)
        if path is None:  # a built module: its names are its C++ code's
            return True
        text = (self.root / path).read_text(errors="replace")
        n = re.escape(name)
        return (
            re.search(
                rf"^(?:async\s+)?(?:def|class)\s+{n}\b|^{n}\s*[:=]|^\s*from\s.*\b{n}\b", text, re.M
            )
            is not None
        )

    def classes(self, name: str) -> list[ast.ClassDef]:
        """The definitions of class ``name``."""
        if self._classes is None:
            self.grep([])
        assert self._classes is not None
        return [c for p in sorted(self._classes.get(name, ())) for c in self._in(p).get(name, [])]

    def configs(self) -> list[str]:
        """The classes of ``vllm/config/`` whose names end in Config."""
        if self._classes is None:
            self.grep([])
        assert self._classes is not None
        return [
            c
            for c, paths in self._classes.items()
            if c.endswith("Config") and any(p.startswith(CONFIG_DIR) for p in paths)
        ]

    def _in(self, path: str) -> dict[str, list[ast.ClassDef]]:
        if path not in self._asts:
            found: dict[str, list[ast.ClassDef]] = {}
            try:
                module = ast.parse((self.root / path).read_text(errors="replace"))
            except SyntaxError:
                module = ast.Module(body=[], type_ignores=[])
            for node in ast.walk(module):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(node)
            self._asts[path] = found
        return self._asts[path]


def _defines(name: str, path: str, text: str) -> bool:
    """Whether a line defines ``name``, as far as one line tells."""
    w = re.escape(name)
    if path.endswith((".py", ".pyi")):
        rx = (
            rf"^\s*(?:async\s+)?(?:def|class)\s+{w}\b|^\s*(?:self\.)?{w}\s*(?::(?!=)|=(?!=))"
            rf"|[(,]\s*{w}\s*[:=](?!=)"
        )
    elif path.endswith((".cu", ".cuh", ".cpp", ".h", ".hpp", ".c")):
        rx = rf"\b{w}\s*[(=<]|#define\s+{w}\b|(?:struct|class|enum)\s+{w}\b|\"{w}\("
    elif path.endswith(".sh"):
        rx = rf"^\s*(?:export\s+|local\s+)?{w}=|^\s*{w}\s*\(\)|\${{?{w}\b"
    elif path.endswith(".json"):  # a key of a results file
        rx = rf"\"{w}\"\s*:"
    elif path.endswith((".toml", ".yaml", ".yml")):
        rx = rf"^\s*-?\s*\"?{w}\"?\s*[=:]|^\s*\[+[\w.]*\b{w}\]"
    else:
        return False
    return re.search(rx, text) is not None


def members(
    trees: list[Tree], cls: str, seen: frozenset[str] = frozenset()
) -> tuple[dict[str, ast.expr | None], bool] | None:
    """A class's members (name -> annotation), its bases' included, and
    whether a base was out of reach; None where no tree defines the class.
    A name bound to classes (``CudaPlatform = A if ... else B``) has theirs."""
    defs = [c for t in trees for c in t.classes(cls)]
    if not defs and seen:  # a base of no tree's (torch's, pydantic's)
        return None
    if not defs:
        aliases = [
            n
            for t in trees
            for p, x in t.lines(cls)
            if p.endswith(".py") and (m := re.match(rf"{cls}\s*=\s*(.+)", x))
            for n in re.findall(r"\w+", m.group(1))
        ]
        bound = [members(trees, n, seen | {cls}) for n in dict.fromkeys(aliases) if n != cls]
        known = [b for b in bound if b is not None]
        if not known:
            return None
        merged: dict[str, ast.expr | None] = {}
        for fields, _ in known:
            merged.update(fields)
        return merged, any(open_ for _, open_ in known)
    out: dict[str, ast.expr | None] = {}
    open_ = False
    for c in defs:
        for node in c.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.setdefault(node.name, getattr(node, "returns", None))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node.annotation
            elif isinstance(node, ast.Assign):
                out.update((t.id, None) for t in node.targets if isinstance(t, ast.Name))
        for sub in ast.walk(c):  # what its methods set on self
            targets: list[ast.expr] = []
            if isinstance(sub, ast.Assign):
                targets = sub.targets
            elif isinstance(sub, ast.AnnAssign):
                targets = [sub.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self":
                    out.setdefault(t.attr, None)
        for base in c.bases:
            name = _last_name(base)
            if not name or name in FOREIGN_BASES or name in seen | {cls}:
                continue
            inherited = members(trees, name, seen | {cls})
            if inherited is None:
                open_ = True
                continue
            for k, v in inherited[0].items():
                out.setdefault(k, v)
            open_ = open_ or inherited[1]
    return out, open_


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


# --- whether a name is in the trees ---------------------------------------------------
