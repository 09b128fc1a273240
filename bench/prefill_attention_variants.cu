// SPDX-License-Identifier: Apache-2.0
//
// Shapes of the Turing prefill attention kernel template beside the shipped
// ones, for bench/prefill_attention_variants.py: one library that the sweep
// loads by ctypes (no torch, no vLLM), built against the series' tree.
//
// It includes the kernel's translation unit, so every variant is the series'
// own template with other traits: no kernel code lives here. Only shapes that
// a Turing SM can hold are listed (the traits' static_asserts check shared
// memory; registers are what ptxas reports, spills included, so a variant
// that spills is measured as the spilling code it is).
//
//   nvcc -shared -I <tree>/csrc/sm7x bench/prefill_attention_variants.cu ...

#include "paged_prefill_attention_sm75.cu"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <type_traits>

namespace vllm::sm7x {
namespace {

// PrefillTraits<head dim, warps, row tiles per warp, keys per tile, CTAs per
// SM, shared lookups, XOR addressing[, lazy max[, lookups ahead[, K and V
// staged together[, row sums]]]]>. The shipped traits come first per head dim;
// the rest fit a Turing SM beside them: each shipped shape with the other row
// sums (the shipped ones, kRowSums 1, unpack the rounded probabilities and
// add them; 0 adds them before their rounding, 2 by MMAs). The alternatives
// that earlier sweeps measured slower
// (results/bench_prefill_variants_033_*.json), the shapes the shipped ones
// replaced among them, are left out: each shape costs the sweep's build and GPU
// time.
#define SM75_VARIANTS(X)                                                  \
  X(Hd64)                                                                 \
  X(PrefillTraits<64, 4, 2, 64, 2, true, true, true, true>)               \
  X(PrefillTraits<64, 4, 2, 64, 2, true, true, true, true, false, 2>)     \
  X(Hd128)                                                                \
  X(PrefillTraits<128, 12, 1, 32, 1, true, true>)                         \
  X(PrefillTraits<128, 12, 1, 32, 1, true, true, false, false, false, 2>) \
  X(Hd256)                                                                \
  X(PrefillTraits<256, 8, 1, 16, 1, true, true, false, false, true>)      \
  X(PrefillTraits<256, 8, 1, 16, 1, true, true, false, false, true, 2>)

template <class T>
struct Variant {
  static bool shipped() {
    return std::is_same_v<T, Hd64> || std::is_same_v<T, Hd128> ||
           std::is_same_v<T, Hd256>;
  }

  static cudaError_t attributes(int* out) {
    const auto kernel = paged_prefill_attention_sm75_kernel<T>;
    cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (e != cudaSuccess) return e;
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) return e;
    int per_sm = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, kernel, T::kThreads, T::kSmemBytes);
    out[0] = attr.numRegs;
    out[1] = static_cast<int>(attr.localSizeBytes);
    out[2] = per_sm;
    out[3] = T::kSmemBytes;
    out[4] = T::kThreads;
    return e;
  }

  // The split that splits 0 stands for: the launcher's rule over this
  // shape's CTAs and occupancy.
  static cudaError_t auto_split(const PagedPrefillAttentionParams& p,
                                PagedPrefillSplit* split) {
    int info[5];
    const cudaError_t e = attributes(info);
    if (e != cudaSuccess) return e;
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    // The shape's own CTA count: rows per CTA vary across the shapes.
    const int64_t rows =
        static_cast<int64_t>(p.num_tokens) * (p.num_heads / p.num_kv_heads);
    *split = paged_prefill_attention_sm75_split_for(
        (rows + T::kRows - 1) / T::kRows * p.num_kv_heads,
        static_cast<int64_t>(sms) * (info[2] > 0 ? info[2] : 1));
    return cudaSuccess;
  }
  // What paged_prefill_attention_sm75 does for its own traits, for these:
  // the shared-memory opt-in, the fields the launcher derives, and the
  // automatic split (splits 0) or the split asked for (the first split_from
  // CTAs whole).
  static cudaError_t run(PagedPrefillAttentionParams p, int splits,
                         int64_t split_from, cudaStream_t stream) {
    PagedPrefillSplit split{splits, split_from};
    if (splits == 0) {
      const cudaError_t e = auto_split(p, &split);
      if (e != cudaSuccess) return e;
    }
    p.page_shift = __builtin_ctz(static_cast<unsigned>(p.page_size));
    p.scale_log2 = p.softmax_scale * kLog2e;
    p.group = p.num_heads / p.num_kv_heads;
    p.num_splits = split.splits;
    p.split_from = static_cast<int>(std::min<int64_t>(split.whole, INT32_MAX));
    p.min_range_keys = split.min_range_keys;
    return launch<T>(p, stream);
  }
};

struct Entry {
  const char* traits;
  int head_dim, warps, row_tiles, keys, ctas_per_sm, smem_bytes, rows;
  bool lookup_ahead, stage_kv, lazy_max, shared_lookups, xor_addressing,
      shipped;
  int row_sums;
  cudaError_t (*attributes)(int*);
  cudaError_t (*run)(PagedPrefillAttentionParams, int, int64_t, cudaStream_t);
  cudaError_t (*auto_split)(const PagedPrefillAttentionParams&,
                            PagedPrefillSplit*);
};

