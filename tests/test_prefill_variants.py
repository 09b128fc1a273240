"""bench/prefill_attention_variants.py and its library, without a GPU: the
shapes it lists are Turing shapes with the shipped one first, its ctypes
mirror of the kernel's params is the C++ struct, its float64 reference is
attention, the profile script's default shapes exist and its stall summary
adds up, and a sweep's results file validates."""

from __future__ import annotations

import csv
import ctypes
import gzip
import re
import shutil
import sys

import pytest
from test_results import ROOT

from serieskit import results

sys.path.insert(0, str(ROOT / "bench"))
import prefill_attention_profile as prof  # noqa: E402
import prefill_attention_static as st  # noqa: E402
import prefill_attention_variants as pv  # noqa: E402
import sm75_prefill_lib as lib75  # noqa: E402

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def kernel_tree(tmp_path_factory):
    """The kernel's files as the series leaves them, from patches/ alone."""
    return lib75.kernel_tree(tmp_path_factory.mktemp("kernel"))


@pytest.fixture(scope="module")
def built(kernel_tree, tmp_path_factory):
    """The library for sm_75 (machine code: ptxas reports every shape)."""
    out = tmp_path_factory.mktemp("lib")
    path, usage = lib75.build_library(kernel_tree, out, ["-gencode=arch=compute_75,code=sm_75"])
    return lib75.load(path), usage


@needs_nvcc
def test_shapes_are_turing_shapes_with_the_shipped_one_first(built):
    lib, usage = built
    shapes = lib75.variants(lib)
    names = [v["name"] for v in shapes]
    assert len(set(names)) == len(names), names
    by_traits = {
        traits: u for u in usage if u.arch == "75" and (traits := st.traits_of(u.function))
    }
    for hd in (64, 128, 256):
        group = [v for v in shapes if v["head_dim"] == hd]
        assert group and group[0]["shipped"], f"head dim {hd}: the shipped shape is not first"
        assert sum(v["shipped"] for v in group) == 1
    for v in shapes:
        u = by_traits[lib75.traits_key(v)]
        # Every shape fits a Turing SM at least once, or timing it says nothing.
        smem = v["dynamic_shared_bytes"]
        assert smem == 2 * 2 * v["keys_per_tile"] * v["head_dim"] * 2, v["name"]
        # The kernel's own rows per CTA, which the SM-limited runs' splits count.
        assert v["rows_per_cta"] == 16 * v["warps"] * v["row_tiles_per_warp"], v["name"]
        assert st.turing_ctas_per_sm(u.registers, 32 * v["warps"], smem) >= 1, v["name"]
        if v["shipped"]:
            assert (u.spill_stores, u.spill_loads) == (0, 0), v["name"]


@needs_nvcc
def test_params_mirror_is_the_struct_and_a_change_is_refused(built):
    lib, _ = built
    lib75.check_layout(lib)  # the real struct: passes

    class Shifted:
        def sm75v_params_layout(self, buf, n):
            layout = [ctypes.sizeof(lib75.Params) + 8] + [
                getattr(lib75.Params, f).offset for f, _ in lib75.PARAMS_FIELDS
            ]
            for i, x in enumerate(layout):
                buf[i] = x
            return len(layout)

    with pytest.raises(SystemExit, match="PagedPrefillAttentionParams changed"):
        lib75.check_layout(Shifted())


@needs_nvcc
def test_profile_defaults_are_shapes_of_the_library(built):
    lib, _ = built
    text = (ROOT / "gpu" / "profile_attention.sh").read_text()
    defaults = re.search(r"shapes=\(([^)$]*)\)", text).group(1).split()
    names = {v["name"] for v in lib75.variants(lib)}
    shipped = {v["name"] for v in lib75.variants(lib) if v["shipped"]}
    assert set(defaults) == shipped <= names


