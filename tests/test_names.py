"""serieskit.checks.names: a name in code format that the code has left behind
fails, on a tiny tree shaped as the patched vLLM (its config classes, argparse
options, env vars, build targets) and a tiny toolkit."""

from __future__ import annotations

from pathlib import Path

from serieskit import git
from serieskit.checks import names

TREE = {
    "vllm/__init__.py": "",
    "vllm/config/__init__.py": "",
    "vllm/config/parallel.py": """\
from pydantic import Field


class HostAllReduceConfig:
    max_bytes: int = 262144
    copy_engine_max_bytes: int = 0


class ParallelConfig:
    enable_dbo: bool = False
    enable_host_all_reduce: bool = False
    host_all_reduce_config: HostAllReduceConfig = Field(default_factory=HostAllReduceConfig)

    @property
    def use_tp_ubatching(self) -> bool:
        return self.enable_dbo
""",
    "vllm/config/kernel.py": """\
class KernelConfig:
    nvfp4_dequant_min_tokens: int = 0
""",
    "vllm/config/vllm.py": """\
from vllm.config.kernel import KernelConfig
from vllm.config.parallel import ParallelConfig


class VllmConfig:
    parallel_config: ParallelConfig
    kernel_config: KernelConfig
""",
    "vllm/engine/arg_utils.py": """\
def add_cli_args(parser):
    parser.add_argument("--enable-dbo", action="store_true")
    parser.add_argument("--enable-host-all-reduce", action="store_true")
    parser.add_argument("--host-all-reduce-config")
    parser.add_argument("--kernel-config")
""",
    "vllm/envs.py": 'environment_variables = {\n    "VLLM_SKIP_P2P_CHECK": lambda: 1,\n}\n',
    "vllm/v1/attention/backends/triton_turing_attn.py": "class TritonTuringAttentionBackend:\n"
    "    pass\n",
    "vllm/v1/worker/gpu/ubatch_utils.py": "class UBatchRunner:\n    def run(self):\n"
    "        self.ubatch_idx = 0\n",
    "csrc/sm7x/host_reduce.cu": "#define MAX_BYTES 262144\nvoid host_reduce_probe(int x) {}\n",
    "CMakeLists.txt": "define_extension_target(\n  _C_stable_libtorch\n  DESTINATION vllm\n)\n",
}
TOOLKIT = {
    "build/recipe.toml": '[native]\nsources = "csrc/sm7x"\nmodule = "_sm7x_C_stable_libtorch"\n',
    "serieskit/__init__.py": "",
    "serieskit/results.py": 'SCHEMA = "vllm-series-results/1"\n\n\ndef write(path):\n    pass\n',
    "noxfile.py": "def apply(session):\n    pass\n",
}

# The texts a review found stale, verbatim: (file, text, a page of the toolkit).
STALE = [
    (
        "reports/pr/tp-prefill-overlap/overview.md",
        "a switch of its own, `kernel_config.tp_prefill_overlap_min_tokens`\n"
        "- Only models that declare support run as halves (`SupportsTPPrefillOverlap` "
        "among the bases of the model class)\n"
        "It does not need the host all-reduce (`kernel_config.host_reduce`).\n",
        False,
    ),
    (
        "reports/pr/host-reduce/overview.md",
        "Off by default (`kernel_config.host_reduce`).\n"
        "- The native code is a new extension, `vllm._sm7x_C` (`csrc/sm7x/`, its own\n",
        False,
    ),
    (
        "reports/pr/rfc-turing-prefill-attention.md",
        "`vllm._sm7x_C` extension target (the two-rank host all-reduce); it does not\n",
        False,
    ),
    (
        "build/README.md",
        "The native build's recipe, `recipe.toml`: the series' extension (`_sm7x_C`,\n",
        True,
    ),
    (
        "docs/gpu-evidence.md",
        "Which build: every H200 result comes from `vllm._sm7x_C` built on the GPU\n",
        True,
    ),
    (
        "docs/user-guide.md",
        "  bindings and links `vllm/_sm7x_C.abi3.so` (needs torch with CUDA).\n",
        True,
    ),
]
MISSES = [
    "reports/pr/tp-prefill-overlap/overview.md:1: `kernel_config.tp_prefill_overlap_min_tokens`",
    "reports/pr/tp-prefill-overlap/overview.md:2: `SupportsTPPrefillOverlap`",
    "reports/pr/tp-prefill-overlap/overview.md:3: `kernel_config.host_reduce`",
    "reports/pr/host-reduce/overview.md:1: `kernel_config.host_reduce`",
    "reports/pr/host-reduce/overview.md:2: `vllm._sm7x_C`",
    "reports/pr/rfc-turing-prefill-attention.md:1: `vllm._sm7x_C`",
    "build/README.md:1: `_sm7x_C`",
    "docs/gpu-evidence.md:1: `vllm._sm7x_C`",
    "docs/user-guide.md:1: `vllm/_sm7x_C.abi3.so`",
]

