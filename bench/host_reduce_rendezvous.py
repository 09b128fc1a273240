# SPDX-License-Identifier: Apache-2.0
"""Is the copy-engine mode's per-call host rendezvous needed? A measurement.

With kernel_config.host_reduce.copy_engine_host_rendezvous, the copy-engine
mode of the host all-reduce waits, before it enqueues a call, until the
peer's host has reached the same call (a word per rank in the shared
segment). It is off by default. The slots do not depend on it: stream order
and the per-piece flags order their reuse (tests/distributed/
test_host_reduce.py::test_copy_engine_without_rendezvous checks the results
with and without it), and a dead peer no longer depends on it either: a
watchdog thread ends the GPU-side waits after timeout_s
(test_copy_engine_gpu_waits_time_out). What it costs is host time: each call
holds the faster host until the slower one arrives, so the work it would
enqueue next (the other half's GEMMs in the TP prefill overlap) starts later.

On two GPUs with NCCL_P2P_DISABLE=1, this compares the same channel with the
rendezvous on and off (the default), per payload size:

- back to back: GPU time per call (events) and host time per call;
- skewed hosts: rank 1 busy-waits `--skew-us` on the host before each call,
  as a slower host would; rank 0's host time per call and GPU time per call;
- beside compute: rank 0 enqueues, per step, an all-reduce on a side stream
  and a GEMM on its main stream (the overlap's pattern), rank 1 the same
  after its skew; time per step on rank 0.

Results bit-identical to NCCL are checked for both channels first. The
numbers say what the rendezvous costs where it is turned on.

    NCCL_P2P_DISABLE=1 PYTHONPATH=<patched tree with vllm/_sm7x_C*.so> \\
        python3 bench/host_reduce_rendezvous.py --out results/rendezvous_h200x2.json
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402

try:  # the GPU machine's; document() needs none of it
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    torch = dist = mp = None

SIZES = [327680, 1048576, 4194304, 8192000, 20971520]
CE_MAX = 20971520
MAX_BYTES = 262144


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spin_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def channel_config(rendezvous: bool) -> dict:
    """kernel_config.host_reduce of a channel (vLLM's HostReduceConfig)."""
    return {
        "enabled": True,
        "max_bytes": MAX_BYTES,
        "copy_engine_max_bytes": CE_MAX,
        "timeout_s": 60.0,
        "copy_engine_host_rendezvous": rendezvous,
    }


def _channels(rank: int, cpu_group):
    from vllm.config.kernel import HostReduceConfig
    from vllm.distributed.device_communicators.host_all_reduce import HostAllReduce

    channels = {
        name: HostAllReduce(cpu_group, rank, HostReduceConfig(**channel_config(on)))
        for name, on in (("rendezvous", True), ("no_rendezvous", False))
    }
    for name, hr in channels.items():
        assert not hr.disabled, (name, hr.disabled_reason)
        assert hr.copy_engine_error is None, (name, hr.copy_engine_error)
    return channels


def _check_bits(rank: int, channels: dict) -> None:
    torch.manual_seed(rank)
    for nbytes in SIZES:
        x = torch.randn(nbytes // 2, device="cuda").half()
        ref = x.clone()
        dist.all_reduce(ref)
        for name, hr in channels.items():
            out = hr.all_reduce(x)
            assert out is not None, (name, nbytes)
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), (name, nbytes)


def _measure(rank, cpu_group, hr, x, calls, skew_us, gemm=None) -> dict:
    """GPU ms per call (or per step with a GEMM) and host ms per call on this
    rank; median over trials."""
    side = torch.cuda.Stream()
    gpu, host = [], []
    for trial in range(7 + 2):
        torch.cuda.synchronize()
        dist.barrier(group=cpu_group)
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        side.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        for _ in range(calls):
            if rank == 1 and skew_us:
                _spin_us(skew_us)
            if gemm is None:
                hr.all_reduce(x)
            else:
                with torch.cuda.stream(side):
                    hr.all_reduce(x)
                torch.mm(*gemm)
        t1 = time.perf_counter()
        torch.cuda.current_stream().wait_stream(side)
        e1.record()
        e1.synchronize()
        if trial >= 2:  # warm-up trials
            gpu.append(e0.elapsed_time(e1) / calls)
            host.append((t1 - t0) * 1e3 / calls)
    return {
        "gpu_ms_per_call": statistics.median(gpu),
        "host_ms_per_call": statistics.median(host),
        "gpu_ms_all": gpu,
        "host_ms_all": host,
    }


def _worker(rank: int, port: int, skew_us: float, calls: int, queue) -> None:
    torch.accelerator.set_device_index(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_group = dist.new_group(backend="gloo")
    channels = _channels(rank, cpu_group)
    _check_bits(rank, channels)
    a = torch.randn(4096, 4096, device="cuda").half()
    b = torch.randn(4096, 4096, device="cuda").half()
    rows = []
    for nbytes in SIZES:
        x = torch.randn(nbytes // 2, device="cuda").half()
        row: dict = {"bytes": nbytes}
        for case, skew, gemm in (
            ("back_to_back", 0.0, None),
            ("skewed_hosts", skew_us, None),
            ("beside_gemm", skew_us, (a, b)),
        ):
            for name, hr in channels.items():
                row[f"{case}.{name}"] = _measure(rank, cpu_group, hr, x, calls, skew, gemm)
        rows.append(row)
        if rank == 0:
            print(
                f"{nbytes:>9} B "
                + " | ".join(
                    f"{case}: on {row[f'{case}.rendezvous']['gpu_ms_per_call']:.4f} / "
                    f"off {row[f'{case}.no_rendezvous']['gpu_ms_per_call']:.4f} ms "
                    f"(host {row[f'{case}.rendezvous']['host_ms_per_call']:.4f} / "
                    f"{row[f'{case}.no_rendezvous']['host_ms_per_call']:.4f})"
                    for case in ("back_to_back", "skewed_hosts", "beside_gemm")
                ),
                flush=True,
            )
    queue.put((rank, rows))
    torch.cuda.synchronize()
    dist.barrier(group=cpu_group)
    for hr in channels.values():
        hr.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--skew-us", type=float, default=200.0)
    p.add_argument("--calls", type=int, default=50)
    args = p.parse_args()
    assert torch.accelerator.device_count() >= 2, "needs two GPUs"
    os.environ["NCCL_P2P_DISABLE"] = "1"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, port, args.skew_us, args.calls, queue)) for r in (0, 1)
    ]
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
    run = {"gpus": smi, "calls": args.calls, "skew_us": args.skew_us}
    doc = document(by_rank[0], by_rank[1], run, results.machine(), results.current_series(ROOT))
    results.write(Path(args.out), doc)


