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

extern "C" {
    fn voxbatch_cuda_memory_stat(device: i32, what: i32) -> i64;
    fn voxbatch_cuda_reset_peak(device: i32) -> i32;
    fn voxbatch_cuda_empty_cache() -> i32;
}

/// Caching-allocator statistics.
#[derive(Debug, Clone, Copy)]
pub enum CudaStat {
    Allocated = 0,
    PeakAllocated = 1,
    Reserved = 2,
}

/// A caching-allocator statistic of CUDA device `device`, in bytes; `None` without CUDA.
pub fn cuda_memory_stat(device: usize, stat: CudaStat) -> Option<u64> {
    // SAFETY: reads allocator statistics; returns -1 when CUDA is unavailable.
    let v = unsafe { voxbatch_cuda_memory_stat(device as i32, stat as i32) };
    u64::try_from(v).ok()
}

/// Resets the peak statistics of `device` (no-op without CUDA).
pub fn cuda_reset_peak(device: usize) {
    // SAFETY: as above.
    unsafe { voxbatch_cuda_reset_peak(device as i32) };
}

/// Returns unused cached blocks to the driver (no-op without CUDA).
pub fn cuda_empty_cache() {
    // SAFETY: as above.
    unsafe { voxbatch_cuda_empty_cache() };
}

extern "C" {
    fn voxbatch_cuda_mem_info(device: i32, free_bytes: *mut i64, total_bytes: *mut i64) -> i32;
}

/// (free, total) bytes of CUDA device `device` as the driver sees them; `None` without CUDA.
pub fn cuda_mem_info(device: usize) -> Option<(u64, u64)> {
    let (mut free, mut total) = (0i64, 0i64);
    // SAFETY: writes two integers through valid pointers; returns non-zero on failure.
    let rc = unsafe { voxbatch_cuda_mem_info(device as i32, &mut free, &mut total) };
    (rc == 0).then(|| (free.max(0) as u64, total.max(0) as u64))
}
