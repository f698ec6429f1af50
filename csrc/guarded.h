// voxbatch's shim: no C++ exception crosses extern "C". Every shim function that can throw runs
// its body through `guarded`, which returns 0, or -1 with the exception's message in `err`
// (NUL-terminated, truncated to `err_len`). Shared by torch_shim.cpp and cuda_graph.cpp.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>

namespace voxbatch {

inline void copy_message(const char* what, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, what, err_len - 1);
  err[err_len - 1] = '\0';
}

template <typename F>
int guarded(F&& f, char* err, size_t err_len) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
  } catch (...) {
    copy_message("unknown C++ exception", err, err_len);
  }
  return -1;
}

}  // namespace voxbatch
