"""Every name a text gives in code format is in the patched tree (or the toolkit).

A text that names a config field, flag, environment variable, module, class,
function or file the code has left behind must not pass: the name would
drift silently. The texts, and where their names are looked up:

- the texts the manifest's ``[[pr]]`` tables name (``text``, the overview a
  body is made of; ``rfc``, the RFC draft), the manifest itself (the
  contracts and claims the bodies quote), the series' commit messages (the
  patch files up to their diffstat) and the ``.md`` pages the patches add:
  the patched tree (the work tree at the series head) alone;
- the toolkit's own pages (README.md, docs/, the top folders' README.md):
  the patched tree and the toolkit (they speak of both).

A name is an inline code span, or a path or ``--flag`` inside one (fenced
blocks hold commands and their output). Its form says what it must be:

- ``a/b/c.py``, ``csrc/sm7x/``, ``*_sm75.cu``, a file's bare name: a tracked
  file or folder (or a path the code writes, quoted); ``vllm/X.abi3.so``: the
  built module ``vllm.X``;
- ``vllm.a.b`` (``serieskit.a.b``): a module file or package, or a module a
  build makes (the tree's CMake targets and setup.py extensions, and the
  toolkit's build/recipe.toml module, linked from the tree's csrc/ and
  imported by the tree where it exists), then a name it defines or imports;
  ``vllm.X`` alone may be a custom op (``op_name="X"``);
- ``x_config.field.sub``: a field (or property) of the config class of
  vllm/config/ (``parallel_config`` -> ``ParallelConfig``), each field's
  annotation giving the next class;
- ``Class.member``: the class and a member of it or of its bases;
- ``--flag``, ``--flag.key``, ``--flag '{"key": ...}'``: an option the code
  declares (a quoted ``"--flag"``, as vLLM's arg_utils adds each; its
  ``--no-`` and ``--enable-``/``--disable-`` forms), the key a field of the
  flag's config;
- ``VLLM_X``: a word of the code (vllm/envs.py reads them);
- an identifier (CamelCase, snake_case, UPPER_SNAKE): a ``def``, ``class``
  or assignment (a C++ function, a shell variable, a settings or results
  key) in the code (the tree's vllm/, csrc/, tests/, tools/; the toolkit's
  code, settings and results), a string the code has (a backend's name, a
  reason), a module's or a built module's name; UPPER_SNAKE any word of the
  code (a variable of another tool that the code sets).

A name with a placeholder (``X.Y.Z``, ``<...>``, ``VERSION``, ``...``), a
command's other words, numbers and JSON are skipped; :data:`ALLOWED` holds the
few names of neither tree, each with its reason.

A text that gives a named file's size (```a/b.py` is 587 lines``, the file by
its path or bare name) states a fact of the code: it must be the file's count
of lines in its tree.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.checks import facts
from serieskit.checks.codeindex import (
    NOT_OURS,
    TOOLKIT_CODE,
    TREE_CODE,
    Tree,
    members,
)
from serieskit.checks.figures import documents
from serieskit.errors import ToolkitError
from serieskit.series import series, target
from serieskit.series.target import Target
from serieskit.state import State

# Names of neither tree that a text may give, each with why.
ALLOWED: dict[str, str] = {
    "--autosquash": "git rebase's option, in a git command the page gives",
    "--ipc": "docker run's option (shared memory for the host all-reduce)",
    "--shm-size": "docker run's option (the size of /dev/shm)",
    "ports/": "the folder nox -s carry makes for a port; none is open now",
    "ports/0.33.0/": "a port's folder as nox -s carry makes it; none is open now",
    "tests/test_x.py": "a test file's name standing for any, in a command's pattern",
    "coverage-h200x2.json": "what gpu/run_tests.py writes on two H200s (coverage-<machine>.json)",
}

RECIPE = "build/recipe.toml"
FILE = re.compile(r"[\w.*+-]+\.(?:py|cu|cuh|cpp|h|hpp|sh|json|md|cmake|yaml|yml|toml|txt|so)")
PATHLIKE = re.compile(r"[\w.*+-]*/[\w.*/+-]*|" + FILE.pattern)
PLACEHOLDER = re.compile(
    r"\.\.\.|<[^>]*>|X\.Y\.Z|(?<![A-Za-z])(?:VERSION|NAME|DIR|FOLDER|PART|STEP|TARGET|SRC|REF"
    r"|FORK|PID|COMMAND|MACHINE|BASE|DAY|STEM|YYYYMMDD|N)(?![A-Za-z])"
)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")
FLAG = re.compile(r"--[A-Za-z][\w-]*(?:\.[\w.]+)?")
ENV = re.compile(r"VLLM_[A-Z0-9_]+")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")
CAMEL = re.compile(r"_*[A-Z]\w*[a-z]\w*")
UPPER = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
BUILTIN = set(dir(builtins))


@dataclass
class Text:
    label: str  # the file as a user opens it, relative to the repository
    lines: list[tuple[int, str]]  # (line number, line)
    toolkit: bool = False  # a page of the toolkit: both trees count


# --- the names a text gives ------------------------------------------------------


def spans(lines: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """Each inline code span as (line, code), outside fenced blocks."""
    out, fenced = [], False
    for n, line in lines:
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(n, m.group(2).strip()) for m in SPAN.finditer(line)]
    return out


def names_in(code: str) -> list[str]:
    """The names a span gives: itself, or in a command its paths (and its
    flags where it is a list of flags; a flag's JSON value as ``--flag.key``
    per key), each without a trailing value, call or line number."""
    words = code.split()
    if len(words) == 1:
        picked = words
    else:
        flags = bool(words) and words[0].startswith("-")
        picked = [w for w in words if PATHLIKE.fullmatch(w) or (flags and FLAG.match(w))]
        if flags and (m := re.fullmatch(r"(--[\w-]+)\s+'(\{.*\})'", code)):
            picked += [f"{m.group(1)}.{k}" for k in _json_keys(m.group(2))]
    out = []
    for w in picked:
        w = re.sub(r"(?::\d+|#[\w-]*)$", "", w.rstrip(",;:").removesuffix("()"))
        if FLAG.match(w) or ENV.match(w):
            w = w.split("=", 1)[0]
        if w and not PLACEHOLDER.search(w) and w not in ALLOWED:
            out.append(w)
    return out


def _json_keys(text: str, prefix: str = "") -> list[str]:
    """The dotted keys of a JSON object, its bare-word values (placeholders) read as 0."""
    try:
        data = json.loads(re.sub(r":\s*([A-Za-z_]\w*)", r": 0", text))
    except ValueError:
        return []
    keys = []
    for k, v in data.items() if isinstance(data, dict) else ():
        keys.append(prefix + k)
        if isinstance(v, dict):
            keys += _json_keys(json.dumps(v), f"{prefix}{k}.")
    return keys


def kind(name: str) -> str | None:
    """What a name is, by its form; None for a word this check does not look up."""
    if FLAG.fullmatch(name):
        return "flag"
    if ENV.fullmatch(name):
        return "env"
    if name.endswith(".so"):
        return "built"
    if PATHLIKE.fullmatch(name):
        return None if name.startswith(NOT_OURS) or "://" in name else "path"
    if DOTTED.fullmatch(name):
        head = name.split(".")[0]
        if head in ("vllm", "serieskit"):
            return "module"
        if head.endswith("_config"):
            return "config"
        return "member" if CAMEL.fullmatch(head) and head not in BUILTIN else None
    if not re.fullmatch(r"\w+", name) or name in BUILTIN or name[0].isdigit():
        return None
    if UPPER.fullmatch(name):
        return "constant"
    if "_" in name.strip("_") or (CAMEL.fullmatch(name) and sum(map(str.isupper, name)) > 1):
        return "identifier"
    return None


def config_class(trees: list[Tree], head: str) -> str | None:
    """``parallel_config`` -> ``ParallelConfig``: vllm/config/'s class of that name, any case."""
    want = head.replace("_", "").lower()
    return next((c for t in trees for c in t.configs() if c.lower() == want), None)


