"""Which wheels the GPU machine's load must carry for ``vllm serve``.

The released vLLM wheel's requirements (its METADATA's ``Requires-Dist``),
resolved by pip for the GPU machine's Python and platform, less what that
machine's image already has (overlays/gpu.toml ``[machine].image``) and the
GPU packages vLLM imports only where a kernel or feature asks for them
(``[serve].lazy_gpu``): what remains must be in ``[machine].wheels``.

The torch family and the lazy GPU packages enter the resolution as empty
stand-in wheels (``NAME-VERSION+stub``, pinned by a constraints file): their
own requirements (CUDA wheels of other versions than the image's, some not
on the index for that Python) are not what the load carries, and pip cannot
be told to take a requirement as met otherwise. pip evaluates markers with
the interpreter that runs it, so the resolution runs under the GPU machine's
Python (``python_version > "3.11"`` lines of vLLM's requirements differ).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

STUB = "stub"  # the local version label of a stand-in wheel


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_name(spec: str) -> str:
    """The distribution a requirement line of gpu.toml names ("xgrammar==0.2.8")."""
    return norm(Requirement(spec).name)


def wheel_name(wheel: Path) -> str:
    """The distribution a wheel file holds, by its file name (PEP 427)."""
    return norm(wheel.name.split("-")[0])


def metadata_of(wheel: Path) -> str:
    """The METADATA text of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


def requires(metadata: str) -> list[Requirement]:
    """The ``Requires-Dist`` lines of a METADATA text."""
    return [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    """Whether ``req`` is required in ``env`` (pip's report's ``environment``)
    with ``extras`` asked for (none: the package's own requirements)."""
    if req.marker is None:
        return True
    return any(
        Marker(str(req.marker)).evaluate({**env, "extra": extra}) for extra in (extras or {""})
    )


def write_stubs(reqs: list[Requirement], names: set[str], folder: Path) -> list[str]:
    """Empty wheels standing in for the requirements named in ``names``, at
    the version the requirement pins or starts from; returns the constraint
    lines that make pip take exactly them."""
    folder.mkdir(parents=True, exist_ok=True)
    pins: list[str] = []
    for req in reqs:
        if norm(req.name) not in names or (req.marker and "extra" in str(req.marker)):
            continue
        base = next((s.version for s in req.specifier if s.operator in ("==", ">=", "~=")), "0")
        version = f"{base}+{STUB}"
        dist = re.sub(r"[-.]+", "_", req.name)
        info = f"{dist}-{version}.dist-info"
        with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(
                f"{info}/METADATA",
                f"Metadata-Version: 2.1\nName: {req.name}\nVersion: {version}\n",
            )
            z.writestr(
                f"{info}/WHEEL",
                "Wheel-Version: 1.0\nGenerator: serieskit\nRoot-Is-Purelib: true\n"
                "Tag: py3-none-any\n",
            )
            z.writestr(f"{info}/RECORD", "")
        pins.append(f"{req.name}=={version}")
    return pins


@dataclass
class Node:
    """One distribution of the resolution: its version and who requires it."""

    version: str
    required_by: set[str] = field(default_factory=set)


def closure(report: dict, root: str = "vllm") -> dict[str, Node]:
    """The distributions ``root`` needs, from pip's ``--report`` (a dry run):
    each reached through a requirement that applies in the report's
    environment, with the extras asked for on the way. Stand-ins are leaves."""
    env = report["environment"]
    items = {norm(i["metadata"]["name"]): i for i in report["install"]}
    found: dict[str, Node] = {}
    todo: list[tuple[str, set[str]]] = [(norm(root), set())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, frozenset(extras)) in seen or name not in items:
            continue
        seen.add((name, frozenset(extras)))
        meta = items[name]["metadata"]
        found.setdefault(name, Node(meta["version"]))
        for line in meta.get("requires_dist") or ():
            req = Requirement(line)
            if not applies(req, env, extras):
                continue
            dep = norm(req.name)
            found.setdefault(dep, Node(items[dep]["metadata"]["version"] if dep in items else "?"))
            found[dep].required_by.add(name)
            todo.append((dep, set(req.extras)))
    return found


@dataclass
class Plan:
    """What the load must carry, against what overlays/gpu.toml lists."""

    needed: dict[str, Node]  # not in the image, not a lazy GPU package
    from_image: dict[str, Node]  # the image has them (versions unchecked here)
    lazy: dict[str, Node]  # GPU packages vLLM imports only when asked
    missing: list[str]  # needed, not listed
    unneeded: list[str]  # listed, not needed for vLLM (say why in gpu.toml)


def plan(
    found: dict[str, Node], image: set[str], lazy: set[str], listed: list[str], root: str = "vllm"
) -> Plan:
    listed_names = {spec_name(s) for s in listed}
    image, lazy = {norm(n) for n in image}, {norm(n) for n in lazy}
    rest = {n: v for n, v in found.items() if n != norm(root)}
    needed = {n: v for n, v in rest.items() if n not in image and n not in lazy}
    return Plan(
        needed=needed,
        from_image={n: v for n, v in rest.items() if n in image and n not in lazy},
        lazy={n: v for n, v in rest.items() if n in lazy},
        missing=sorted(set(needed) - listed_names),
        unneeded=sorted(listed_names - set(needed)),
    )
