//! Safe wrappers over `csrc/torch_shim.cpp` (libtorch calls tch does not expose). Below the
//! model and the GPU readings: `model` runs autocast, TF32, compiled packages and CUDA graphs
//! through it, `gpu` reads the caching allocator's memory.

use std::ffi::{c_char, CStr};

use crate::device::{Device, Precision};

extern "C" {
    fn voxbatch_autocast_set(device_type: i32, enabled: i32, dtype: i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_autocast_clear_cache(err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_set_tf32(enabled: i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_set_cudnn_sdpa(enabled: i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_cudnn_sdpa_enabled() -> i32;
}

/// A C++ exception caught inside the shim.
#[derive(Debug, thiserror::Error)]
#[error("libtorch {call} failed: {message}")]
pub struct ShimError {
    pub call: &'static str,
    pub message: String,
}

/// Inside tch code (`R<T>` results), a shim failure is a libtorch error like any other.
impl From<ShimError> for tch::TchError {
    fn from(e: ShimError) -> tch::TchError {
        tch::TchError::Torch(e.to_string())
    }
}

/// Calls a shim function that reports a caught exception through an error buffer.
pub(super) fn checked(call: &'static str, f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), ShimError> {
    let mut buf = [0 as c_char; 512];
    if f(buf.as_mut_ptr(), buf.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the shim NUL-terminates what it writes into the buffer, which starts zeroed.
    let message = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    Err(ShimError { call, message })
}

/// c10's DeviceType values.
const CPU: i32 = 0;
const CUDA: i32 = 1;

fn autocast_set(device_type: i32, enabled: bool, dtype: i32) -> Result<(), ShimError> {
    // SAFETY: plain setters of libtorch's thread-local autocast state; exceptions are caught in C++.
    checked("set autocast", |err, len| unsafe { voxbatch_autocast_set(device_type, i32::from(enabled), dtype, err, len) })
}

/// Autocast for `device` with `precision`'s dtype, on this thread, while the guard lives.
pub struct AutocastGuard {
    device_type: i32,
    active: bool,
}

impl AutocastGuard {
    /// The dtype autocast computes in at `precision` (none at fp32 and tf32: no autocast).
    pub fn kind(precision: Precision) -> Option<tch::Kind> {
        match precision {
            Precision::Fp16 => Some(tch::Kind::Half),
            Precision::Bf16 => Some(tch::Kind::BFloat16),
            Precision::Fp32 | Precision::Tf32 => None,
        }
    }

    pub fn enter(device: Device, precision: Precision) -> Result<AutocastGuard, ShimError> {
        let device_type = match device {
            Device::Cpu => CPU,
            Device::Cuda(_) => CUDA,
        };
        // The shim's dtype codes: 0 half, 1 bfloat16.
        let dtype = Self::kind(precision).map(|kind| if kind == tch::Kind::Half { 0 } else { 1 });
        if let Some(dtype) = dtype {
            autocast_set(device_type, true, dtype)?;
        }
        Ok(AutocastGuard { device_type, active: dtype.is_some() })
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        if self.active {
            // Leaving autocast must also drop its cast-weight cache. Neither can fail for a
            // device autocast was entered on; a failure is logged, not raised, in a destructor.
            let left = autocast_set(self.device_type, false, 0)
                // SAFETY: as above.
                .and_then(|()| checked("clear autocast cache", |err, len| unsafe { voxbatch_autocast_clear_cache(err, len) }));
            if let Err(e) = left {
                tracing::error!(error = %e, "leaving autocast failed");
            }
        }
    }
}

/// TF32 set for a stage that wants it other than the model's setting, and set back when dropped
/// (CUDA only; a CPU has no TF32 and the scope does nothing).
pub struct Tf32Scope {
    restore: Option<bool>,
}

impl Tf32Scope {
    /// Sets TF32 to `wanted` on `device` until dropped, then back to `model` (the model's own).
    pub fn enter(device: Device, wanted: bool, model: bool) -> Result<Tf32Scope, ShimError> {
        if matches!(device, Device::Cpu) || wanted == model {
            return Ok(Tf32Scope { restore: None });
        }
        set_tf32(wanted)?;
        Ok(Tf32Scope { restore: Some(model) })
    }
}

impl Drop for Tf32Scope {
    fn drop(&mut self) {
        if let Some(model) = self.restore {
            // Setting a flag cannot fail once it has been set; a failure is logged, not raised.
            if let Err(e) = set_tf32(model) {
                tracing::error!(error = %e, "restoring the TF32 setting failed");
            }
        }
    }
}

/// Enables or disables TF32 for cuBLAS and cuDNN (process-wide).
pub fn set_tf32(enabled: bool) -> Result<(), ShimError> {
    // SAFETY: sets two booleans in libtorch's global context; exceptions are caught in C++.
    checked("set TF32", |err, len| unsafe { voxbatch_set_tf32(i32::from(enabled), err, len) })
}

/// Whether `scaled_dot_product_attention` may choose cuDNN's attention (process-wide;
/// `[model] cudnn_attention`).
pub fn set_cudnn_attention(enabled: bool) -> Result<(), ShimError> {
    // SAFETY: sets a boolean in libtorch's global context; exceptions are caught in C++.
    checked("set cuDNN attention", |err, len| unsafe { voxbatch_set_cudnn_sdpa(i32::from(enabled), err, len) })
}

/// cuDNN's process-wide switches, as `[model]` sets them for every CUDA run (the worker's inference
/// thread, `bench token2wav`): its per-shape algorithm search (`cudnn_benchmark`) and whether
/// attention may run as cuDNN's (`cudnn_attention`).
pub fn set_cudnn(benchmark: bool, attention: bool) -> Result<(), ShimError> {
    tch::Cuda::cudnn_set_benchmark(benchmark);
    set_cudnn_attention(attention)
}

/// Whether `scaled_dot_product_attention` may choose cuDNN's attention now.
pub fn cudnn_attention() -> bool {
    // SAFETY: reads a boolean of libtorch's global context; cannot throw.
    unsafe { voxbatch_cudnn_sdpa_enabled() != 0 }
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
    /// Allocations retried after every cached block was freed (each waits for the whole device),
    /// since the process began: a count, not bytes.
    AllocRetries = 4,
    /// cudaMalloc calls since the process began (a count).
    DeviceAllocs = 5,
    /// cudaFree calls since the process began (a count).
    DeviceFrees = 6,
}

/// A caching-allocator statistic of CUDA device `device`, in bytes (the counts: a number);
/// `None` without CUDA.
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

extern "C" {
    fn voxbatch_flash_varlen(
        q: *mut std::ffi::c_void,
        k: *mut std::ffi::c_void,
        v: *mut std::ffi::c_void,
        cu_q: *mut std::ffi::c_void,
        cu_k: *mut std::ffi::c_void,
        seqused_k: *mut std::ffi::c_void,
        max_q: i64,
        max_k: i64,
        causal: i32,
        out: *mut *mut std::ffi::c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

/// FlashAttention's variable-length forward (see `voxbatch_flash_varlen` in
/// `csrc/torch_shim.cpp`): `q` `[ΣQ, H, d]` with row `i`'s (at most `max_q`) queries from
/// `cu_q[i]`, `k`/`v` `[rows of keys, H_kv, d]`, row `i` reading its keys from `cu_k[i]` (int32) —
/// `seqused_k[i]` of them when given, else up to `cu_k[i + 1]`. Causal for prefill (each sequence's
/// queries and keys the same positions). bf16/fp16 on CUDA. Returns `[ΣQ, H, d]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_varlen(
    q: &tch::Tensor,
    k: &tch::Tensor,
    v: &tch::Tensor,
    cu_q: &tch::Tensor,
    cu_k: &tch::Tensor,
    seqused_k: Option<&tch::Tensor>,
    max_q: i64,
    max_k: i64,
    causal: bool,
) -> Result<tch::Tensor, ShimError> {
    let mut out = std::ptr::null_mut();
    let p = |t: &tch::Tensor| t.as_ptr() as *mut std::ffi::c_void;
    let used = seqused_k.map_or(std::ptr::null_mut(), p);
    // SAFETY: every pointer is a live tch tensor (an at::Tensor*) borrowed for the call, or null
    // for an absent `seqused_k`; the shim writes a new heap at::Tensor into `out` on success, whose
    // ownership passes to the Tensor below. Exceptions are caught in C++.
    checked("flash attention", |err, len| unsafe {
        voxbatch_flash_varlen(p(q), p(k), p(v), p(cu_q), p(cu_k), used, max_q, max_k, i32::from(causal), &mut out, err, len)
    })?;
    // SAFETY: `out` is the at::Tensor the shim allocated; from_ptr takes ownership.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

extern "C" {
    fn voxbatch_to_host_pinned(src: *mut std::ffi::c_void, queued: i32, out: *mut *mut std::ffi::c_void, err: *mut c_char, err_len: usize) -> i32;
}

/// `t` on the host: a CUDA tensor is copied into page-locked memory (`voxbatch_to_host_pinned` in
/// `csrc/torch_shim.cpp`: the copy at the link's speed, not a pageable copy's ≈ 2 GB/s); a CPU
/// tensor is returned as it is (shared storage).
pub fn to_host(t: &tch::Tensor) -> Result<tch::Tensor, ShimError> {
    if t.device() == tch::Device::Cpu {
        return Ok(t.shallow_clone());
    }
    pinned_copy(t, false)
}

/// [`to_host`] without waiting: a CUDA tensor's copy into page-locked memory is queued on the
/// calling thread's current stream, and the tensor returned may be read only once the stream has
/// passed it (a `cuda_stream::CudaEvent` recorded after this call says when). A CPU tensor is
/// returned as it is.
pub fn to_host_queued(t: &tch::Tensor) -> Result<tch::Tensor, ShimError> {
    if t.device() == tch::Device::Cpu {
        return Ok(t.shallow_clone());
    }
    pinned_copy(t, true)
}

/// `t` copied into page-locked memory; `queued`: the copy queued, not waited for.
fn pinned_copy(t: &tch::Tensor, queued: bool) -> Result<tch::Tensor, ShimError> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `t` is a live tch tensor (an at::Tensor*) borrowed for the call; on success the shim
    // writes a new heap at::Tensor into `out`, whose ownership passes to the Tensor below.
    // Exceptions are caught in C++.
    checked("pinned copy to host", |err, len| unsafe { voxbatch_to_host_pinned(t.as_ptr() as *mut _, i32::from(queued), &mut out, err, len) })?;
    // SAFETY: `out` is the at::Tensor the shim allocated; from_ptr takes ownership.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cudnn_attention_switch_sets_libtorchs_flag_both_ways() {
        let before = cudnn_attention();
        set_cudnn_attention(false).unwrap();
        assert!(!cudnn_attention());
        set_cudnn_attention(true).unwrap();
        assert!(cudnn_attention());
        set_cudnn_attention(before).unwrap();
    }

    #[test]
    fn a_pinned_copy_holds_the_same_values_or_fails_as_an_error() {
        let t = tch::Tensor::arange(12, (tch::Kind::Float, tch::Device::Cpu)).view([3, 4]);
        assert_eq!(Vec::<f32>::try_from(to_host(&t).unwrap().view([-1])).unwrap(), (0..12).map(|x| x as f32).collect::<Vec<_>>());
        // Pinning needs a CUDA device: without one libtorch throws, which must come back as an
        // error (not an abort); with one, the pinned copy holds the values.
        match pinned_copy(&t, false) {
            Ok(host) => {
                assert!(host.is_pinned(tch::Device::Cuda(0)));
                assert!(host.equal(&t));
            }
            Err(e) => {
                assert_eq!(e.call, "pinned copy to host");
                assert!(tch::Cuda::device_count() == 0, "pinning failed with a GPU present: {e}");
            }
        }
    }

    #[test]
    fn a_cpp_exception_inside_the_shim_becomes_a_rust_error() {
        // Autocast on a device type libtorch has no autocast for (FPGA = 7) throws in C++.
        let e = autocast_set(7, true, 0).expect_err("libtorch refuses autocast on an FPGA");
        assert_eq!(e.call, "set autocast");
        assert!(!e.message.is_empty(), "the exception's message comes through");
    }

    #[test]
    fn autocast_on_the_cpu_enters_and_leaves() {
        let guard = AutocastGuard::enter(Device::Cpu, Precision::Bf16).expect("CPU autocast");
        drop(guard);
        assert!(AutocastGuard::enter(Device::Cpu, Precision::Fp32).is_ok());
    }
}