def test_stall_summary_shares_the_samples_by_reason_and_opcode(tmp_path):
    """An ncu source page as --page source --csv writes it (a kernel-name row,
    then the header), gzipped: the reasons' shares of all samples, the
    predicate dropped from the opcode, the not-issued columns not counted twice."""
    page = tmp_path / "sass_x.csv.gz"
    header = ["Address", "Source", "stall_wait", "stall_short_sb", "stall_wait (Not Issued)"]
    rows = [
        ["0x10", "HMMA.1688.F32 R80, R18, R108, R80", "10", "50", "9"],
        ["0x20", "@!P0  BRA 0x7fbf577b7f10", "20", "0", "20"],
        ["0x30", "HMMA.1688.F32 R64, R16, R172, RZ", "0", "20", ""],
    ]
    with gzip.open(page, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerows(rows)
    text = prof.stalls(page)
    assert "100 samples; by reason (% of all): short_sb 70.0, wait 30.0" in text
    assert "  HMMA    80.0 %: short_sb 70.0, wait 10.0" in text
    assert "  BRA     20.0 %: wait 20.0" in text


@pytest.mark.parametrize(
    ("eighth", "traits"),
    [
        ("", (256, 8, 1, 16, 1, 1, 1)),  # before the eighth parameter
        ("Li1ELb0E", (256, 8, 1, 16, 1, 1, 1)),  # the defaults
        ("Li2ELb0E", (256, 8, 1, 16, 1, 1, 1, "s2")),
        ("Li1ELb1E", (256, 8, 1, 16, 1, 1, 1, "lz")),
        ("Li2ELb1E", (256, 8, 1, 16, 1, 1, 1, "s2", "lz")),
        ("Lb0E", (256, 8, 1, 16, 1, 1, 1)),  # df72e25's overlapped loop, off
        ("Lb1E", (256, 8, 1, 16, 1, 1, 1, "ov")),  # and on
        # Since 2026-12-03: lazy max, lookups ahead, K and V staged together.
        ("Lb0ELb0ELb1E", (256, 8, 1, 16, 1, 1, 1, "kv")),
        ("Lb1ELb1ELb0E", (256, 8, 1, 16, 1, 1, 1, "lz", "a1")),
        ("Li1ELb1ELi1E", (256, 8, 1, 16, 1, 1, 1, "lz", "a1")),  # the same before
    ],
)
def test_traits_of_a_name_are_the_same_in_every_revision(eighth, traits):
    name = (
        "_ZN4vllm4sm7x12_GLOBAL__N_135paged_prefill_attention_sm75_kernelI"
        f"NS0_13PrefillTraitsILi256ELi8ELi1ELi16ELi1ELb1ELb1E{eighth}EEEEvNS0_6ParamsE"
    )
    assert st.traits_of(name) == traits
    shape = dict(zip(lib75.TRAITS_KEYS, traits[:7], strict=True))
    if eighth.startswith("Lb") and len(eighth) > 4:
        options = {
            "lazy_max": "lz" in traits,
            "lookup_ahead": int("a1" in traits),
            "stage_kv": "kv" in traits,
        }
        assert lib75.traits_key({**shape, **options}) == traits
    elif eighth.startswith("Li") and len(eighth) == 8:
        options = {"score_sets": int(eighth[2]), "lazy_max": eighth.endswith("Lb1E")}
        assert lib75.traits_key({**shape, **options}) == traits
        # An older sweep's results file names the ping-pong there.
        old = {"score_sets": int(eighth[2]), "ping_pong": eighth.endswith("Lb1E")}
        assert lib75.traits_key({**shape, **old}) == tuple("pp" if t == "lz" else t for t in traits)
    assert st.traits_of("_Z6othervv") is None


def test_reference_is_causal_attention_over_the_pages():
    torch = pytest.importorskip("torch")
    q_lens, ctx_lens = (5, 1, 9), (0, 20, 37)
    inp = pv.ragged_inputs(torch, q_lens, ctx_lens, 4, 2, 16, 64, device="cpu")
    out, lse = pv.reference(torch, inp, q_lens, ctx_lens)
    # Token by token, key by key through the block table: another path.
    table, kc, vc = inp["block_table"], inp["key_cache"], inp["value_cache"]
    start = 0
    for i, (ql, ctx) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        for t in range(ql):
            keys = range(ctx + t + 1)
            k = torch.stack([kc[table[i, j // 16], j % 16] for j in keys]).double()
            v = torch.stack([vc[table[i, j // 16], j % 16] for j in keys]).double()
            for h in range(4):
                sc = k[:, h // 2] @ inp["query"][start + t, h].double() * inp["scale"]
                p = torch.softmax(sc, dim=0)
                torch.testing.assert_close(out[start + t, h], p @ v[:, h // 2])
                torch.testing.assert_close(lse[h, start + t], torch.logsumexp(sc, dim=0))
        start += ql


def test_sweep_document_validates():
    body = {
        "what": "x",
        "sm_count": 132,
        "mma_m16n8k8_ceiling": {"tflops": 465.0},
        "mma_microbench": [
            {"warps_per_sm": 8, "chains_per_warp": 4, "ldmatrix_in_flight": 1, "tflops": 200.0}
        ],
        "variants": [],
        "rows": [
            {
                "variant": "hd128.w4m2k16c2",
                "head_dim": 128,
                "query_len": 2048,
                "context_len": 32768,
                "median_ms": 2.0,
                "fraction_of_mma_ceiling": 0.45,
            }
        ],
    }
    doc = results.document(
        "bench",
        body,
        machine=results.machine_block(["NVIDIA H200"], "580", "2.11.0", "13.0"),
        series=results.unrecorded("test"),
        figures=pv.figures_gpu(body),
    )
    assert results.validate(doc) == []
    assert doc["figures"]["hd128.w4m2k16c2.ctx32768.fraction_of_ceiling"]["value"] == 0.45
    assert "mma.w8c4l1_tflops" in doc["figures"]


def test_machine_code_comparison_names_each_function():
    import same_machine_code as smc

    base = {"a": [("", "HMMA", "R0")], "b": [("", "FADD", "R1")], "c": [("", "BAR", "")]}
    head = {"a": [("", "HMMA", "R0")], "b": [("", "FADD", "R2")]}
    assert smc.compare(base, head) == [
        ("a", "same"),
        ("b", "differs (1 of 1 instructions)"),
        ("c", "gone"),
    ]
    # The anonymous namespace's hash (of the file) is not part of the name.
    name = "_ZN4vllm4sm7x64_GLOBAL__N__4f927aa2_31_paged_prefill_attention_sm75_cu_75ccd24141x"
    assert smc.ANONYMOUS.sub("", name) == "_ZN4vllm4sm7x41x"


def test_the_cycle_model_puts_the_sweep_beside_each_shape():
    """bench/turing_cycle_model.py --variants --sweep: the measured column is
    the sweep's fraction at its longest context, '-' for a shape it lacks."""
    import turing_cycle_model as tcm

    measured = tcm.sweep_fractions(ROOT / "results" / "bench_prefill_variants_033_h200.json")
    shapes = tcm.load_variants(ROOT / "results" / "sm75_static_prefill_variants.json")
    lines = tcm.variants_table(shapes, measured)
    assert lines[0].endswith("H200 measured |") and len(lines) == len(shapes) + 2
    row = next(line for line in lines if line.startswith("| hd128.w8m1k64c1 |"))
    assert row.endswith(f" {measured['hd128.w8m1k64c1']:.1%} |")
    assert tcm.variants_table(shapes, {})[2].endswith(" - |")


def test_the_runs_of_a_case_are_timed_in_interleaved_rounds():
    # Identical launches timed one after the other in a sweep differed by up
    # to 4.6 % (results/bench_prefill_variants_034_h100_rowsums_2.json, the
    # paged and previous_rule rows of one split): a drift of the clocks over
    # a run lands between shapes timed in blocks, and on each alike in rounds.
    import statistics

    from timing import in_rounds

    clock = iter(range(10_000))
    order: list[str] = []

    def timer(name: str):
        def one() -> float:
            order.append(name)
            return 1.0 + next(clock) / 1000  # the GPU slows down steadily

        return one

    samples = in_rounds([timer("a"), timer("b")], reps=40, rounds=4)
    assert [len(s) for s in samples] == [40, 40]
    assert order[:20] == ["a"] * 10 + ["b"] * 10 and order[20] == "a"
    a, b = (statistics.median(s) for s in samples)
    assert abs(a - b) / a < 0.01  # the same launch: the same median, within 1 %
    blocks = [[1.0 + (i + 40 * k) / 1000 for i in range(40)] for k in range(2)]
    x, y = (statistics.median(s) for s in blocks)
    assert (y - x) / x > 0.03  # timed in blocks, the drift alone makes 3 %
