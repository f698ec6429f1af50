// voxbatch's shim over libtorch for what tch does not expose: the autocast dtype (tch only toggles
// autocast, always fp16, through deprecated calls) and the TF32 switch. Autocast state is
// thread-local in libtorch: call these on the inference thread.
#include <ATen/autocast_mode.h>
#include <ATen/Context.h>

extern "C" {

// device_type: 0 = CPU, 1 = CUDA. dtype: 0 = float16, 1 = bfloat16.
void voxbatch_autocast_set(int device_type, int enabled, int dtype) {
  const at::DeviceType dev = device_type == 1 ? at::kCUDA : at::kCPU;
  at::autocast::set_autocast_dtype(dev, dtype == 1 ? at::kBFloat16 : at::kHalf);
  at::autocast::set_autocast_enabled(dev, enabled != 0);
}

// Drops autocast's cache of casted weights (call after each forward).
void voxbatch_autocast_clear_cache() { at::autocast::clear_cache(); }

// TF32 for cuBLAS matmuls and cuDNN convolutions.
void voxbatch_set_tf32(int enabled) {
  at::globalContext().setAllowTF32CuBLAS(enabled != 0);
  at::globalContext().setAllowTF32CuDNN(enabled != 0);
}

}  // extern "C"
