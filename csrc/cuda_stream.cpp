// voxbatch's shim over libtorch's CUDA streams (c10::cuda::CUDAStream), which tch does not expose:
// a stream of libtorch's pool that a thread makes its current one, so that its kernels run beside
// another thread's (kind cosyvoice2: token2wav's buckets beside the LLM's decode steps), and a
// synchronisation of the calling thread's current stream alone (a device-wide one would wait for
// the other thread's work too). Compiled with cuda_graph.cpp, where the CUDA headers are. Every
// function catches C++ exceptions (`guarded`, guarded.h).
#include <c10/cuda/CUDAStream.h>

#include "guarded.h"

namespace {
using voxbatch::guarded;
}  // namespace

extern "C" {

// A stream of libtorch's pool on `device` (kept for the model's life: the caching allocator
// reuses a block only on the stream it was allocated for), of the pool's high priority when
// `high_priority` is non-zero (the block scheduler starts its waiting blocks before those of
// streams of lower priority) and of the default, lowest, priority otherwise.
int voxbatch_stream_new(int device, int high_priority, void** out, char* err, size_t err_len) {
  return guarded([&] {
    *out = new c10::cuda::CUDAStream(c10::cuda::getStreamFromPool(high_priority != 0, static_cast<c10::DeviceIndex>(device)));
  }, err, err_len);
}

// The calling thread's current stream on `device`, as a handle of its own (freed with
// voxbatch_stream_free): what a scoped `enter` restores.
int voxbatch_stream_current(int device, void** out, char* err, size_t err_len) {
  return guarded([&] {
    *out = new c10::cuda::CUDAStream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
  }, err, err_len);
}

void voxbatch_stream_free(void* s) {
  try {
    delete static_cast<c10::cuda::CUDAStream*>(s);
  } catch (...) {
  }
}

// Makes `s` the calling thread's current stream on its device.
int voxbatch_stream_enter(void* s, char* err, size_t err_len) {
  return guarded([&] { c10::cuda::setCurrentCUDAStream(*static_cast<c10::cuda::CUDAStream*>(s)); }, err, err_len);
}

// Waits for the work queued on the calling thread's current stream on `device`.
int voxbatch_stream_synchronize_current(int device, char* err, size_t err_len) {
  return guarded([&] { c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).synchronize(); }, err, err_len);
}

}  // extern "C"
