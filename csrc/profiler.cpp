// voxbatch's shim over libtorch's Kineto profiler, for `voxbatch bench token2wav --profile`:
// where a stage's device time goes, kernel by kernel, without Python or Nsight on the GPU host.
// Start before the work, stop after it (the caller synchronizes the device first): stop writes one
// line per event name, device and activity to `path` — `device \t activity \t count \t total ns \t
// name` — CUDA kernels (and copies, memsets) with their GPU time where CUPTI is there, CPU
// operators otherwise. One profile at a time per process; any exception stays inside (guarded).
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "guarded.h"

using voxbatch::guarded;

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
  }, err, err_len);
}

}  // extern "C"
