#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""mma.sync m16n8k8 throughput at the Turing prefill kernel's occupancy: by
warps per SM, independent accumulators per warp, and B operands held in
registers or read by ldmatrix with 1 or 2 loads in flight (4 MMAs per load,
as the kernel's inner loops do). Built as compute_75 PTX, so an H200 runs
it through the driver's JIT, as it runs the kernel; its figures are the
GPU's own, never Turing figures. bench/prefill_attention_variants.py runs it
beside the full-occupancy ceiling of bench/prefill_attention.py.

    python3 bench/mma_microbench.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

MICRO_SRC = r"""
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ void mma(float (&d)[4], unsigned a0, unsigned a1, unsigned b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}
// CHAINS independent accumulators per warp; the B operands either fixed in
// registers (AHEAD 0) or read by ldmatrix.x4 from shared memory, AHEAD loads
// in flight, 4 MMAs per load: the kernel's inner loops at its occupancy.
template <int CHAINS, int AHEAD>
__global__ void __launch_bounds__(256) mma_loop(float* out, int iters) {
  __shared__ __align__(16) unsigned short tile[8 * 512];
  for (int i = threadIdx.x; i < 8 * 512; i += 256) tile[i] = 0x3C00u ^ (i & 0x3Fu);
  __syncthreads();
  const unsigned a0 = 0x3C003C00u ^ (threadIdx.x & 0xFFu), a1 = 0x3C013BFFu ^ (threadIdx.x & 0x7Fu);
  const unsigned base =
      static_cast<unsigned>(__cvta_generic_to_shared(tile)) + (threadIdx.x & 31) * 16;
  float d[CHAINS][4] = {};
  unsigned b[AHEAD + 1][4];
#pragma unroll
  for (int s = 0; s <= AHEAD; ++s)
#pragma unroll
    for (int c = 0; c < 4; ++c) b[s][c] = 0x3BF03C10u ^ (threadIdx.x & 0x3Fu) ^ c;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int s = 0; s <= AHEAD; ++s) {
      if (AHEAD > 0) {
        unsigned* r = b[(s + AHEAD) % (AHEAD + 1)];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(base + ((i * (AHEAD + 1) + s) & 7) * 1024));
      }
#pragma unroll
      for (int k = 0; k < CHAINS; k += 4)
#pragma unroll
        for (int c = 0; c < 4; ++c) mma(d[(k + c) % CHAINS], a0, a1, b[s][c]);
    }
  }
  float t = 0.f;
  for (int j = 0; j < CHAINS; ++j) t += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = t;
}
template <int CHAINS, int AHEAD>
void run(int sms, int per_sm, float* out) {
  const int blocks = sms * per_sm, iters = 8192 / (CHAINS * (AHEAD + 1));
  mma_loop<CHAINS, AHEAD><<<blocks, 256>>>(out, 16);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    mma_loop<CHAINS, AHEAD><<<blocks, 256>>>(out, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
  }
  const double mmas = double(iters) * (AHEAD + 1) * CHAINS * blocks * 8.0;
  int resident = 0;  // CTAs per SM that registers and shared memory allow
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, mma_loop<CHAINS, AHEAD>, 256, 0);
  printf("%d %d %d %.3f\n", (per_sm < resident ? per_sm : resident) * 8, CHAINS, AHEAD,
         2.0 * 16 * 8 * 8 * mmas / (best * 1e-3) / 1e12);
}
int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  cudaError_t err = cudaMalloc(&out, sms * 8 * 256 * sizeof(float));
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  for (int per_sm : {1, 2, 8}) {  // 8, 16 and 64 warps per SM
    run<4, 0>(sms, per_sm, out); run<8, 0>(sms, per_sm, out); run<16, 0>(sms, per_sm, out);
    run<4, 1>(sms, per_sm, out); run<16, 1>(sms, per_sm, out);
    run<4, 2>(sms, per_sm, out); run<16, 2>(sms, per_sm, out);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  return 0;
}
"""


def mma_microbench(workdir: Path, nvcc: str = "nvcc") -> list[dict]:
    """m16n8k8 throughput by warps per SM, accumulators per warp and
    ldmatrix loads in flight (0: B in registers), as compute_75 PTX (JIT)."""
    src, exe = workdir / "mma_micro.cu", workdir / "mma_micro"
    src.write_text(MICRO_SRC)
    subprocess.run(
        [nvcc, "-O3", "-gencode=arch=compute_75,code=compute_75", str(src), "-o", str(exe)],
        check=True,
    )
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        # A diagnostic, not the sweep: say so and go on without it.
        print(f"warning: the mma microbenchmark failed: {proc.stdout}{proc.stderr}", flush=True)
        return []
    rows = []
    for line in proc.stdout.splitlines():
        warps, chains, ahead, tflops = line.split()
        rows.append(
            {
                "warps_per_sm": int(warps),
                "chains_per_warp": int(chains),
                "ldmatrix_in_flight": int(ahead),
                "tflops": float(tflops),
            }
        )
    return rows


def describe(o: dict) -> str:
    """One row of the microbenchmark, as a line."""
    return (
        f"{o['warps_per_sm']:2d} warps/SM, {o['chains_per_warp']:2d} accumulators per warp, "
        f"{o['ldmatrix_in_flight']} ldmatrix in flight: {o['tflops']:.1f} TFLOP/s"
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows = mma_microbench(Path(tmp))
    for o in rows:
        print(describe(o))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
