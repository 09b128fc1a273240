"""``wheel --verify``: the wheel installed into a fresh environment and checked there.

The check itself (``wheel_check.py``) runs inside that environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serieskit.build import recipe
from serieskit.errors import ToolkitError, failed, last_line

CHECK_SCRIPT = Path(__file__).with_name("wheel_check.py")


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def verify_install(wheel: Path, log=print) -> dict:
    """Install ``wheel`` with pip into a fresh virtual environment and check
    there (CPU): ``import vllm`` (from that environment), the version,
    ``vllm --version`` and the series' ops. The environment gets vLLM's
    requirements from this Python's (torch with its CUDA libraries is
    gigabytes: not downloaded again); vLLM itself only from the wheel."""
    import importlib.util
    import sysconfig

    if importlib.util.find_spec("torch") is None:
        raise ToolkitError(
            f"wheel --verify: vLLM's requirements (torch, ...) are not installed in "
            f"{sys.executable}: run it in the environment that `nox -s test` and `nox -s ci` "
            "share (.nox/torch_env), or install them "
            "(pip install torch -r .work/vllm/requirements/common.txt)"
        )
    expected = wheel_version(wheel)
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-check-") as tmp:
        venv = Path(tmp) / "venv"
        py = venv / "bin" / "python"
        t0 = time.perf_counter()
        _run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            "creating a virtual environment",
        )
        site = _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            "asking the new environment",
        ).strip()
        deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        (Path(site) / "zz_vllm_requirements.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in deps)
        )
        _run(
            # --no-compile: byte-compiling vLLM's 5,000 files takes three times the
            # install (30 s of 42 on two cores) and checks nothing that import does not
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(py),
                "install",
                "-q",
                "--no-compile",
                "--no-deps",
                "--no-index",
                str(wheel),
            ],
            f"pip install {wheel.name}",
        )
        times["install_s"] = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # vLLM 0.33.0's CLI builds its parser from a device config that must find
        # a platform: without a GPU only this names one (the released wheel's too).
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        # -I (the check sees only the new environment) also drops
        # PYTHONDONTWRITEBYTECODE: -B keeps it, else the check would write the
        # bytecode of torch and its dependencies into the shared environment
        # (86 MB in a CI run), where the tests keep theirs in .work/pycache.
        no_bytecode = ["-B"] if env.get("PYTHONDONTWRITEBYTECODE") else []
        t0 = time.perf_counter()
        report = json.loads(
            last_line(
                _run(
                    [
                        str(py),
                        "-I",
                        *no_bytecode,
                        str(CHECK_SCRIPT),
                        expected,
                        str(venv),
                        recipe.native().module,
                    ],
                    "the check in the new environment",
                    cwd=tmp,
                    env=env,
                )
            )
        )
        times["check_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        shown = last_line(
            _run([str(venv / "bin" / "vllm"), "--version"], "vllm --version", cwd=tmp, env=env)
        )
        times["version_s"] = time.perf_counter() - t0
    if shown != expected:
        raise ToolkitError(
            f"wheel --verify: vllm --version says {shown!r}, the wheel is {expected}"
        )
    report.update(times, vllm_version_cli=shown)
    how = (
        "by the wheel's module"
        if report["extension_loaded"]
        else "from their schemas, with their fakes: no module in the wheel"
    )
    log(
        f"wheel --verify: pip installed {wheel.name} into a fresh environment "
        f"({times['install_s']:.1f} s); import vllm from it, version {expected}, "
        f"{len(report['ops'])} ops of csrc/sm7x registered "
        f"({how}), "
        f"torch.ops.vllm.nvfp4_marlin_prefill_dequant_apply registered ({times['check_s']:.1f} s); "
        f"vllm --version: {shown} ({times['version_s']:.1f} s)"
    )
    return report


def _run(cmd: list[str], what: str, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise failed(f"wheel --verify: {what}", proc)
    return proc.stdout