CASES = ("back_to_back", "skewed_hosts", "beside_gemm")


def figures(rank0: list[dict]) -> dict:
    """Per payload and case, rank 0's GPU and host time per call with the
    rendezvous on against off (%)."""
    out = {}
    for i, row in enumerate(rank0):
        for case in CASES:
            on = row[f"{case}.rendezvous"]
            off = row[f"{case}.no_rendezvous"]
            for what in ("gpu_ms_per_call", "host_ms_per_call"):
                out[f"{row['bytes']}B.{case}.{what}.rendezvous_cost_pct"] = results.figure(
                    100.0 * (on[what] / off[what] - 1.0),
                    "%",
                    f"{row['bytes']:,} B, {case}, rank 0 {what}: rendezvous on against off",
                    f"rank0[{i}]['{case}.rendezvous'].{what}",
                )
    return out


def document(rank0: list[dict], rank1: list[dict], run: dict, machine: dict, series: dict) -> dict:
    """The results file (results/README.md) of one run: both ranks' rows and
    rank 0's figures."""
    body = {
        "what": "copy-engine mode of the host all-reduce: per-call host rendezvous on against off",
        **run,
        "method": f"{run.get('calls')} calls per trial, median of 7 trials after 2; rank 1 "
        f"busy-waits {run.get('skew_us')} us on the host before each call in skewed_hosts "
        "and beside_gemm; beside_gemm: all-reduce on a side stream, a 4096^3 fp16 GEMM on "
        "the main stream, per step",
        "rank0": rank0,
        "rank1": rank1,
    }
    return results.document("bench", body, machine=machine, series=series, figures=figures(rank0))


if __name__ == "__main__":
    main()
