"""What the GPU machine's load must carry for ``vllm serve``
(serieskit/build/pack_deps.py, gpu/check_pack_imports.py): the closure of a
pip report, the plan against overlays/gpu.toml, the stand-in wheels; and,
where a load has been packed here, the load itself in an environment that
stands in for the GPU machine's image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from serieskit.build import pack_deps, recipe

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "gpu" / "check_pack_imports.py"
ENV_312 = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64"}


def item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def report(*items: dict, env: dict | None = None) -> dict:
    return {"environment": env or ENV_312, "install": list(items)}


def test_the_closure_follows_markers_and_extras():
    r = report(
        item("vllm", "1.0", "Fast_API[standard]>=1", "six; python_version > '3.11'", "gone"),
        item("fast-api", "1.2", "starlette", "uvicorn; extra == 'standard'", "x; extra == 'all'"),
        item("starlette", "0.5"),
        item("uvicorn", "0.3", "httptools; extra == 'standard'"),  # not asked with [standard]
        item("six", "1.17"),
        item("x", "9"),
        item("httptools", "1"),
    )
    found = pack_deps.closure(r)
    assert set(found) == {"vllm", "fast-api", "starlette", "uvicorn", "six", "gone"}
    assert found["uvicorn"].required_by == {"fast-api"}
    assert found["fast-api"].version == "1.2"
    assert found["gone"].version == "?"  # required, not in the report
    # the same requirements under Python 3.11: six's marker is false
    assert "six" not in pack_deps.closure(
        {**r, "environment": {**ENV_312, "python_version": "3.11"}}
    )


def test_the_plan_names_what_the_list_lacks_and_what_it_holds_beyond_vllm():
    found = pack_deps.closure(
        report(
            item("vllm", "1", "a", "b", "torch==2.14", "flashinfer-python"),
            item("a", "1", "c"),
            item("b", "2"),
            item("c", "3"),
            item("torch", "2.14+stub"),
            item("flashinfer-python", "0.1+stub"),
        )
    )
    plan = pack_deps.plan(
        found,
        image={"b", "torch"},
        lazy={"flashinfer_python"},
        listed=["a==1", "coverage==7"],
    )
    assert set(plan.needed) == {"a", "c"}
    assert set(plan.from_image) == {"b", "torch"}
    assert set(plan.lazy) == {"flashinfer-python"}
    assert plan.missing == ["c"]
    assert plan.unneeded == ["coverage"]


def test_stand_ins_are_wheels_pip_takes_for_the_pinned_requirement(tmp_path):
    reqs = [
        Requirement("torch==2.14.0"),
        Requirement("fastsafetensors>=0.3.3"),
        Requirement("zentorch==2.14.0.1; extra == 'zen'"),  # an extra's: no stand-in
        Requirement("numpy"),  # not named
    ]
    pins = pack_deps.write_stubs(reqs, {"torch", "fastsafetensors", "zentorch"}, tmp_path / "s")
    assert pins == ["torch==2.14.0+stub", "fastsafetensors==0.3.3+stub"]
    wheels = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert wheels == [
        "fastsafetensors-0.3.3+stub-py3-none-any.whl",
        "torch-2.14.0+stub-py3-none-any.whl",
    ]
    with zipfile.ZipFile(tmp_path / "s" / wheels[1]) as z:
        assert "Version: 2.14.0+stub" in z.read("torch-2.14.0+stub.dist-info/METADATA").decode()
    (tmp_path / "c.txt").write_text("\n".join(pins) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
         "--find-links", str(tmp_path / "s"), "-c", str(tmp_path / "c.txt"),
         "--report", str(tmp_path / "r.json"), "-q", "torch==2.14.0", "fastsafetensors>=0.3"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads((tmp_path / "r.json").read_text())["install"]
    }
    assert got == {"torch": "2.14.0+stub", "fastsafetensors": "0.3.3+stub"}


def test_the_recipe_pins_every_wheel_and_names_each_lazy_package_once():
    gpu = recipe.gpu()
    for spec in gpu.wheels:  # the same load on every pack
        assert [s.operator for s in Requirement(spec).specifier] == ["=="], spec
    names = [pack_deps.spec_name(s) for s in gpu.wheels]
    assert len(names) == len(set(names))
    lazy = {pack_deps.norm(d) for d, _ in gpu.lazy_gpu}
    assert not lazy & set(names)  # a lazy package is not carried
    assert not lazy & {pack_deps.norm(n) for n in gpu.image}
    assert {"torch", "torchaudio", "torchvision"} <= {pack_deps.norm(n) for n in gpu.image}


def gpu_python_or_skip() -> None:
    sys.path.insert(0, str(REPO / "gpu"))
    try:
        import check_pack_imports
    finally:
        sys.path.pop(0)
    try:
        check_pack_imports.gpu_python()
    except SystemExit as e:
        pytest.skip(str(e))


@pytest.mark.skipif(
    os.environ.get("VLLM_SERIES_PACK_CHECK") != "1"
    or not (REPO / ".dev" / "gpu" / "wheels").is_dir(),
    reason="opt-in (minutes, a 5 GB torch the first time): VLLM_SERIES_PACK_CHECK=1 "
    "with a packed GPU load (python3 -m serieskit overlay --gpu makes .dev/gpu)",
)
def test_the_packed_load_imports_what_vllm_serve_needs_and_fails_without_a_wheel(tmp_path):
    """The real load (.dev/gpu) in an environment standing in for the GPU
    machine's image: `vllm serve`'s startup imports and `vllm --version`
    pass; the same load less one wheel the list carries fails. Minutes (the
    first run installs the image's torch, about 5 GB, into the cache)."""
    gpu_python_or_skip()
    resolution = tmp_path / "resolution.json"

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=3000
        )

    resolved = check("resolve", "--json", str(resolution))
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    whole = check("venv", "--resolution", str(resolution), "--json", str(tmp_path / "ok.json"))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    steps = json.loads((tmp_path / "ok.json").read_text())["steps"]
    assert all(s["ok"] for s in steps) and len(steps) == 9
    less = check("venv", "--resolution", str(resolution), "--drop", "uvicorn")
    assert less.returncode == 1
    assert "No module named 'uvicorn'" in less.stdout
