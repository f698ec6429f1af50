// voxbatch's shim over libtorch for what tch does not expose:
// - the autocast dtype (tch only toggles autocast, always fp16, through deprecated calls);
// - the TF32 switch and whether attention may use cuDNN's;
// - CUDA caching-allocator statistics (peak allocated, reset), emptying the cache, and
//   used by calibration and the memory-aware batch policy;
// - FlashAttention's varlen forward; device-to-host copies into pinned memory.
// Autocast state is thread-local in libtorch: call those on the inference thread.
// The CUDA functions go through c10's device-agnostic DeviceAllocator interface, so no CUDA
// headers are needed; where no CUDA allocator is registered (CPU-only libtorch) or no device
// exists they return -1.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include "guarded.h"

using voxbatch::guarded;

extern "C" {

// device_type: c10's DeviceType (0 = CPU, 1 = CUDA). dtype: 0 = float16, 1 = bfloat16.
int voxbatch_autocast_set(int device_type, int enabled, int dtype, char* err, size_t err_len) {
  return guarded([&] {
    const auto dev = static_cast<at::DeviceType>(device_type);
    at::autocast::set_autocast_dtype(dev, dtype == 1 ? at::kBFloat16 : at::kHalf);
    at::autocast::set_autocast_enabled(dev, enabled != 0);
  }, err, err_len);
}

// Drops autocast's cache of casted weights (call after each forward).
int voxbatch_autocast_clear_cache(char* err, size_t err_len) {
  return guarded([] { at::autocast::clear_cache(); }, err, err_len);
}

// TF32 for cuBLAS matmuls and cuDNN convolutions.
int voxbatch_set_tf32(int enabled, char* err, size_t err_len) {
  return guarded([&] {
    at::globalContext().setAllowTF32CuBLAS(enabled != 0);
    at::globalContext().setAllowTF32CuDNN(enabled != 0);
  }, err, err_len);
}

// Whether scaled_dot_product_attention may pick cuDNN's attention (process-wide). With cuDNN
// above 9.15 torch puts it first on sm90; it builds a graph for every new shape and caches it per
// thread, where FlashAttention and the memory-efficient kernels need none.
int voxbatch_set_cudnn_sdpa(int enabled, char* err, size_t err_len) {
  return guarded([&] { at::globalContext().setSDPUseCuDNN(enabled != 0); }, err, err_len);
}

// 1 when scaled_dot_product_attention may pick cuDNN's attention, 0 when not.
int voxbatch_cudnn_sdpa_enabled() {
  return at::globalContext().userEnabledCuDNNSDP() ? 1 : 0;
}

// Caching-allocator statistics of `device` in bytes: what = 0 current allocated, 1 peak allocated
// (since the last reset), 2 current reserved, 3 peak reserved; counts since the process began: 4
// allocations retried after freeing every cached block (each a device-wide wait), 5 cudaMalloc
// calls, 6 cudaFree calls. -1 when unavailable.
int64_t voxbatch_cuda_memory_stat(int device, int what) {
  try {
    const auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    switch (what) {
      case 0: return stats.allocated_bytes[agg].current;
      case 1: return stats.allocated_bytes[agg].peak;
      case 2: return stats.reserved_bytes[agg].current;
      case 3: return stats.reserved_bytes[agg].peak;
      case 4: return stats.num_alloc_retries;
      case 5: return stats.num_device_alloc;
      case 6: return stats.num_device_free;
      default: return -1;
    }
  } catch (...) {
    return -1;
  }
}

// Resets the peak statistics of `device`. 0 on success, -1 when unavailable.
int voxbatch_cuda_reset_peak(int device) {
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (...) {
    return -1;
  }
}

// Returns cached, unused blocks to the driver. 0 on success, -1 when unavailable.
int voxbatch_cuda_empty_cache() {
  try {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
    return 0;
  } catch (...) {
    return -1;
  }
}

// Free and total memory of `device` as the driver sees it (all processes). 0 on success.
int voxbatch_cuda_mem_info(int device, int64_t* free_bytes, int64_t* total_bytes) {
  try {
    const auto info = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    *free_bytes = static_cast<int64_t>(info.first);
    *total_bytes = static_cast<int64_t>(info.second);
    return 0;
  } catch (...) {
    return -1;
  }
}

// FlashAttention's variable-length forward. Decode over a slot KV cache (not causal): `q` [ΣQ, H, d]
// (row i's queries from `cu_q[i]`, at most `max_q`), `k`/`v` a cache layer viewed
// [slots × max_len, H, d]; row i reads `seqused_k[i]` keys from offset `cu_k[i]` (int32, N + 1
// entries), so each row reads only its own slot's filled positions; `max_k` bounds `seqused_k`.
// Prefill (causal, `seqused_k` null): sequences laid end to end in q, k and v alike, `cu_q` =
// `cu_k` their offsets. bf16/fp16 on CUDA only. The output [ΣQ, H, d] is a new tensor handed to
// Rust (tch frees it). Tensors are tch's (at::Tensor*).
int voxbatch_flash_varlen(void* q, void* k, void* v, void* cu_q, void* cu_k, void* seqused_k, int64_t max_q, int64_t max_k,
                          int causal, void** out, char* err, size_t err_len) {
  return guarded([&] {
    const auto& query = *static_cast<at::Tensor*>(q);
    std::optional<at::Tensor> used;
    if (seqused_k != nullptr) used = *static_cast<at::Tensor*>(seqused_k);
    auto result = at::_flash_attention_forward(query, *static_cast<at::Tensor*>(k), *static_cast<at::Tensor*>(v),
                                               *static_cast<at::Tensor*>(cu_q), *static_cast<at::Tensor*>(cu_k), max_q, max_k, 0.0,
                                               causal != 0, false, std::nullopt, std::nullopt, std::nullopt, used);
    *out = new at::Tensor(std::get<0>(result));
  }, err, err_len);
}

// A copy of `src` in page-locked host memory from libtorch's caching host allocator (its blocks
// are reused, so pinning is paid once per size class): a device-to-host copy then runs at the
// link's speed, where one into pageable memory ran at ≈ 2 GB/s (65 ms for a batch of 128 × 10 s
// of audio on the H200, 2026-12-04). Returns when the copy is done, or with `queued` non-zero once
// it is queued on the calling thread's current stream: `out` is then valid once the stream has
// passed the copy (an event recorded after this call says when), and the pinned block stays
// reserved until then (the host allocator records the copy's stream). Throws (caught) where no
// CUDA device can pin memory.
int voxbatch_to_host_pinned(void* src, int queued, void** out, char* err, size_t err_len) {
  return guarded([&] {
    const auto& tensor = *static_cast<at::Tensor*>(src);
    auto host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    host.copy_(tensor, /*non_blocking=*/queued != 0);
    *out = new at::Tensor(std::move(host));
  }, err, err_len);
}

}  // extern "C"
