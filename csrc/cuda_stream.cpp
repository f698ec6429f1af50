// voxbatch's shim over libtorch's CUDA streams (c10::cuda::CUDAStream), which tch does not expose:
// a stream of libtorch's pool that a thread makes its current one, so that its kernels run beside
// another thread's (kind cosyvoice2: token2wav's buckets beside the LLM's decode steps), a
// synchronisation of the calling thread's current stream alone (a device-wide one would wait for
// the other thread's work too), and timing events on it (pipelined buckets: another thread waits
// for a bucket's waveforms and reads its GPU time), and a stream of a CUDA green context: one whose
// kernels run on a share of the device's SMs only, leaving the rest to the other streams' kernels
// (`[llm] decode_sms`). Compiled with cuda_graph.cpp, where the CUDA headers are. Every function
// catches C++ exceptions (`guarded`, guarded.h).
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "guarded.h"

namespace {
using voxbatch::guarded;

// The few CUDA driver functions the green contexts need, looked up in the libcuda that libtorch
// has loaded (nothing here links it: the binary builds where there is no driver). A function the
// driver lacks stays null.
struct Driver {
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuDeviceGetDevResource) resource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&::cuDevResourceGenerateDesc) describe = nullptr;
  decltype(&::cuGreenCtxCreate) green = nullptr;
  decltype(&::cuGreenCtxStreamCreate) green_stream = nullptr;

  void check(CUresult result, const char* what) const {
    if (result == CUDA_SUCCESS) return;
    const char* message = nullptr;
    if (error_string != nullptr) error_string(result, &message);
    throw std::runtime_error(std::string(what) + ": " + (message != nullptr ? message : "CUDA error " + std::to_string(static_cast<int>(result))));
  }
};

#define VOXBATCH_STR2(x) #x
#define VOXBATCH_STR(x) VOXBATCH_STR2(x)

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) throw std::runtime_error("cannot open libcuda.so.1 (no CUDA driver)");
    // Names through the macros cuda.h maps some of them with (versioned symbols).
    d.error_string = reinterpret_cast<decltype(d.error_string)>(dlsym(lib, VOXBATCH_STR(cuGetErrorString)));
    d.device_get = reinterpret_cast<decltype(d.device_get)>(dlsym(lib, VOXBATCH_STR(cuDeviceGet)));
    d.attribute = reinterpret_cast<decltype(d.attribute)>(dlsym(lib, VOXBATCH_STR(cuDeviceGetAttribute)));
    d.resource = reinterpret_cast<decltype(d.resource)>(dlsym(lib, VOXBATCH_STR(cuDeviceGetDevResource)));
    d.split = reinterpret_cast<decltype(d.split)>(dlsym(lib, VOXBATCH_STR(cuDevSmResourceSplitByCount)));
    d.describe = reinterpret_cast<decltype(d.describe)>(dlsym(lib, VOXBATCH_STR(cuDevResourceGenerateDesc)));
    d.green = reinterpret_cast<decltype(d.green)>(dlsym(lib, VOXBATCH_STR(cuGreenCtxCreate)));
    d.green_stream = reinterpret_cast<decltype(d.green_stream)>(dlsym(lib, VOXBATCH_STR(cuGreenCtxStreamCreate)));
    if (d.device_get == nullptr || d.attribute == nullptr) throw std::runtime_error("libcuda.so.1 lacks cuDeviceGet");
    return d;
  }();
  return d;
}
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

// The number of SMs of `device`.
int voxbatch_device_sm_count(int device, int* out, char* err, size_t err_len) {
  return guarded([&] {
    const Driver& d = driver();
    CUdevice dev;
    d.check(d.device_get(&dev, device), "cuDeviceGet");
    d.check(d.attribute(out, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute");
  }, err, err_len);
}

// A stream of a new green context of `sms` SMs of `device` (the split rounds up to its granularity,
// 8 on Hopper; `granted` says how many it gave): kernels queued on it run on those SMs alone, while
// other streams' kernels may run on any SM. The green context is kept for the process's life (a
// model's streams live as long as the worker).
int voxbatch_green_stream_new(int device, int sms, int* granted, void** out, char* err, size_t err_len) {
  return guarded([&] {
    const Driver& d = driver();
    if (d.split == nullptr || d.resource == nullptr || d.describe == nullptr || d.green == nullptr || d.green_stream == nullptr) {
      throw std::runtime_error("the CUDA driver has no green contexts (CUDA 12.4+)");
    }
    CUdevice dev;
    d.check(d.device_get(&dev, device), "cuDeviceGet");
    CUdevResource all{};
    d.check(d.resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
    CUdevResource group{};
    CUdevResource rest{};
    unsigned int groups = 1;
    d.check(d.split(&group, &groups, &all, &rest, 0, static_cast<unsigned int>(sms)), "cuDevSmResourceSplitByCount");
    if (groups != 1) throw std::runtime_error("the SM split gave no group of " + std::to_string(sms) + " SMs");
    CUdevResourceDesc desc;
    d.check(d.describe(&desc, &group, 1), "cuDevResourceGenerateDesc");
    CUgreenCtx context;
    d.check(d.green(&context, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    CUstream stream;
    d.check(d.green_stream(&stream, context, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
    *granted = static_cast<int>(group.sm.smCount);
    *out = new c10::cuda::CUDAStream(c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device)));
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