# Names as the code has them now, and spans that are no names.
CURRENT = """\
`parallel_config.enable_host_all_reduce`, `parallel_config.host_all_reduce_config.max_bytes`,
`vllm_config.parallel_config.enable_dbo`, `kernel_config.nvfp4_dequant_min_tokens`,
`--enable-dbo`, `--no-enable-dbo`, `--disable-host-all-reduce`, `--enable_dbo`,
`--host-all-reduce-config.max_bytes 262144`, `--kernel-config '{"nvfp4_dequant_min_tokens": N}'`,
`--enable-dbo --enable-host-all-reduce`, `VLLM_SKIP_P2P_CHECK=0`,
`vllm/v1/attention/backends/triton_turing_attn.py`, `csrc/sm7x/`, `csrc/sm7x/*.cu`,
`triton_turing_attn.py`, `vllm/config/kernel.py:2`,
`ParallelConfig.use_tp_ubatching`, `HostAllReduceConfig.max_bytes`, `UBatchRunner.run`,
`UBatchRunner.ubatch_idx`, `host_reduce_probe`, `TritonTuringAttentionBackend`,
`vllm._sm7x_C_stable_libtorch`, `_C_stable_libtorch`, `vllm/_C_stable_libtorch.abi3.so`,
`vllm.config.parallel.ParallelConfig`, `vllm.envs`, `ubatch_utils`,
`nox -s test`, `1024`, `{"host_reduce": {"enabled": false}}`, `vllm==X.Y.Z`, `.work/pr/<name>/`,
`$OUT/tests.json`, `torch.ops._C`, `None`, `ValueError`, `cuda`, `MAX_BYTES`,
```
--kernel-config '{"host_reduce": {}}'  `kernel_config.host_reduce` in a fenced block
```
"""
TOOLKIT_NAMES = (
    "`serieskit.results.write`, `serieskit/results.py`, `noxfile.py`, `vllm-series-results/1`,"
    " `build/recipe.toml`, `vllm/_sm7x_C_stable_libtorch.abi3.so`\n"
)


def repo(folder: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    git.git(folder, "init", "-q")
    git.git(folder, "add", "-A")
    return folder


def trees(tmp_path: Path) -> tuple[names.Tree, names.Tree]:
    vllm, own = repo(tmp_path / "vllm", TREE), repo(tmp_path / "root", TOOLKIT)
    built = names.built(vllm) | names.recipe_module(own)
    return (
        names.Tree(vllm, names.TREE_CODE, built),
        names.Tree(own, names.TOOLKIT_CODE, ext=(".json",)),
    )


def text(label: str, body: str, toolkit: bool = False) -> names.Text:
    return names.Text(label, list(enumerate(body.splitlines(), 1)), toolkit)


def test_the_names_a_review_found_stale_are_reported(tmp_path):
    vllm, own = trees(tmp_path)
    got = names.problems([text(*s) for s in STALE], vllm, own)
    assert [p.rsplit(" is not in ", 1)[0] for p in got] == MISSES
    assert got[0].endswith("is not in the patched tree")  # a pull request's text: the tree alone
    assert got[-1].endswith("is not in the patched tree (nor the toolkit)")


def test_the_names_the_code_has_pass(tmp_path):
    vllm, own = trees(tmp_path)
    given = [text("reports/pr/x/overview.md", CURRENT), text("docs/x.md", TOOLKIT_NAMES, True)]
    assert names.problems(given, vllm, own) == []
    # the toolkit's names count on its own pages only
    assert names.problems([text("reports/pr/x/overview.md", TOOLKIT_NAMES)], vllm, own) == [
        f"reports/pr/x/overview.md:1: `{n}` is not in the patched tree"
        for n in (
            "serieskit.results.write",
            "serieskit/results.py",
            "noxfile.py",
            "vllm-series-results/1",
            "build/recipe.toml",
        )
    ]


def test_a_file_size_a_text_gives_is_the_files(tmp_path):
    # The review's drift: a body kept "574 lines" after the file grew.
    vllm, own = trees(tmp_path)
    path = "vllm/v1/attention/backends/triton_turing_attn.py"
    count = len((vllm.root / path).read_text().splitlines())
    ok = f"`triton_turing_attn.py` is {count} lines, and `{path}` (`X`) is {count} lines too\n"
    assert names.problems([text("reports/pr/x/overview.md", ok)], vllm, own) == []
    stale = f"Size of the backend: `triton_turing_attn.py` (`X`) is {count + 13} lines\n"
    assert names.problems([text("reports/pr/x/overview.md", stale)], vllm, own) == [
        f"reports/pr/x/overview.md:1: `triton_turing_attn.py` is {count} lines, not {count + 13}"
    ]


def test_a_field_flag_or_key_the_code_lacks_fails(tmp_path):
    vllm, own = trees(tmp_path)
    body = (
        "`parallel_config.enable_host_reduce`, `--enable-host-reduce`, "
        "`--host-all-reduce-config.max_kib 1`, `--kernel-config '{\"tp_min\": 1}'`, "
        "`VLLM_HOST_REDUCE`, `ParallelConfig.use_ubatching`, `UBatchWrapper.run`, "
        "`vllm.config.gone`, `vllm/config/gone.py`, `host_reduce_gone`, `TRITON_ATTN`\n"
    )
    got = names.problems([text("docs/features/x.md", body)], vllm, own)
    assert [p.split("`")[1] for p in got] == [
        "parallel_config.enable_host_reduce",
        "--enable-host-reduce",
        "--host-all-reduce-config.max_kib",
        "--kernel-config.tp_min",
        "VLLM_HOST_REDUCE",
        "ParallelConfig.use_ubatching",
        "UBatchWrapper.run",
        "vllm.config.gone",
        "vllm/config/gone.py",
        "host_reduce_gone",
        "TRITON_ATTN",
    ]


def test_every_allowed_name_says_why():
    assert all(reason.strip() for reason in names.ALLOWED.values())