def resolve_attrs(trees: list[Tree], cls: str | None, attrs: list[str]) -> bool:
    """Whether ``cls.a.b...`` exists, each field's annotation the next class."""
    for i, attr in enumerate(attrs):
        if cls is None:
            return i > 0  # a field of a type out of reach: the rest is not ours to check
        found = members(trees, cls)
        if found is None:
            return False
        fields, open_ = found
        if attr not in fields:
            return open_ and any(t.defines(attr) for t in trees)
        ann, cls = fields[attr], None
        if ann is not None:
            names = [n.id for n in ast.walk(ann) if isinstance(n, ast.Name)]
            names += [
                n.value
                for n in ast.walk(ann)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            cls = next((n for n in names if any(t.classes(n) for t in trees)), None)
        if cls is None and attr.endswith("_config"):
            cls = config_class(trees, attr)
    return True


def found(trees: list[Tree], name: str) -> bool:
    """Whether ``name`` (one of :func:`names_in`'s) is in one of the trees;
    a name of no form this check knows is taken as it is."""
    k = kind(name)
    if k == "flag":
        return _flag(trees, name)
    if k == "env":
        return any(t.lines(name) for t in trees)
    if k == "built":  # vllm/X.abi3.so, X.abi3.so: the built module (vllm.)X
        module = name.split(".", 1)[0].replace("/", ".")
        return any(m == module or m.endswith("." + module) for t in trees for m in t.built)
    if k == "path":
        return any(t.has_path(name) or name.replace("/", ".") in t.built for t in trees) or any(
            t.quoted(name) for t in trees
        )
    if k == "module":
        return _module(trees, name)
    if k in ("config", "member"):
        head, *rest = name.split(".")
        cls = config_class(trees, head) if k == "config" else head
        return resolve_attrs(trees, cls, rest)
    if k in ("constant", "identifier"):
        short = {m.rsplit(".", 1)[-1] for t in trees for m in t.built}
        return (
            name in short
            or any(t.defines(name) or t.quoted(name) for t in trees)
            or any(f"{name}.py" in t.basenames or name in t.basenames for t in trees)
            or (k == "constant" and any(t.lines(name) for t in trees))
        )
    return True


def _words(name: str, trees: list[Tree]) -> list[str]:
    """The words whose lines :func:`found` reads for ``name`` (one grep for all)."""
    k = kind(name)
    if k == "path" and any(t.has_path(name) for t in trees):
        return []
    if k == "flag":
        base = name.partition(".")[0].replace("_", "-")
        forms = [base, base.replace("--no-", "--"), base.replace("--disable-", "--enable-")]
        return forms + [base.replace("--enable-", "--disable-")]
    if k in ("env", "path", "constant", "identifier"):
        return [name]
    if k == "member":
        return [name.split(".")[0]]
    if k == "module":
        return name.split(".")[1:2]  # vllm.X: a custom op's name
    return []


def _module(trees: list[Tree], dotted: str) -> bool:
    for t in trees:
        if at := t.module(dotted):
            mod, rest = at
            if mod != dotted.split(".")[0]:
                return not rest or t.module_defines(mod, rest.split(".")[0])
            # vllm.X alone: a custom op, torch.ops.vllm.X
            if "." not in rest and any(
                re.search(rf"op_name\s*=\s*[\"']{rest}[\"']", x) for _, x in t.lines(rest)
            ):
                return True
    return False


def _flag(trees: list[Tree], flag: str) -> bool:
    base, _, keys = flag.partition(".")
    base = base.replace("_", "-")
    forms = {base}
    for a, b in (("--no-", "--"), ("--disable-", "--enable-"), ("--enable-", "--disable-")):
        if base.startswith(a):
            forms.add(b + base.removeprefix(a))
    if not any(_option(t, f) for t in trees for f in forms):
        return False
    field_ = base[2:].replace("-", "_")
    return not keys or resolve_attrs(trees, config_class(trees, field_), keys.split("."))


def _option(t: Tree, flag: str) -> bool:
    """An option the code declares: quoted in Python, a case or test in shell."""
    quoted = re.compile(rf"[\"']{re.escape(flag)}[\"'=]")
    shell = re.compile(rf"{re.escape(flag)}(?![\w-])")
    return any(
        (quoted if p.endswith(".py") else shell).search(x)
        for p, x in t.lines(flag)
        if p.endswith((".py", ".sh"))
    )


# --- the texts -------------------------------------------------------------------


def texts(t: Target, tree: Path, base: str) -> list[Text]:
    """The texts this check reads, with their lines."""
    root = t.root

    def of(path: Path, toolkit: bool = False, lines: list[tuple[int, str]] | None = None) -> Text:
        label = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        text = path.read_text(errors="replace")
        return Text(label, lines or list(enumerate(text.splitlines(), 1)), toolkit)

    manifest = t.patches / series.MANIFEST
    groups = tomllib.loads(manifest.read_text()).get("pr", []) if manifest.is_file() else []
    words = dict.fromkeys(g[k] for g in groups for k in ("text", "rfc") if g.get(k))
    out = [of(root / p) for p in words if (root / p).is_file()]
    if manifest.is_file():
        out.append(of(manifest))
    for name in series.read_series(t):
        out.append(of(t.patches / name, lines=message(t.patches / name)))
    added = git.git(tree, "diff", "--name-only", "--diff-filter=A", base, "HEAD", "--", "*.md")
    out += [of(tree / p) for p in added.split()]
    pages = documents(root) + [
        p for p in sorted(root.glob("*/README.md")) if not p.parent.name.startswith(".")
    ]
    out += [of(p, toolkit=True) for p in pages]
    return out


def message(patch: Path) -> list[tuple[int, str]]:
    """A patch file's commit message, with its line numbers: up to the
    diffstat's ``---``."""
    out = []
    for n, line in enumerate(patch.read_text(errors="replace").splitlines(), 1):
        if line == "---":
            break
        out.append((n, line))
    return out


def built(root: Path) -> set[str]:
    """The modules a tree's build makes: CMake targets and setup.py extensions."""
    out = set()
    cmake = root / "CMakeLists.txt"
    if cmake.is_file():
        for name, dest in re.findall(
            r"define_extension_target\(\s*(\w+)\s+DESTINATION\s+(\S+)", cmake.read_text()
        ):
            out.add(f"{dest.replace('/', '.')}.{name}")
    setup = root / "setup.py"
    if setup.is_file():
        out |= set(re.findall(r"CMakeExtension\(name=\"([\w.]+)\"", setup.read_text()))
    return out


def recipe_module(root: Path) -> set[str]:
    """The module the toolkit links from the tree's native sources (build/recipe.toml)."""
    path = root / RECIPE
    if not path.is_file():
        return set()
    module = tomllib.loads(path.read_text()).get("native", {}).get("module")
    return {f"vllm.{module}"} if module else set()


SIZE = re.compile(r"`([\w./-]+\.\w+)`(?: \([^)]*\))? is (\d{1,3}(?:,\d{3})*|\d+) lines\b")


def sizes(given: list[Text], vllm: Tree, own: Tree) -> list[str]:
    """One line per file size a text gives (:data:`SIZE`) that its file in
    the text's trees does not have (a file not found is the names' problem)."""
    out = []
    for x in given:
        for n, line in x.lines:
            for name, count in SIZE.findall(line):
                paths = [
                    t.root / f
                    for t in ([vllm, own] if x.toolkit else [vllm])
                    for f in sorted(t.files)
                    if f == name or f.endswith("/" + name)
                ]
                if len(paths) != 1:
                    continue
                lines = len(paths[0].read_text(errors="replace").splitlines())
                if lines != int(count.replace(",", "")):
                    out.append(f"{x.label}:{n}: `{name}` is {lines} lines, not {count}")
    return out


def problems(given: list[Text], vllm: Tree, own: Tree) -> list[str]:
    """One line per name a text gives that its trees do not have, and per
    file size it gives that the file does not have."""
    named = [(x, n, name) for x in given for n, code in spans(x.lines) for name in names_in(code)]
    vllm.grep(w for x, _, name in named for w in _words(name, [vllm, own] if x.toolkit else [vllm]))
    own.grep(w for x, _, name in named if x.toolkit for w in _words(name, [vllm, own]))
    out = []
    for x, n, name in named:
        if not found([vllm, own] if x.toolkit else [vllm], name):
            where = "the patched tree (nor the toolkit)" if x.toolkit else "the patched tree"
            out.append(f"{x.label}:{n}: `{name}` is not in {where}")
    return list(dict.fromkeys(out + sizes(given, vllm, own)))


def check(t: Target, tree: Path, base: str) -> list[str]:
    """:func:`problems` of the texts of ``t`` (:func:`texts`) against its
    work tree and the toolkit."""
    vllm = Tree(tree, TREE_CODE, built(tree) | recipe_module(t.root))
    own = Tree(t.root, TOOLKIT_CODE, ext=(".json",))
    return problems(texts(t, tree, base), vllm, own)


def session(where: Path | Target, log=print) -> None:
    """Fail with each name the texts give that is not there, and each version
    the toolkit's pages state that the data does not (``docs --check``)."""
    t = target.of(where)
    tree = series.applied_tree(t)
    state = State.load(t)
    assert state.base
    problems = check(t, tree, state.base)
    wrong = facts.problems(t.root, tree, t.version)
    if problems or wrong:
        lines = []
        if problems:
            lines.append(
                f"{len(problems)} name(s) in code format, or file sizes, that the code does not "
                "have (mend the text, or give a name's reason in serieskit/checks/names.py "
                "ALLOWED):"
            )
            lines += [f"  {p}" for p in problems]
        if wrong:
            lines.append(
                f"{len(wrong)} version(s) that the data does not say (serieskit/checks/facts.py "
                "says where each is decided):"
            )
            lines += [f"  {p}" for p in wrong]
        raise ToolkitError("\n".join(lines))
    log("names: every name in code format is in the patched tree or the toolkit")
    log("facts: every version the pages state is the one the data says")