#define SM75_ENTRY(...)                    \
  Entry{#__VA_ARGS__,                      \
        __VA_ARGS__::kHeadDim,             \
        __VA_ARGS__::kWarps,               \
        __VA_ARGS__::kMTiles,              \
        __VA_ARGS__::kKeys,                \
        __VA_ARGS__::kMinCtasPerSm,        \
        __VA_ARGS__::kSmemBytes,           \
        __VA_ARGS__::kRows,                \
        __VA_ARGS__::kLookupAhead,         \
        __VA_ARGS__::kStageKV,             \
        __VA_ARGS__::kLazyMax,             \
        __VA_ARGS__::kSharedLookups,       \
        __VA_ARGS__::kXorAddressing,       \
        Variant<__VA_ARGS__>::shipped(),   \
        __VA_ARGS__::kRowSums,             \
        &Variant<__VA_ARGS__>::attributes, \
        &Variant<__VA_ARGS__>::run,        \
        &Variant<__VA_ARGS__>::auto_split},

const Entry kEntries[] = {SM75_VARIANTS(SM75_ENTRY)};
constexpr int kCount = sizeof(kEntries) / sizeof(kEntries[0]);

}  // namespace
}  // namespace vllm::sm7x

using vllm::sm7x::kCount;
using vllm::sm7x::kEntries;
using vllm::sm7x::PagedPrefillAttentionParams;

extern "C" {

int sm75v_count() { return kCount; }

// head dim, warps, row tiles per warp, keys per tile, CTAs per SM (the
// launch bound), shared lookups, XOR addressing, shipped (those three 0 or
// 1), dynamic shared bytes per CTA, K and V staged together, lazy max,
// packed query rows per CTA, the lookups a tile ahead (those three 0 or 1),
// the row sums (PrefillTraits::kRowSums);
// -1 for an index out of range.
int sm75v_shape(int i, int* out) {
  if (i < 0 || i >= kCount) return -1;
  const auto& e = kEntries[i];
  out[0] = e.head_dim;
  out[1] = e.warps;
  out[2] = e.row_tiles;
  out[3] = e.keys;
  out[4] = e.ctas_per_sm;
  out[5] = e.shared_lookups ? 1 : 0;
  out[6] = e.xor_addressing ? 1 : 0;
  out[7] = e.shipped ? 1 : 0;
  out[8] = e.smem_bytes;
  out[9] = e.stage_kv ? 1 : 0;
  out[10] = e.lazy_max ? 1 : 0;
  out[11] = e.rows;
  out[12] = e.lookup_ahead ? 1 : 0;
  out[13] = e.row_sums;
  return 0;
}

const char* sm75v_traits(int i) {
  return i >= 0 && i < kCount ? kEntries[i].traits : nullptr;
}

// On the current device: registers, local (spill) bytes, resident CTAs per
// SM, dynamic shared bytes, threads. Returns a cudaError_t.
int sm75v_attributes(int i, int* out) {
  if (i < 0 || i >= kCount) return cudaErrorInvalidValue;
  const cudaError_t e = kEntries[i].attributes(out);
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

// The split that splits 0 picks for these params on the current device: the
// split count (-1 where the device cannot run the shape), and in *whole how
// many of the grid's first CTAs run whole.
int sm75v_auto_split(int i, const PagedPrefillAttentionParams* p,
                     int64_t* whole) {
  vllm::sm7x::PagedPrefillSplit split;
  if (i < 0 || i >= kCount ||
      kEntries[i].auto_split(*p, &split) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  *whole = split.whole;
  return split.splits;
}

// Launches variant i on `stream` (splits 0: automatic; a forced split runs
// the first split_from CTAs whole). Returns a cudaError_t.
int sm75v_launch(int i, const PagedPrefillAttentionParams* p, int splits,
                 int64_t split_from, void* stream) {
  if (i < 0 || i >= kCount || p == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e = kEntries[i].run(*p, splits, split_from,
                                        static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

// sizeof(PagedPrefillAttentionParams), then each field's offset in
// declaration order: the ctypes mirror checks itself against it.
int sm75v_params_layout(int64_t* out, int n) {
  const int64_t layout[] = {
      sizeof(PagedPrefillAttentionParams),
#define SM75_OFFSET(f) offsetof(PagedPrefillAttentionParams, f),
      // clang-format off
      SM75_OFFSET(query)
      SM75_OFFSET(query_stride_token)
      SM75_OFFSET(query_stride_head)
      SM75_OFFSET(key_cache)
      SM75_OFFSET(value_cache)
      SM75_OFFSET(cache_stride_block)
      SM75_OFFSET(cache_stride_slot)
      SM75_OFFSET(cache_stride_head)
      SM75_OFFSET(block_table)
      SM75_OFFSET(block_table_stride)
      SM75_OFFSET(cu_seqlens_q)
      SM75_OFFSET(seq_lens)
      SM75_OFFSET(out)
      SM75_OFFSET(out_stride_token)
      SM75_OFFSET(out_stride_head)
      SM75_OFFSET(lse)
      SM75_OFFSET(num_splits)
      SM75_OFFSET(split_from)
      SM75_OFFSET(min_range_keys)
      SM75_OFFSET(part_out)
      SM75_OFFSET(part_lse)
      SM75_OFFSET(num_seqs)
      SM75_OFFSET(num_tokens)
      SM75_OFFSET(num_heads)
      SM75_OFFSET(num_kv_heads)
      SM75_OFFSET(head_dim)
      SM75_OFFSET(page_size)
      SM75_OFFSET(page_shift)
      SM75_OFFSET(softmax_scale)
      SM75_OFFSET(scale_log2)
      SM75_OFFSET(group)
  // clang-format on
#undef SM75_OFFSET
  };
  const int count = static_cast<int>(sizeof(layout) / sizeof(layout[0]));
  for (int k = 0; k < count && k < n; ++k) out[k] = layout[k];
  return count;
}

}  // extern "C"
