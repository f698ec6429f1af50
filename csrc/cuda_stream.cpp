// voxbatch's shim over libtorch's CUDA streams (c10::cuda::CUDAStream), which tch does not expose:
// a stream of libtorch's pool that a thread makes its current one, so that its kernels run beside
// another thread's (kind cosyvoice2: token2wav's buckets beside the LLM's decode steps), a
// synchronisation of the calling thread's current stream alone (a device-wide one would wait for
// the other thread's work too), and timing events on it (pipelined buckets: another thread waits
// for a bucket's waveforms and reads its GPU time). Compiled with cuda_graph.cpp, where the CUDA headers are. Every
// function catches C++ exceptions (`guarded`, guarded.h).
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>

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

// A timing event recorded on the calling thread's current stream on `device` (c10::Event: the
// CUDA calls are libc10_cuda's, so nothing here links the CUDA runtime): it completes when the
// stream reaches it. Freed with voxbatch_event_free.
int voxbatch_event_record(int device, void** out, char* err, size_t err_len) {
  return guarded([&] {
    auto event = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    event->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
    *out = event.release();
  }, err, err_len);
}

// Waits until the stream has reached `event`.
int voxbatch_event_synchronize(void* event, char* err, size_t err_len) {
  return guarded([&] { static_cast<c10::Event*>(event)->synchronize(); }, err, err_len);
}

// Milliseconds of GPU time from `start` to `end`, both completed.
int voxbatch_event_elapsed_ms(void* start, void* end, double* ms, char* err, size_t err_len) {
  return guarded([&] { *ms = static_cast<c10::Event*>(start)->elapsedTime(*static_cast<c10::Event*>(end)); }, err, err_len);
}

void voxbatch_event_free(void* event) {
  try {
    delete static_cast<c10::Event*>(event);
  } catch (...) {
  }
}

}  // extern "C"
