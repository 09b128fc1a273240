# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the two-rank host all-reduce (kernel and copy-engine modes)
against NCCL, with peer access off, on a GPU machine with two GPUs.

    NCCL_P2P_DISABLE=1 PYTHONPATH=<patched tree with vllm/_sm7x_C*.so> \
        python3 bench/host_reduce.py --out bench.json

Measures, in one run:
- per payload (256 KiB, 1 MiB, 4 MiB, 8,192,000 B, 20 MiB): time per call of
  back-to-back fp16 all-reduces (median of trials after warm-up) and algorithm
  bandwidth (payload / time) of the copy-engine mode, the kernel mode and NCCL;
- pinned device-to-host and host-to-device copy bandwidth of one stream on one
  GPU alone, and with both directions on both GPUs at once (as the all-reduce
  runs them); the floor of a pipelined two-rank host all-reduce is the payload
  over the slower direction's bandwidth under that load;
- interference: time of a GEMM loop and of a memory-bound loop running beside
  each implementation (8,192,000 B calls back to back on a side stream),
  against running alone.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serieskit import results  # noqa: E402

try:  # the GPU machine's; document() and the figures need none of it
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    torch = dist = mp = None

SIZES = [262144, 1048576, 4194304, 8192000, 20971520]
CE_MAX = 20971520
INTERFERENCE_BYTES = 8192000
# csrc/sm7x/host_reduce.cu: a copy-engine call moves min(16, ceil(bytes / 256
# KiB)) pieces, each a D2H copy, cuStreamWriteValue32, cuStreamWaitValue32
# and an H2D copy; around them 3 event records, 5 stream waits on events and
# the add kernel's launch.
CE_MAX_PIECES, CE_MIN_PIECE = 16, 256 * 1024
CE_CALLS_PER_PIECE, CE_FIXED_CALLS = 4, 9
IMPLS = ("nccl", "kernel_mode", "copy_engine_mode")
# parallel_config.host_all_reduce_config of the two channels (vLLM's
# HostAllReduceConfig, every other field at its default): the kernel mode
# serves every size (its limit raised to the largest), the copy-engine mode
# every size (the kernel mode's limit at its smallest, 16 B).
CHANNELS = {
    "kernel_mode": {
        "max_bytes": CE_MAX,
        "copy_engine_max_bytes": 0,
        "timeout_s": 30.0,
    },
    "copy_engine_mode": {
        "max_bytes": 16,
        "copy_engine_max_bytes": CE_MAX,
        "timeout_s": 30.0,
    },
}


