// voxbatch's shim over libtorch's Kineto profiler, for `voxbatch bench token2wav --profile`:
// where a stage's device time goes, kernel by kernel, without Python or Nsight on the GPU host.
// Start before the work, stop after it (the caller synchronizes the device first): stop writes one
// line per event name, device and activity to `path` — `device \t activity \t count \t total ns \t
// name` — CUDA kernels (and copies, memsets) with their GPU time where CUPTI is there, CPU
// operators otherwise — and beside it `path.streams` and `path.timeline` (write_streams: the
// device's busy time by stream, their union, and 100-ms bins). One profile at a time per process;
// any exception stays inside (guarded).
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "guarded.h"

using voxbatch::guarded;

namespace {

// `path.streams`: the CUDA events (kernels, copies, memsets) by the stream they ran on — `stream \t
// events \t busy ns \t first start ns \t last end ns` — then `all` with the union of their busy
// intervals over every stream (the device's busy time: the streams' sum less it is their overlap);
// `path.timeline`: each stream's busy ns in 100-ms bins from the first event — `bin \t stream \t busy
// ns`. Events of one stream do not overlap. On a CPU, or without CUPTI, `all` alone with zeros.
void write_streams(const torch::autograd::profiler::ProfilerResult& result, const std::string& path) {
  struct Busy { uint64_t events = 0, busy = 0, first = UINT64_MAX, last = 0; };
  struct Span { uint64_t start, end; int64_t stream; };
  std::map<int64_t, Busy> streams;
  std::vector<Span> spans;
  for (const auto& event : result.events()) {
    if (event.deviceType() != c10::DeviceType::CUDA) continue;
    const uint64_t start = event.startNs(), end = event.endNs();
    if (end <= start) continue;
    auto& b = streams[event.deviceResourceId()];
    b.events += 1;
    b.busy += end - start;
    b.first = std::min(b.first, start);
    b.last = std::max(b.last, end);
    spans.push_back({start, end, event.deviceResourceId()});
  }
  // The union over the streams: the spans by start, each merged into the open interval it meets.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  Busy all;
  uint64_t open_start = 0, open_end = 0;
  for (const auto& s : spans) {
    all.events += 1;
    all.first = std::min(all.first, s.start);
    all.last = std::max(all.last, s.end);
    if (open_end == 0 || s.start > open_end) {
      all.busy += open_end - open_start;
      open_start = s.start;
      open_end = s.end;
    } else {
      open_end = std::max(open_end, s.end);
    }
  }
  all.busy += open_end - open_start;
  if (all.events == 0) all.first = 0;
  std::ofstream out(path + ".streams");
  if (!out) throw std::runtime_error("cannot write " + path + ".streams");
  for (const auto& [stream, b] : streams) {
    out << stream << '\t' << b.events << '\t' << b.busy << '\t' << b.first << '\t' << b.last << '\n';
  }
  out << "all\t" << all.events << '\t' << all.busy << '\t' << all.first << '\t' << all.last << '\n';
  if (!out) throw std::runtime_error("cannot write " + path + ".streams");
  constexpr uint64_t bin_ns = 100'000'000;
  std::map<std::pair<uint64_t, int64_t>, uint64_t> bins;
  for (const auto& s : spans) {
    for (uint64_t t = s.start; t < s.end;) {
      const uint64_t bin = (t - all.first) / bin_ns;
      const uint64_t until = std::min(s.end, all.first + (bin + 1) * bin_ns);
      bins[{bin, s.stream}] += until - t;
      t = until;
    }
  }
  std::ofstream timeline(path + ".timeline");
  if (!timeline) throw std::runtime_error("cannot write " + path + ".timeline");
  for (const auto& [key, busy] : bins) timeline << key.first << '\t' << key.second << '\t' << busy << '\n';
  if (!timeline) throw std::runtime_error("cannot write " + path + ".timeline");
}

}  // namespace

extern "C" {

int voxbatch_profiler_start(int cuda, char* err, size_t err_len) {
  return guarded([&] {
    using torch::profiler::impl::ActivityType;
    using torch::profiler::impl::ProfilerConfig;
    using torch::profiler::impl::ProfilerState;
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda != 0) activities.insert(ActivityType::CUDA);
    const ProfilerConfig config(ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }, err, err_len);
}

int voxbatch_profiler_stop(const char* path, char* err, size_t err_len) {
  return guarded([&] {
    auto result = torch::autograd::profiler::disableProfiler();
    // (device, activity, name) → (count, total ns)
    std::map<std::tuple<int, int, std::string>, std::pair<uint64_t, uint64_t>> totals;
    for (const auto& event : result->events()) {
      auto& entry = totals[{static_cast<int>(event.deviceType()), static_cast<int>(event.activityType()), event.name()}];
      entry.first += 1;
      entry.second += event.durationNs();
    }
    std::ofstream out(path);
    if (!out) throw std::runtime_error(std::string("cannot write ") + path);
    for (const auto& [key, value] : totals) {
      std::string name = std::get<2>(key);
      for (auto& c : name) {
        if (c == '\t' || c == '\n' || c == '\r') c = ' ';
      }
      out << std::get<0>(key) << '\t' << std::get<1>(key) << '\t' << value.first << '\t' << value.second << '\t' << name << '\n';
    }
    if (!out) throw std::runtime_error(std::string("cannot write ") + path);
    write_streams(*result, std::string(path));
  }, err, err_len);
}

}  // extern "C"
