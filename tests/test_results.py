"""Every results writer emits the schema header of results/README.md
(serieskit.results), fed here with the raw data of the committed runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from serieskit import results
from serieskit.checks import runner
from serieskit.pr import claims
from serieskit.pr.groups import read_groups

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "results" / "raw" / "e2e_seed16_h200x2"
H200X2 = results.machine_block(
    ["NVIDIA H200"] * 2, "580.159.04", "2.11.0+cu130", "13.0", "off (NCCL_P2P_DISABLE=1)"
)
SERIES = {
    "base": "vllm==0.26.0",
    "commit": "c0ffee",
    "tree": "7ree",
    "files": {},
    "files_from": "a test",
}


def script(path: str):
    """A bench / e2e / gpu script imported as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def committed(name: str) -> dict:
    return json.loads((ROOT / "results" / name).read_text())


def test_committed_results_files_validate():
    for f in sorted((ROOT / "results").glob("*.json")):
        assert results.validate(json.loads(f.read_text())) == [], f.name


def test_machine_header_and_label():
    assert H200X2["name"] == "2 x NVIDIA H200"
    assert H200X2["label"] == "H200 figure (2 x H200, P2P off): not a Turing figure"
    one = results.machine_block(["NVIDIA H200"], "580", "2.11", "13.0", "on", detail="PTX")
    assert one["label"] == "H200 figure (H200, PTX): not a Turing figure" and "p2p" not in one
    turing = results.machine_block(
        ["Quadro RTX 8000"] * 2, "535", "2.4", "12.1", "off (NCCL_P2P_DISABLE=1)", capability=(7, 5)
    )
    assert turing["label"].startswith("Turing / Volta figure (2 x Quadro RTX 8000, P2P off)")
    assert results.machine_block([], None, None, None)["label"] == "CPU run (no GPU)"
    assert results.validate(dict(committed("e2e_seed16_h200x2.json"), date="30 Nov")) == [
        "date '30 Nov' is not ISO 8601"
    ]


