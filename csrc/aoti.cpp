// voxbatch's shim over AOTInductor's package loader (torch::inductor::AOTIModelPackageLoader):
// load a `.pt2` package made by tools/compile_token2wav.py, read its metadata, run it on tch
// tensors (at::Tensor*). Every function catches its exceptions (guarded.h); a handle is freed by
// voxbatch_aoti_free.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>
#include "guarded.h"

using voxbatch::guarded;
using torch::inductor::AOTIModelPackageLoader;

namespace {

// How many times the CUDA caching allocator has run out of memory on the device of the first CUDA
// tensor in `tensors`; -1 when none is on CUDA (or the count cannot be read).
int64_t cuda_oom_count(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!t.is_cuda()) continue;
    try {
      return c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(t.device().index()).num_ooms;
    } catch (...) {
      return -1;
    }
  }
  return -1;
}

// Freeing a package once the process has begun to exit: AOTInductor's model container destroys
// its CUDA events in a destructor that throws ("driver shutting down") when CUDA's teardown has
// begun, and a throwing destructor ends the process (std::terminate: `voxbatch calibrate` aborted
// at exit on an H100 on 2026-12-06, its inference thread freeing the model as the main thread
// returned). An exit handler registered after the first load (so after CUDA's own, and run
// before them) waits for a free in progress and marks the exit; frees after it leave the package
// to the process's end. The lock is never destroyed: it is used during exit.
std::mutex& free_lock() {
  static auto* lock = new std::mutex();
  return *lock;
}
bool exiting = false;
void mark_exit() {
  std::lock_guard<std::mutex> guard(free_lock());
  exiting = true;
}
void register_exit_handler() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(mark_exit); });
}

}  // namespace

extern "C" {

// Loads the package at `path` for CUDA device `device_index` (-1: the package's own device, e.g.
// CPU). On success *out is the handle.
// Single-threaded runs (one thread, the model's, calls a package): the container's thread-safe run
// records a CUDA event after each call and, with one model instance, waits on the previous call's
// event before it launches the next (cudaEventSynchronize: the host cannot queue a call while the
// GPU runs the last) — and an event recorded inside a CUDA graph capture breaks every later call
// (cudaErrorCapturedEvent). The single-threaded run launches the kernels and nothing else.
int voxbatch_aoti_load(const char* path, int device_index, void** out, char* err, size_t err_len) {
  return guarded([&] {
    *out = new AOTIModelPackageLoader(std::string(path), "model", /* run_single_threaded = */ true, 1,
                                      static_cast<c10::DeviceIndex>(device_index));
    register_exit_handler();
  }, err, err_len);
}

// The metadata value of `key` into `value` (NUL-terminated, truncated to `value_len`); an absent
// key gives an empty string.
int voxbatch_aoti_metadata(void* handle, const char* key, char* value, size_t value_len, char* err, size_t err_len) {
  return guarded([&] {
    auto metadata = static_cast<AOTIModelPackageLoader*>(handle)->get_metadata();
    auto found = metadata.find(std::string(key));
    voxbatch::copy_message(found == metadata.end() ? "" : found->second.c_str(), value, value_len);
  }, err, err_len);
}

// Runs the package on `n_inputs` tensors; writes up to `max_outputs` new tensors (handed to Rust,
// which frees them) into `outputs` and their count into *n_outputs.
// A kernel's failure inside the package reaches here only as "run_func_(…) API call failed" (the
// package's C shim prints the cause and returns an error code): a CUDA allocation that failed
// during the call is told by the allocator's out-of-memory count, and the error then says "CUDA
// out of memory" first, so the caller splits the batch instead of failing it.
int voxbatch_aoti_run(void* handle, void** inputs, int n_inputs, void** outputs, int max_outputs, int* n_outputs,
                      char* err, size_t err_len) {
  return guarded([&] {
    std::vector<at::Tensor> in;
    in.reserve(n_inputs);
    for (int i = 0; i < n_inputs; ++i) in.push_back(*static_cast<at::Tensor*>(inputs[i]));
    const int64_t ooms_before = cuda_oom_count(in);
    std::vector<at::Tensor> result;
    try {
      result = static_cast<AOTIModelPackageLoader*>(handle)->run(in);
    } catch (const std::exception& e) {
      if (ooms_before >= 0 && cuda_oom_count(in) > ooms_before) {
        throw std::runtime_error(std::string("CUDA out of memory inside the compiled package: ") + e.what());
      }
      throw;
    }
    if (static_cast<int>(result.size()) > max_outputs) throw std::runtime_error("the package returned more outputs than expected");
    for (size_t i = 0; i < result.size(); ++i) outputs[i] = new at::Tensor(result[i]);
    *n_outputs = static_cast<int>(result.size());
  }, err, err_len);
}

void voxbatch_aoti_free(void* handle) {
  std::lock_guard<std::mutex> guard(free_lock());
  if (exiting) return;
  try {
    delete static_cast<AOTIModelPackageLoader*>(handle);
  } catch (...) {
  }
}

}  // extern "C"