def ce_pieces(nbytes: int) -> int:
    return min(CE_MAX_PIECES, max(1, -(-nbytes // CE_MIN_PIECE)))


def ce_driver_calls(nbytes: int) -> int:
    return CE_CALLS_PER_PIECE * ce_pieces(nbytes) + CE_FIXED_CALLS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync_ranks(cpu_group) -> None:
    torch.cuda.synchronize()
    dist.barrier(group=cpu_group)


def _time_calls(fn, cpu_group, iters: int, trials: int, warmup: int) -> list[float]:
    """Per-call ms of `iters` back-to-back calls, one value per trial."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(trials):
        _sync_ranks(cpu_group)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / iters)
    return out


def _stats(values: list[float]) -> dict:
    return {
        "median_ms": statistics.median(values),
        "min_ms": min(values),
        "max_ms": max(values),
        "trials": len(values),
    }


def _allreduce_times(rank, cpu_group, hr_kernel, hr_ce, results):
    torch.manual_seed(rank)
    for nbytes in SIZES:
        x = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
        row: dict = {"bytes": nbytes}
        y = x.clone()
        impls = {
            # In place, as NCCL is timed elsewhere (values overflow; the time
            # does not depend on them).
            "nccl": lambda y=y: dist.all_reduce(y),
            "kernel_mode": lambda x=x: hr_kernel.all_reduce(x),
            "copy_engine_mode": lambda x=x: hr_ce.all_reduce(x),
        }
        # Check that each implementation serves the call.
        assert hr_kernel.rejection_reason(x) is None
        assert hr_ce.rejection_reason(x) is None
        ref = x.clone()
        dist.all_reduce(ref)
        for name in ("kernel_mode", "copy_engine_mode"):
            out = impls[name]()
            torch.cuda.synchronize()
            row[name + "_bit_identical_to_nccl"] = torch.equal(
                out.view(torch.int16), ref.view(torch.int16)
            )
        iters = 20 if nbytes >= 4194304 else 50
        for name, fn in impls.items():
            s = _stats(_time_calls(fn, cpu_group, iters, trials=9, warmup=5))
            s["algbw_GBps"] = nbytes / (s["median_ms"] * 1e-3) / 1e9
            row[name] = s
        results.append(row)
        if rank == 0:
            print(
                f"{nbytes:>9} B  nccl {row['nccl']['median_ms']:.4f} ms  "
                f"kernel {row['kernel_mode']['median_ms']:.4f} ms  "
                f"copy-engine {row['copy_engine_mode']['median_ms']:.4f} ms",
                flush=True,
            )


def _host_issue(rank, cpu_group, hr_kernel, hr_ce, calls: int = 30) -> list[dict]:
    """Host time of one call (ms) while the GPU is idle, both ranks released
    together: how long the host spends issuing a call (in the copy-engine
    mode its pieces' driver calls, after meeting the peer's host), and the
    host time per call of back-to-back calls (the host runs ahead of the GPU
    unless issuing, or a full queue, holds it)."""
    rows = []
    for nbytes in SIZES:
        x = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
        y = x.clone()
        row: dict = {
            "bytes": nbytes,
            "copy_engine_pieces": ce_pieces(nbytes),
            "copy_engine_driver_calls": ce_driver_calls(nbytes),
        }
        impls = {
            "nccl": lambda y=y: dist.all_reduce(y),
            "kernel_mode": lambda x=x: hr_kernel.all_reduce(x),
            "copy_engine_mode": lambda x=x: hr_ce.all_reduce(x),
        }
        for name, fn in impls.items():
            for _ in range(3):
                fn()
            one = []
            for _ in range(calls):
                _sync_ranks(cpu_group)
                t = time.perf_counter()
                fn()
                one.append((time.perf_counter() - t) * 1e3)
            iters = 20 if nbytes >= 4194304 else 50
            _sync_ranks(cpu_group)
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            back_to_back = (time.perf_counter() - t) * 1e3 / iters
            torch.cuda.synchronize()
            row[name] = {
                "one_call_median_ms": statistics.median(one),
                "one_call_min_ms": min(one),
                "calls": calls,
                "back_to_back_host_ms_per_call": back_to_back,
            }
        rows.append(row)
        if rank == 0:
            print(
                f"{nbytes:>9} B host issue: "
                + ", ".join(f"{i} {row[i]['one_call_median_ms']:.4f} ms" for i in impls),
                flush=True,
            )
    return rows


def _copy_bw(rank, cpu_group) -> dict:
    nbytes = 64 * 1024 * 1024
    dev_src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dev_dst = torch.empty_like(dev_src)
    host_a = torch.empty(nbytes // 2, dtype=torch.float16, pin_memory=True)
    host_b = torch.empty(nbytes // 2, dtype=torch.float16, pin_memory=True)
    host_b.copy_(dev_src.cpu())
    # direction -> (stream, destination, source)
    copies = {
        "d2h": (torch.cuda.Stream(), host_a, dev_src),
        "h2d": (torch.cuda.Stream(), dev_dst, host_b),
    }
    reps = 10

    def run(d2h: bool, h2d: bool) -> dict:
        on = [k for k, want in (("d2h", d2h), ("h2d", h2d)) if want]
        for _ in range(2):  # warm-up
            for k in on:
                stream, dst, src = copies[k]
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
        _sync_ranks(cpu_group)
        ev = {}
        for k in on:  # both directions queued before either is waited for
            stream, dst, src = copies[k]
            ev[k] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(True))
            ev[k][0].record(stream)
            with torch.cuda.stream(stream):
                for _ in range(reps):
                    dst.copy_(src, non_blocking=True)
            ev[k][1].record(stream)
        torch.cuda.synchronize()
        return {
            k + "_GBps": nbytes * reps / (ev[k][0].elapsed_time(ev[k][1]) * 1e-3) / 1e9 for k in on
        }

    res: dict = {"bytes_per_copy": nbytes}
    # Alone: one direction, one GPU (rank 0), the other idle.
    for name, d2h, h2d in (("d2h_alone", True, False), ("h2d_alone", False, True)):
        vals = []
        for _ in range(3):
            r = run(d2h and rank == 0, h2d and rank == 0)
            vals.append(r.get("d2h_GBps" if d2h else "h2d_GBps", 0.0))
        res[name + "_GBps"] = statistics.median(vals) if rank == 0 else None
    # Both directions on one GPU.
    vals_d, vals_h = [], []
    for _ in range(3):
        r = run(rank == 0, rank == 0)
        if rank == 0:
            vals_d.append(r["d2h_GBps"])
            vals_h.append(r["h2d_GBps"])
    if rank == 0:
        res["both_directions_one_gpu"] = {
            "d2h_GBps": statistics.median(vals_d),
            "h2d_GBps": statistics.median(vals_h),
        }
    # Both directions on both GPUs at once.
    vals_d, vals_h = [], []
    for _ in range(5):
        r = run(True, True)
        vals_d.append(r["d2h_GBps"])
        vals_h.append(r["h2d_GBps"])
    res["both_directions_both_gpus"] = {
        "d2h_GBps": statistics.median(vals_d),
        "h2d_GBps": statistics.median(vals_h),
    }
    return res


def _interference(rank, cpu_group, hr_kernel, hr_ce, ar_ms: dict) -> dict:
    torch.manual_seed(100 + rank)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    m_src = torch.randn(512 * 1024 * 1024, device="cuda", dtype=torch.float16)
    m_dst = torch.empty_like(m_src)
    x = torch.randn(INTERFERENCE_BYTES // 2, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    loops = {
        "gemm": lambda: torch.mm(a, b),
        "memory_bound": lambda: m_dst.copy_(m_src),
    }
    impls = {
        "none": None,
        "nccl": lambda: dist.all_reduce(x),
        "kernel_mode": lambda: hr_kernel.all_reduce(x),
        "copy_engine_mode": lambda: hr_ce.all_reduce(x),
    }
    n_ops = 30
    res: dict = {"allreduce_bytes": INTERFERENCE_BYTES, "ops_per_loop": n_ops}
    for lname, op in loops.items():
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        # Time of one op alone, to size the all-reduce stream beside it.
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record()
        for _ in range(5):
            op()
        e1.record()
        e1.synchronize()
        # Both ranks must make the same number of calls: use rank 0's times.
        shared = [e0.elapsed_time(e1) / 5, ar_ms]
        dist.broadcast_object_list(shared, src=0, group=cpu_group)
        op_ms, ar_ms0 = shared
        res[lname + "_op_ms"] = op_ms
        for iname, ar in impls.items():
            # Enough all-reduces to keep the side stream busy for the whole
            # loop (1.3x its time alone).
            n_ar = 0 if ar is None else int(1.3 * n_ops * op_ms / ar_ms0[iname]) + 1
            vals = []
            for _ in range(3):
                _sync_ranks(cpu_group)
                side.wait_stream(torch.cuda.current_stream())
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(n_ops):
                    op()
                end.record()
                if ar is not None:
                    with torch.cuda.stream(side):
                        for _ in range(n_ar):
                            ar()
                torch.cuda.synchronize()
                vals.append(start.elapsed_time(end))
            res.setdefault(lname, {})[iname] = {
                "loop_ms_median": statistics.median(vals),
                "loop_ms_all": vals,
                "allreduces_beside_loop": n_ar,
            }
        alone = res[lname]["none"]["loop_ms_median"]
        for iname in ("nccl", "kernel_mode", "copy_engine_mode"):
            d = res[lname][iname]
            d["slowdown_pct"] = (d["loop_ms_median"] / alone - 1) * 100
        if rank == 0:
            print(
                f"{lname}: alone {alone:.2f} ms, "
                + ", ".join(
                    f"{i} {res[lname][i]['slowdown_pct']:+.1f}%"
                    for i in ("nccl", "kernel_mode", "copy_engine_mode")
                ),
                flush=True,
            )
    return res


def _worker(rank: int, port: int, out_path: str, queue) -> None:
    from vllm.config.parallel import HostAllReduceConfig
    from vllm.distributed.device_communicators.host_all_reduce import HostAllReduce

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_group = dist.new_group(backend="gloo")
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    # peer_access=False in place of vLLM's P2P check: the GPUs stand in for
    # a pair without peer access (NCCL_P2P_DISABLE=1 does the same for NCCL).
    hr_kernel = HostAllReduce(
        cpu_group, rank, HostAllReduceConfig(**CHANNELS["kernel_mode"]), peer_access=False
    )
    hr_ce = HostAllReduce(
        cpu_group, rank, HostAllReduceConfig(**CHANNELS["copy_engine_mode"]), peer_access=False
    )
    assert not hr_kernel.disabled, hr_kernel.disabled_reason
    assert not hr_ce.disabled, hr_ce.disabled_reason
    # Where the copy-engine mode cannot run here, that channel would decline
    # every size above 16 B and the column would time nothing.
    assert hr_ce.copy_engine_error is None, hr_ce.copy_engine_error
    result: dict = {}
    t0 = time.time()
    sizes: list = []
    _allreduce_times(rank, cpu_group, hr_kernel, hr_ce, sizes)
    result["allreduce"] = sizes
    result["host_issue"] = _host_issue(rank, cpu_group, hr_kernel, hr_ce)
    result["copy_bandwidth"] = _copy_bw(rank, cpu_group)
    at = next(r for r in sizes if r["bytes"] == INTERFERENCE_BYTES)
    ar_ms = {i: at[i]["median_ms"] for i in ("nccl", "kernel_mode", "copy_engine_mode")}
    result["interference"] = _interference(rank, cpu_group, hr_kernel, hr_ce, ar_ms)
    result["seconds"] = time.time() - t0
    queue.put((rank, result))
    _sync_ranks(cpu_group)
    hr_kernel.close()
    hr_ce.close()
    dist.destroy_process_group()


def _summary(r0: dict) -> dict:
    bw = r0["copy_bandwidth"]["both_directions_both_gpus"]
    floor_bw = min(bw["d2h_GBps"], bw["h2d_GBps"])
    rows = []
    for row in r0["allreduce"]:
        floor_ms = row["bytes"] / (floor_bw * 1e9) * 1e3
        entry = {"bytes": row["bytes"], "floor_ms": floor_ms}
        for impl in IMPLS:
            entry[impl + "_ms"] = row[impl]["median_ms"]
            entry[impl + "_algbw_GBps"] = row[impl]["algbw_GBps"]
            entry[impl + "_fraction_of_floor"] = floor_ms / row[impl]["median_ms"]
        issue = {h["bytes"]: h for h in r0.get("host_issue", [])}.get(row["bytes"])
        if issue:
            entry.update(_host_bound(issue, entry))
        rows.append(entry)
    return {"floor_bandwidth_GBps": floor_bw, "per_size": rows}


def _host_bound(issue: dict, entry: dict) -> dict:
    """The copy-engine mode's host side against its time per call: the host
    time of one call, per driver call (above the kernel mode's one launch),
    and as a fraction of the time per call back to back (near 1 or above:
    issuing bounds the mode)."""
    ce, kernel = issue["copy_engine_mode"], issue["kernel_mode"]
    calls = issue["copy_engine_driver_calls"]
    host_ms = ce["one_call_median_ms"]
    return {
        "copy_engine_pieces": issue["copy_engine_pieces"],
        "copy_engine_driver_calls": calls,
        "copy_engine_host_issue_ms": host_ms,
        "copy_engine_host_us_per_driver_call": 1e3
        * (host_ms - kernel["one_call_median_ms"])
        / (calls - 1),
        "copy_engine_host_back_to_back_ms": ce["back_to_back_host_ms_per_call"],
        "copy_engine_host_fraction_of_call": host_ms / entry["copy_engine_mode_ms"],
        "kernel_mode_host_issue_ms": kernel["one_call_median_ms"],
        "nccl_host_issue_ms": issue["nccl"]["one_call_median_ms"],
    }


ROOT = Path(__file__).resolve().parents[1]
METHOD = (
    "time per call = median over 9 trials of N back-to-back calls (events on the caller's "
    "stream, both ranks released together) after 5 warm-up calls; NCCL in place, the host "
    "all-reduce out of place; host issue: host time of one call after both ranks were "
    "synchronized and released together (median of 30), and host time per call of N "
    "back-to-back calls; interference: loop of 30 ops on the default stream, all-reduces "
    "of 8,192,000 B enqueued after it on a side stream (1.3x the loop's time), median of "
    "3; copies: 64 MiB pinned copies, 10 per stream"
)


def figures(rank0: dict, summary: dict) -> dict:
    """The headline figures: pinned copy bandwidth under the all-reduce's
    load, and per payload the time per call of each implementation, the
    floor, and the copy-engine mode's host side."""
    both = rank0["copy_bandwidth"]["both_directions_both_gpus"]
    out = {
        f"copy_{d}_both_GBps": results.figure(
            both[f"{d}_GBps"],
            "GB/s",
            f"pinned {name} copies, both directions on both GPUs",
            f"rank0.copy_bandwidth.both_directions_both_gpus.{d}_GBps",
        )
        for d, name in (("h2d", "host-to-device"), ("d2h", "device-to-host"))
    }
    names = {"nccl": "NCCL", "kernel_mode": "kernel mode", "copy_engine_mode": "copy-engine mode"}
    for i, row in enumerate(summary["per_size"]):
        b = row["bytes"]
        where = f"summary.per_size[{i}]"

        def add(key: str, unit: str, what: str, b=b, where=where, row=row) -> None:
            if key in row:
                out[f"allreduce_{b}B.{key}"] = results.figure(
                    row[key], unit, f"two-rank fp16 all-reduce of {b:,} B, {what}", f"{where}.{key}"
                )

        for impl, name in names.items():
            add(f"{impl}_ms", "ms", f"{name}, time per call")
        add("floor_ms", "ms", "pipelined host all-reduce floor")
        add("copy_engine_host_issue_ms", "ms", "copy-engine mode, host time of one call")
        add(
            "copy_engine_host_us_per_driver_call",
            "us",
            "copy-engine mode, host time per driver call (above the kernel mode's)",
        )
        add(
            "copy_engine_host_fraction_of_call",
            "fraction",
            "copy-engine mode, host time of one call over its time per call",
        )
    return out


def document(rank0: dict, rank1: dict, run: dict, machine: dict, series: dict) -> dict:
    """The results file (results/README.md) of one run: both ranks' raw
    results, rank 0's summary and its figures."""
    summary = _summary(rank0)
    body = {
        "what": "two-rank fp16 all-reduce: host all-reduce vs NCCL, P2P off",
        **run,
        "method": METHOD,
        "rank0": rank0,
        "rank1": rank1,
        "summary": summary,
    }
    return results.document(
        "bench", body, machine=machine, series=series, figures=figures(rank0, summary)
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    if os.environ.get("NCCL_P2P_DISABLE") != "1":
        print("warning: NCCL_P2P_DISABLE is not 1; setting it for the workers")
        os.environ["NCCL_P2P_DISABLE"] = "1"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, args.out, queue)) for r in (0, 1)]
    for pr in procs:
        pr.start()
    by_rank: dict = {}
    while len(by_rank) < len(procs):
        try:
            rank, res = queue.get(timeout=5)
            by_rank[rank] = res
        except Exception:
            dead = [pr.exitcode for pr in procs if pr.exitcode not in (None, 0)]
            if dead:
                for pr in procs:
                    pr.kill()
                raise SystemExit(f"a worker failed (exit codes {dead})") from None
    for pr in procs:
        pr.join()
    smi = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"],
            check=False,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()
    )
    nccl = torch.cuda.nccl.version()
    run = {
        "gpus": smi,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")},
        "channels": CHANNELS,
    }
    doc = document(by_rank[0], by_rank[1], run, results.machine(), results.current_series(ROOT))
    results.write(Path(args.out), doc)
    s = doc["summary"]
    print(f"floor bandwidth {s['floor_bandwidth_GBps']:.1f} GB/s")
    for row in s["per_size"]:
        print(
            f"{row['bytes']:>9} B floor {row['floor_ms']:.4f} ms | "
            + " | ".join(
                f"{i} {row[i + '_ms']:.4f} ms {row[i + '_algbw_GBps']:.1f} GB/s "
                f"{100 * row[i + '_fraction_of_floor']:.0f}%"
                for i in IMPLS
            )
        )
        if "copy_engine_host_issue_ms" in row:
            print(
                f"{'':>9}   copy-engine host issue {row['copy_engine_host_issue_ms']:.4f} ms "
                f"({row['copy_engine_driver_calls']} driver calls, "
                f"{row['copy_engine_host_us_per_driver_call']:.2f} us each above the kernel "
                f"mode), {100 * row['copy_engine_host_fraction_of_call']:.0f}% of its time "
                "per call"
            )


if __name__ == "__main__":
    main()