def test_runner_write_results_validates(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests/test_ok.py").write_text("def test_ok():\n    pass\n")
    outcome = runner.run_file(tree, "tests/test_ok.py", tmp_path)
    doc = runner.write_results(tmp_path / "r.json", [outcome], SERIES)
    data = json.loads((tmp_path / "r.json").read_text())
    assert results.validate(data) == [] and data == doc
    assert data["test_files"] == {
        "tests/test_ok.py": {"passed": 1, "failed": 0, "skipped": 0, "errors": 0}
    }
    assert claims.resolve(data, "figures['test_ok.passed'].value") == 1
    assert data["files"][0]["file"] == "tests/test_ok.py" and data["series"] == SERIES


def one_test_file(tmp_path: Path, text: str) -> tuple[Path, str, Path]:
    """A tree holding one of the series' test files with ``text``, and where
    gpu/run_tests.py is to write its results: (tree, test file, out JSON)."""
    test = "tests/config/test_host_reduce_config.py"
    tree = tmp_path / "src"
    (tree / test).parent.mkdir(parents=True)
    (tree / test).write_text(text)
    out = tmp_path / "out" / "tests.json"
    out.parent.mkdir()
    return tree, test, out


def test_gpu_run_tests_writes_the_header_from_the_packer_s_stamps(tmp_path, monkeypatch):
    run_tests = script("gpu/run_tests.py")
    tree, test, out = one_test_file(tmp_path, "def test_config():\n    pass\n")
    for key, value in (
        ("SERIES_COMMIT", "c0ffee"),
        ("SERIES_TREE", "7ree"),
        ("BASE_VERSION", "0.26.0"),
        ("SERIES_FILES", json.dumps({test: "b10b"})),
    ):
        (tree / key).write_text(value + "\n")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert run_tests.main([str(tree), str(out), "-k", "not hybrid", test]) == 0
    data = json.loads(out.read_text())
    assert results.validate(data) == []
    assert data["series"]["commit"] == "c0ffee" and data["series"]["base"] == "vllm==0.26.0"
    assert data["series"]["files"] == {test: "b10b"}
    assert data["commands"] == [f"NCCL_P2P_DISABLE=1 python -m pytest -k 'not hybrid' {test}"]
    assert (out.parent / f"{out.stem}-logs.tgz").is_file()


def test_host_reduce_bench_document_validates_and_keeps_the_claimed_figures():
    bench = script("bench/host_reduce.py")
    old = committed("bench_host_reduce_h200x2.json")
    doc = bench.document(old["rank0"], old["rank1"], {"gpus": old["gpus"]}, H200X2, SERIES)
    assert results.validate(doc) == []
    for name, fig in old["figures"].items():  # what the pull requests claim
        assert doc["figures"][name]["value"] == pytest.approx(fig["value"]), name
        assert doc["figures"][name]["unit"] == fig["unit"]
    for g in read_groups(ROOT):
        for c in g.claims:
            if c.file == "results/bench_host_reduce_h200x2.json":
                assert claims.resolve(doc, c.path) == pytest.approx(claims.resolve(old, c.path))


def test_host_reduce_bench_host_issue_figures():
    bench = script("bench/host_reduce.py")
    assert [bench.ce_pieces(b) for b in bench.SIZES] == [1, 4, 16, 16, 16]
    assert bench.ce_driver_calls(8192000) == 16 * 4 + 9
    old = committed("bench_host_reduce_h200x2.json")
    rank0 = dict(
        old["rank0"],
        host_issue=[
            {
                "bytes": b,
                "copy_engine_pieces": bench.ce_pieces(b),
                "copy_engine_driver_calls": bench.ce_driver_calls(b),
                "nccl": {"one_call_median_ms": 0.02, "back_to_back_host_ms_per_call": 0.02},
                "kernel_mode": {"one_call_median_ms": 0.03, "back_to_back_host_ms_per_call": 0.03},
                "copy_engine_mode": {
                    "one_call_median_ms": 0.30,
                    "back_to_back_host_ms_per_call": 0.31,
                },
            }
            for b in bench.SIZES
        ],
    )
    doc = bench.document(rank0, old["rank1"], {}, H200X2, SERIES)
    assert results.validate(doc) == []
    fig = doc["figures"]
    assert fig["allreduce_8192000B.copy_engine_host_issue_ms"]["value"] == 0.30
    assert fig["allreduce_8192000B.copy_engine_host_us_per_driver_call"]["value"] == pytest.approx(
        1e3 * 0.27 / 72
    )
    ce_ms = old["figures"]["allreduce_8192000B.copy_engine_mode_ms"]["value"]
    assert fig["allreduce_8192000B.copy_engine_host_fraction_of_call"]["value"] == pytest.approx(
        0.30 / ce_ms
    )


def test_prefill_attention_bench_document_validates():
    bench = script("bench/prefill_attention.py")
    old = committed("bench_prefill_attention_h200.json")
    doc = bench.document(old["rows"], old["mma_m16n8k8_ceiling"], {}, H200X2, SERIES)
    assert results.validate(doc) == []
    for name, fig in old["figures"].items():
        assert doc["figures"][name]["value"] == pytest.approx(fig["value"]), name


def test_prefill_attention_bench_names_figures_per_head_dim():
    bench = script("bench/prefill_attention.py")
    timing = {"median_ms": 2.0, "tflops": 100.0, "fraction_of_mma_ceiling": 0.5}
    rows = [
        {
            "head_dim": hd,
            "query_len": 2048,
            "context_len": 8192,
            "flops": bench.causal_flops(2048, 8192, hd),
            "no_split": timing,
            "auto_split": timing,
            "triton_attn": dict(timing, median_ms=5.0),
            "speedup_vs_triton_attn": 2.5,
        }
        for hd in (64, 128)
    ]
    doc = bench.document(rows, {"tflops": 200.0}, {}, H200X2, SERIES)
    assert results.validate(doc) == []
    fig = doc["figures"]
    assert fig["hd128.q2048_ctx8192.auto_split_fraction_of_ceiling"]["value"] == 0.5
    assert fig["hd64.q2048_ctx8192.speedup_vs_triton_attn"]["value"] == 2.5
    assert fig["hd64.q2048_ctx8192.triton_attn_ms"]["from"] == "rows[0].triton_attn.median_ms"
    assert doc["shape"]["head_dims"] == [64, 128]
    # causal FLOPs: 4 x head dim x heads x visible keys
    assert bench.causal_flops(2, 3, 64) == 4 * 64 * bench.HEADS * (4 + 5)


def test_prefill_attention_bench_reports_turing_sm_counts():
    """The longest context on 72 and 40 SMs: the split the kernel's rule
    gives that many SMs, figures per SM count, and a count that could not
    run (no green context) recorded without a figure."""
    bench = script("bench/prefill_attention.py")
    timing = {"median_ms": 2.0, "tflops": 100.0, "fraction_of_mma_ceiling": 0.5}
    row = {
        "head_dim": 256,
        "query_len": 2048,
        "context_len": 153600,
        "flops": bench.causal_flops(2048, 153600, 256),
        "no_split": timing,
        "auto_split": timing,
        "on_sms": {
            "72": dict(timing, median_ms=3.5, splits=2, fraction_of_mma_ceiling=0.45),
            "40": {"error": "RuntimeError: no green contexts"},
        },
    }
    doc = bench.document([row], {"tflops": 200.0}, {}, H200X2, SERIES)
    assert results.validate(doc) == []
    fig = doc["figures"]
    assert fig["hd256.q2048_ctx153600.on_72_sms_ms"]["value"] == 3.5
    assert fig["hd256.q2048_ctx153600.on_72_sms_fraction_of_ceiling"]["value"] == 0.45
    assert not any("on_40_sms" in k for k in fig)
    # 2048 tokens x 6 query heads per KV head in 128-row CTAs, 2 KV heads: 192
    # CTAs, one per SM at head dim 256. On 72 SMs the first 144 (two whole
    # waves) run whole and the other 48 split 3 ways (one wave of thirds); on
    # 40 SMs 160 whole, 32 split 5 ways.
    assert bench.splits_for(192, 72 * bench.TURING_CTAS_PER_SM[256]) == (3, 144)
    assert bench.splits_for(192, 40 * bench.TURING_CTAS_PER_SM[256]) == (5, 160)
    # Head dim 128's 192-row CTAs: 128 of them; on 72 SMs 56 split 5 ways (4
    # waves of fifths); 9 ways would fill 7 waves exactly, past the six that
    # bound the scratch.
    assert bench.splits_for(128, 72 * bench.TURING_CTAS_PER_SM[128]) == (5, 72)
    # Fewer CTAs than a wave: all split, at most 4 ways (11 would fill 3 waves
    # of 36 CTAs' ranges on 132 slots, in ranges too short to pay); whole
    # waves: none.
    assert bench.splits_for(192, 264) == (4, 0)
    assert bench.splits_for(36, 132) == (3, 0)
    assert bench.splits_for(144, 72) == (1, 0)


def test_the_benchmark_counts_each_head_dims_ctas_as_the_kernel_does():
    """The SM-limited rows take the launcher's split count only if the
    benchmark's rows and CTAs per SM are the kernel's: those of the static
    evidence of the series' sm_75 build."""
    bench = script("bench/prefill_attention.py")
    static = json.loads(
        (ROOT / "results" / "sm75_static_paged_prefill_attention_hd.json").read_text()
    )
    for hd in static["head_dims"]:
        d = hd["head_dim"]
        assert bench.ROWS_PER_CTA[d] == hd["traits"]["rows_per_cta"]
        assert bench.TURING_CTAS_PER_SM[d] == hd["turing_ctas_per_sm"]


def test_both_attention_benches_call_triton_attn_the_same_way():
    bench = script("bench/prefill_attention.py")
    keys = ("query", "key_cache", "value_cache", "cu_seqlens_q", "seq_lens", "block_table")
    batch = {k: k for k in (*keys, "scale", "descale")}
    got: dict = {}
    bench.triton_attn(lambda **kw: got.update(kw), batch, "out", 5, 9)
    assert (got["q"], got["k"], got["v"], got["out"]) == (
        "query",
        "key_cache",
        "value_cache",
        "out",
    )
    assert (got["max_seqlen_q"], got["max_seqlen_k"], got["causal"]) == (5, 9, True)
    assert got["k_descale"] == got["v_descale"] == "descale" and got["q_descale"] is None
    assert script("bench/prefill_crossover.py").triton_attn.__code__ is bench.triton_attn.__code__


def test_prefill_crossover_proposes_a_table_per_head_dim():
    bench = script("bench/prefill_crossover.py")
    rows = [
        {"query_len": q, "turing_ms": t, "triton_attn_ms": 1.0}
        for q, t in ((64, 1.2), (128, 0.9), (256, 1.1), (384, 0.8), (512, 0.5))
    ]
    # Faster from 384 on; 128 alone is not enough (slower again at 256).
    assert bench.crossover(rows) == 384
    assert bench.crossover([dict(r, turing_ms=2.0) for r in rows]) is None
    x = {
        "hd128.ctx0_decodes0": 256,
        "hd128.ctx0_decodes16": 384,
        "hd128.ctx2048_decodes0": 16,
        "hd128.ctx2048_decodes16": 24,
        "hd128.ctx8192_decodes0": 8,
        "hd128.ctx8192_decodes16": 24,
    }
    # Per context the larger of the two batches; a row only where it changes.
    assert bench.proposed_table(x, 128, [0, 2048, 8192], [0, 16]) == [[0, 384], [2048, 24]]
    x["hd128.ctx8192_decodes16"] = None
    assert bench.proposed_table(x, 128, [0, 2048, 8192], [0, 16]) is None
    figures = bench.case_figures("hd128.ctx0_decodes0", 128, 0, 0, 256, rows)
    assert set(figures) == {"hd128.ctx0_decodes0.crossover_query_len"}
    rows.append({"query_len": 65, "turing_ms": 3.0, "triton_attn_ms": 1.0, "ratio": 3.0})
    figures = bench.case_figures("hd128.ctx0_decodes0", 128, 0, 0, 256, rows)
    assert figures["hd128.ctx0_decodes0.ratio_at_65"]["value"] == 3.0


def test_e2e_merge_of_the_committed_runs_validates_and_flags_flat_logits(tmp_path):
    ab = script("e2e/ab.py")
    runs = [str(RAW / f) for f in ("call2_e2e1.json", "call3_e2e2.json")]
    data = ab.merge(runs, tmp_path / "e2e.json")
    assert results.validate(json.loads((tmp_path / "e2e.json").read_text())) == []
    old = committed("e2e_seed16_h200x2.json")
    for key in ("reference.prefill_total_mean_s", "overlap.prefill_change_pct", "noise_floor_pct"):
        assert data["figures"][key]["value"] == pytest.approx(old["figures"][key]["value"])
    assert data["machine"]["name"] == "2 x NVIDIA H200"
    assert data["series"]["commit"] is None  # those runs recorded none
    greedy = data["summary"]["greedy"]
    # these boots ran on dummy weights: every gap 0, the run is failed
    assert greedy["smallest_reference_gap"] == 0.0 and greedy["median_reference_gap"] == 0.0
    assert greedy["flat_logits"].startswith("median top-2 logit gap 0 < 0.01")
    assert ab.verdict(data["summary"]) == 1
    assert "penalty_hidden_pct" not in data["summary"]  # no ceiling boot in these two


def boot(arm: str, label: str, total: float, gap: float, profile: dict | None = None) -> dict:
    names = ["29k-a", "29k-b", "29k-c", "29k-d", "100k"]
    out = {
        "arm": arm,
        "label": label,
        "p2p": label == "ceiling",
        "prefill_s": {n: total / 5 for n in names},
        "decode": {"short": {"ms_per_step": 2.5}},
        "greedy": {"g18": [1, 2, 3]},
        "greedy_margin": {"g18": [gap, gap * 2, gap * 3]},
        "peak_memory_mib": {"0": 1000},
        "memory": [
            {
                "profile_activation_peak_mib": 900.0,
                "profile_cudagraph_estimate_mib": 120.0,
                "runtime_activation_peak_mib": 850.0,
                "kv_cache_mib": 5000.0,
                "weights_mib": 6000.0,
                "covered_by_profile": True,
            }
        ]
        * 2,
    }
    if profile:
        out["profile"] = profile
    return out


def test_e2e_summary_gaps_memory_and_ideal_overlap_bound(tmp_path):
    ab = script("e2e/ab.py")
    arms = [{"name": "reference"}, {"name": "overlap"}]
    # one 2048-token chunk of a 2-layer model: 4 ms of compute, 1 ms of all-reduce per rank
    kernels = [
        {"name": "ampere_fp16_gemm", "us": 3000.0, "count": 8},
        {"name": "kernel_unified_attention_2d", "us": 1000.0, "count": 2},
        {"name": "ncclDevKernel_AllReduce_Sum_f16_RING_LL", "us": 1000.0, "count": 4},
        {"name": "Memcpy HtoD (Pageable -> Device)", "us": 50.0, "count": 3},
    ]
    prof = {"tokens": 2048, "chunks": 1, "ranks": [kernels, kernels]}
    boots = [
        boot("reference", "r1", 20.0, 0.3, prof),
        boot("overlap", "r1", 19.0, 0.3),
        boot("overlap", "r2", 19.0, 0.3),
        boot("reference", "r2", 20.2, 0.3, prof),
    ]
    s = ab.summarize(boots, arms, layers=2)
    assert s["greedy"]["median_reference_gap"] == pytest.approx(0.6)
    assert s["greedy"]["smallest_reference_gap"] == pytest.approx(0.3)
    assert s["greedy"]["flat_logits"] is None and ab.verdict(s) == 0
    assert s["arms"]["overlap"]["memory"] == {
        "profile_activation_peak_mib": 900.0,
        "runtime_activation_peak_mib": 850.0,
        "kv_cache_mib": 5000.0,
        "weights_mib": 6000.0,
        "cudagraph_estimate_mib": 120.0,
        "covered_by_profile": True,
    }
    bound = s["ideal_overlap"]
    assert bound["compute_ms_per_layer_chunk"] == pytest.approx(2.0)
    assert bound["comm_ms_per_layer_chunk"] == pytest.approx(0.5)
    chunks = 4 * 15 + 49  # the four ~29k prompts and the 100k one, in 2048-token chunks
    assert bound["chunks_in_measured_prompts"] == chunks
    assert bound["ideal_saving_s"] == pytest.approx(0.5e-3 * 2 * chunks)
    assert bound["fraction_reached"]["overlap"] == pytest.approx(1.1 / (0.5e-3 * 2 * chunks))
    figs = ab.figures(s)
    assert figs["overlap.ideal_overlap_fraction_reached"]["unit"] == "fraction"
    assert figs["overlap.runtime_activation_peak_mib"]["value"] == 850.0
    doc = ab.document({"summary": s, "boots": boots}, H200X2, SERIES)
    assert results.validate(doc) == []
    flat = ab.summarize([boot("reference", "r1", 20.0, 0.001)] * 2, arms, layers=2)
    assert flat["greedy"]["flat_logits"] and ab.verdict(flat) == 1


def test_model_weights_written_at_a_trained_scale(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    models = script("e2e/models.py")
    cfg = models.config(
        "small",
        2,
        dict(
            models.SEED,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
        ),
    )
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    record = models.write_weights(d, device="cpu", log=lambda *_: None)
    from safetensors.torch import load_file

    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.1.mlp.down_proj.weight"] == "layer-001.safetensors"
    layer = load_file(str(d / "layer-001.safetensors"))
    assert layer["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)
    assert layer["model.layers.1.self_attn.k_norm.weight"].dtype == torch.float16
    assert torch.all(layer["model.layers.1.input_layernorm.weight"] == 1)
    assert float(layer["model.layers.1.mlp.up_proj.weight"].float().std()) == pytest.approx(
        0.02, rel=0.05
    )
    assert record["lm_head_std"] == pytest.approx(0.02, rel=0.05)
    again = models.write_weights(d, device="cpu", log=lambda *_: None)  # written once
    assert again == record


def test_torch_note_names_the_base_s_pin_and_the_torch_that_ran(tmp_path, monkeypatch):
    series = dict(SERIES, base="vllm==0.33.0")
    doc = results.document(
        "bench", {}, machine=H200X2, series=series, figures={}, torch_pin="2.14.0"
    )
    assert doc["torch_note"] == (
        "vLLM 0.33.0 pins torch 2.14.0; ran on the GPU machine's torch 2.11.0+cu130"
    )
    assert results.validate(doc) == []
    # On the GPU machine the pin is read from the assembled tree (no vLLM here).
    tree = tmp_path / "src"
    (tree / "requirements").mkdir(parents=True)
    (tree / "requirements" / "cuda.txt").write_text("numba\ntorch==2.14.0\ntorchaudio==2.11.0\n")
    (tree / "SERIES_COMMIT").write_text("c0ffee\n")
    monkeypatch.setenv("PYTHONPATH", str(tree))
    assert results.pinned_torch("0.33.0") == "2.14.0"
    looked_up = results.document("bench", {}, machine=H200X2, series=series, figures={})
    assert looked_up["torch_note"] == doc["torch_note"]
    (tree / "requirements" / "cuda.txt").write_text("numba\n")
    assert (
        "could not read"
        in results.document("bench", {}, machine=H200X2, series=series, figures={})["torch_note"]
    )
    # No note without a torch that ran or a base the run recorded.
    cpu = results.machine_block([], None, None, None)
    assert "torch_note" not in results.document("ci", {}, machine=cpu, series=series, figures={})
    unknown = results.unrecorded("a test")
    assert "torch_note" not in results.document(
        "bench", {}, machine=H200X2, series=unknown, figures={}
    )


def test_every_gpu_writer_carries_the_torch_note():
    """The writers of the two-GPU evidence go through results.document."""
    series = dict(SERIES, base="vllm==0.33.0")
    old = committed("bench_host_reduce_h200x2.json")
    bench = script("bench/host_reduce.py")
    docs = [bench.document(old["rank0"], old["rank1"], {}, H200X2, series)]
    e2e = committed("e2e_seed16_h200x2.json")
    docs.append(script("e2e/ab.py").document({"summary": e2e["summary"]}, H200X2, series))
    for doc in docs:
        assert doc["torch_note"].startswith("vLLM 0.33.0 ") and doc["series"]["base"]


def test_gpu_run_tests_ends_a_file_at_test_timeout(tmp_path, monkeypatch):
    run_tests = script("gpu/run_tests.py")
    tree, test, out = one_test_file(
        tmp_path, "import time\n\ndef test_slow():\n    time.sleep(60)\n"
    )
    # Whether pytest got as far as the test does not matter here: the file is
    # ended, and counted as an error, either way.
    monkeypatch.setenv("TEST_TIMEOUT", "1")
    assert run_tests.main([str(tree), str(out), test]) == 1
    data = json.loads(out.read_text())
    assert data["files"][0]["returncode"] == 124 and data["files"][0]["seconds"] < 30
    assert data["test_files"][test]["errors"] == 1


def test_e2e_worker_reads_the_memory_profile_of_the_base():
    worker_module = script("e2e/e2e_worker.py")
    mib = 2**20
    # vLLM 0.33.0's Worker: the transient peak plus the CUDA graph estimate applied
    worker = type(
        "Worker",
        (),
        {
            "peak_activation_memory": (900 + 120) * mib,
            "cudagraph_memory_estimate": 120 * mib,
            "total_consumed": 7000 * mib,
            "available_kv_cache_memory_bytes": 5000 * mib,
        },
    )()
    assert worker_module.profile_memory(worker, True) == {
        "profile_activation_peak_mib": 900.0,
        "profile_cudagraph_estimate_mib": 120.0,
        "profile_cudagraph_estimate_applied": True,
        "profile_total_consumed_mib": 7000.0,
        "kv_cache_mib": 5000.0,
    }
    assert worker_module.profile_memory(worker, False)["profile_activation_peak_mib"] == 1020.0
    assert worker_module.profile_memory(object(), True)["profile_activation_peak_mib"] is None


def test_e2e_harness_tp_reaches_the_boots_and_the_file(tmp_path, monkeypatch):
    ab = script("e2e/ab.py")
    seen: dict = {}

    def fake_boot(arm, args, label, env_extra=None):
        seen.setdefault("tp", set()).add(args.tp)
        return {"arm": arm["name"], "label": label, "p2p": False}

    monkeypatch.setattr(ab, "boot", fake_boot)
    monkeypatch.setattr(ab, "write_weights", lambda args: {"written": False})
    monkeypatch.setattr(ab, "machine", lambda: {})
    out = tmp_path / "e2e.json"
    arm = str(ROOT / "e2e" / "arms" / "reference.json")
    ab.main(["--arms", arm, "--out", str(out), "--tp", "1", "--rounds", "1", "--no-warm"])
    assert seen["tp"] == {1}
    data = json.loads(out.read_text())
    assert data["tp"] == 1 and results.validate(data) == []
    merged = ab.merge([str(out), str(out)], tmp_path / "m.json")
    assert merged["tp"] == 1
