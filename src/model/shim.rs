//! Safe wrappers over `csrc/torch_shim.cpp` (libtorch calls tch does not expose).

use super::{Device, Precision};

extern "C" {
    fn voxbatch_autocast_set(device_type: i32, enabled: i32, dtype: i32);
    fn voxbatch_autocast_clear_cache();
    fn voxbatch_set_tf32(enabled: i32);
}

/// Autocast for `device` with `precision`'s dtype, on this thread, while the guard lives.
pub struct AutocastGuard {
    device_type: i32,
    active: bool,
}

impl AutocastGuard {
    pub fn enter(device: Device, precision: Precision) -> AutocastGuard {
        let device_type = match device {
            Device::Cpu => 0,
            Device::Cuda(_) => 1,
        };
        let dtype = match precision {
            Precision::Fp16 => Some(0),
            Precision::Bf16 => Some(1),
            Precision::Fp32 | Precision::Tf32 => None,
        };
        if let Some(dtype) = dtype {
            // SAFETY: plain setters of libtorch's thread-local autocast state.
            unsafe { voxbatch_autocast_set(device_type, 1, dtype) };
        }
        AutocastGuard { device_type, active: dtype.is_some() }
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: as above; clearing the cast-weight cache is required when leaving autocast.
            unsafe {
                voxbatch_autocast_set(self.device_type, 0, 0);
                voxbatch_autocast_clear_cache();
            }
        }
    }
}

/// Enables or disables TF32 for cuBLAS and cuDNN (process-wide).
pub fn set_tf32(enabled: bool) {
    // SAFETY: sets two booleans in libtorch's global context.
    unsafe { voxbatch_set_tf32(i32::from(enabled)) }
}
