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
import datetime
import json
import os
import socket
import statistics
import subprocess
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [262144, 1048576, 4194304, 8192000, 20971520]
CE_MAX = 20971520
INTERFERENCE_BYTES = 8192000


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
            k + "_GBps": nbytes * reps / (ev[k][0].elapsed_time(ev[k][1]) * 1e-3) / 1e9
            for k in on
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
    from vllm.distributed.device_communicators.host_all_reduce import HostAllReduce

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    cpu_group = dist.new_group(backend="gloo")
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    # Kernel mode for every size; copy-engine mode for every size (its
    # max_bytes is the smallest allowed, so the copy engines serve it all).
    hr_kernel = HostAllReduce(
        cpu_group,
        rank,
        SimpleNamespace(enabled=True, max_bytes=CE_MAX, copy_engine_max_bytes=0, timeout_s=30.0),
    )
    hr_ce = HostAllReduce(
        cpu_group,
        rank,
        SimpleNamespace(enabled=True, max_bytes=16, copy_engine_max_bytes=CE_MAX, timeout_s=30.0),
    )
    assert not hr_kernel.disabled, hr_kernel.disabled_reason
    assert not hr_ce.disabled, hr_ce.disabled_reason
    result: dict = {}
    t0 = time.time()
    sizes: list = []
    _allreduce_times(rank, cpu_group, hr_kernel, hr_ce, sizes)
    result["allreduce"] = sizes
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
        for impl in ("nccl", "kernel_mode", "copy_engine_mode"):
            entry[impl + "_ms"] = row[impl]["median_ms"]
            entry[impl + "_algbw_GBps"] = row[impl]["algbw_GBps"]
            entry[impl + "_fraction_of_floor"] = floor_ms / row[impl]["median_ms"]
        rows.append(entry)
    return {"floor_bandwidth_GBps": floor_bw, "per_size": rows}


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
    procs = [
        ctx.Process(target=_worker, args=(r, port, args.out, queue)) for r in (0, 1)
    ]
    for pr in procs:
        pr.start()
    results: dict = {}
    while len(results) < len(procs):
        try:
            rank, res = queue.get(timeout=5)
            results[rank] = res
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
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,pci.bus_id",
                "--format=csv,noheader",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()
    )
    nccl = torch.cuda.nccl.version()
    doc = {
        "what": "two-rank fp16 all-reduce: host all-reduce vs NCCL, P2P off",
        "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "gpus": smi,
        "gpu_name": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")},
        "method": "time per call = median over 9 trials of N back-to-back calls "
        "(events on the caller's stream, both ranks released together) after 5 "
        "warm-up calls; NCCL in place, the host all-reduce out of place; "
        "interference: loop of 30 ops on the default stream, all-reduces of "
        "8,192,000 B enqueued after it on a side stream (1.3x the loop's time), "
        "median of 3; copies: 64 MiB pinned copies, 10 per stream",
        "rank0": results[0],
        "rank1": results[1],
        "summary": _summary(results[0]),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    s = doc["summary"]
    print(f"floor bandwidth {s['floor_bandwidth_GBps']:.1f} GB/s")
    for row in s["per_size"]:
        print(
            f"{row['bytes']:>9} B floor {row['floor_ms']:.4f} ms | "
            + " | ".join(
                f"{i} {row[i + '_ms']:.4f} ms {row[i + '_algbw_GBps']:.1f} GB/s "
                f"{100 * row[i + '_fraction_of_floor']:.0f}%"
                for i in ("nccl", "kernel_mode", "copy_engine_mode")
            )
        )


if __name__ == "__main__":
    main()
