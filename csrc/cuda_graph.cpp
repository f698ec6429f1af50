// voxbatch's shim over libtorch's CUDA graphs (at::cuda::CUDAGraph), which tch does not expose.
// Compiled only where the CUDA runtime headers are present (the cu13 torch wheel's
// nvidia/cu13/include); build.rs then sets the `voxbatch_cuda_graphs` cfg for the Rust side.
//
// A graph owns a side stream. `enter` makes it this thread's current stream (after the device
// settles), `leave` restores the previous one (after the device settles again):
// warm-up runs and the capture happen in between, as torch.cuda.graph does. Captures use
// thread-local mode, so other threads' CUDA calls (the NVML sampler, another model) cannot break
// them. Replays run on the calling thread's current stream. Every function catches C++
// exceptions (`guarded`, guarded.h).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "guarded.h"
#include <optional>

namespace {

using voxbatch::guarded;


struct Graph {
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStream> previous;
  explicit Graph(c10::DeviceIndex device) : graph(false), side(c10::cuda::getStreamFromPool(false, device)) {}
};

// Orders the side stream against the stream that was current: a device-wide synchronisation
// (captures are rare — once per bucket — and this needs no CUDA runtime symbols of our own: the
// binary links libtorch's CUDA libraries, not libcudart, whose path only they know).
void settle() { c10::cuda::device_synchronize(); }

}  // namespace

extern "C" {

int voxbatch_graph_new(int device, void** out, char* err, size_t err_len) {
  return guarded([&] { *out = new Graph(static_cast<c10::DeviceIndex>(device)); }, err, err_len);
}

void voxbatch_graph_free(void* g) {
  try {
    delete static_cast<Graph*>(g);
  } catch (...) {
  }
}

int voxbatch_graph_enter(void* g, char* err, size_t err_len) {
  return guarded([&] {
    auto* graph = static_cast<Graph*>(g);
    auto current = c10::cuda::getCurrentCUDAStream(graph->side.device_index());
    settle();
    graph->previous = current;
    c10::cuda::setCurrentCUDAStream(graph->side);
  }, err, err_len);
}

int voxbatch_graph_leave(void* g, char* err, size_t err_len) {
  return guarded([&] {
    auto* graph = static_cast<Graph*>(g);
    if (!graph->previous) return;
    const auto previous = *graph->previous;
    graph->previous.reset();
    c10::cuda::setCurrentCUDAStream(previous);
    settle();
  }, err, err_len);
}

// Begins capturing on the side stream (call after `enter`); with `share` non-null the graph
// allocates from `share`'s memory pool (graphs replayed one at a time on one stream may share).
int voxbatch_graph_capture_begin(void* g, void* share, char* err, size_t err_len) {
  return guarded([&] {
    auto* graph = static_cast<Graph*>(g);
    at::cuda::MempoolId_t pool{0, 0};
    if (share != nullptr) pool = static_cast<Graph*>(share)->graph.pool();
    graph->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  }, err, err_len);
}

// Ends the capture and instantiates the graph.
int voxbatch_graph_capture_end(void* g, char* err, size_t err_len) {
  return guarded([&] { static_cast<Graph*>(g)->graph.capture_end(); }, err, err_len);
}

int voxbatch_graph_replay(void* g, char* err, size_t err_len) {
  return guarded([&] { static_cast<Graph*>(g)->graph.replay(); }, err, err_len);
}

}  // extern "C"
