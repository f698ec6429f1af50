//! CUDA streams through the C++ shim (`csrc/cuda_stream.cpp`): a [`SideStream`] that a thread
//! makes its current one (for good with [`SideStream::enter`], for a scope with
//! [`SideStream::enter_scoped`]), so that its kernels run beside the kernels other threads queue
//! on theirs, and [`synchronize`], which waits for the calling thread's current stream alone.
//! Text kinds run token2wav's buckets on a side stream beside the LLM's decode steps, the decode
//! on a stream of high priority (`tts`, `[llm] overlap_token2wav`, `[llm] prioritise_decode`).
//! With `[llm] decode_sms`, token2wav's stream is one of a CUDA green context
//! ([`SideStream::green`]): its kernels run on a share of the SMs ([`green_sms`]), and the rest are
//! the decode's while a bucket runs.
//! A [`CudaEvent`] marks a point of the calling thread's stream, which another thread can wait
//! for and time from (`[llm] pipelined_buckets`: the cutter thread waits for a bucket's waveforms).
//!
//! Without the CUDA runtime headers at build time (build.rs) there is no side stream (a thread
//! keeps the default stream) and [`synchronize`] waits for the whole device.
//!
//! Neighbours: `shim` (the error buffer), `cuda_graph` (graphs capture on a side stream of their
//! own and replay on the calling thread's current stream).

#[cfg(voxbatch_cuda_graphs)]
use std::ffi::{c_char, c_void};

#[cfg(voxbatch_cuda_graphs)]
use super::shim::checked;
use super::shim::ShimError;
use super::Device;

#[cfg(voxbatch_cuda_graphs)]
extern "C" {
    fn voxbatch_stream_new(device: i32, high_priority: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_device_sm_count(device: i32, out: *mut i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_green_stream_new(device: i32, sms: i32, granted: *mut i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_stream_current(device: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_stream_free(s: *mut c_void);
    fn voxbatch_stream_enter(s: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_stream_synchronize_current(device: i32, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_event_record(device: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_event_synchronize(event: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_event_elapsed_ms(start: *mut c_void, end: *mut c_void, ms: *mut f64, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_event_free(event: *mut c_void);
}

/// A stream of libtorch's pool on one CUDA device, kept for a model's life (the caching allocator
/// reuses a freed block only on the stream it was allocated for: a new stream per batch would
/// leave each batch's blocks to the next one's misses).
pub struct SideStream {
    #[cfg(voxbatch_cuda_graphs)]
    ptr: *mut c_void,
    /// The CUDA device's index.
    #[cfg(voxbatch_cuda_graphs)]
    index: i32,
}

/// A stream's priority in the block scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The default stream's (the lowest).
    Normal,
    /// The pool's high priority: the GPU starts this stream's waiting blocks before those of
    /// streams of lower priority (running blocks are not preempted).
    High,
}

// SAFETY: an owned C++ stream handle (a device index and a stream id), valid on any thread; it is
// only read.
unsafe impl Send for SideStream {}
unsafe impl Sync for SideStream {}

impl SideStream {
    /// A side stream on `device` of `priority`; `None` on a CPU, or without the CUDA headers at
    /// build time.
    pub fn new(device: Device, priority: Priority) -> Result<Option<SideStream>, ShimError> {
        let Device::Cuda(_index) = device else { return Ok(None) };
        #[cfg(voxbatch_cuda_graphs)]
        {
            let mut ptr = std::ptr::null_mut();
            let high = i32::from(priority == Priority::High);
            // SAFETY: writes a new stream handle into `ptr`; exceptions are caught in C++.
            checked("create a CUDA stream", |err, len| unsafe { voxbatch_stream_new(_index as i32, high, &mut ptr, err, len) })?;
            Ok(Some(SideStream { ptr, index: _index as i32 }))
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        {
            let _ = priority;
            Ok(None)
        }
    }

    /// A stream of a new CUDA green context of `sms` of `device`'s SMs (a multiple of
    /// [`GREEN_GRANULARITY`]: [`green_sms`]): the kernels queued on it run on those SMs alone,
    /// whatever other streams queue. `None` on a CPU, or without the CUDA headers at build time.
    /// The context lives as long as the process.
    pub fn green(device: Device, sms: u32) -> Result<Option<SideStream>, ShimError> {
        let Device::Cuda(_index) = device else { return Ok(None) };
        #[cfg(voxbatch_cuda_graphs)]
        {
            let (mut ptr, mut granted) = (std::ptr::null_mut(), 0i32);
            let asked = i32::try_from(sms).unwrap_or(i32::MAX);
            // SAFETY: writes a new stream handle into `ptr` and the SMs given into `granted`;
            // exceptions (a driver without green contexts, a count the split refuses) are caught
            // in C++.
            checked("create a CUDA green context and its stream", |err, len| unsafe { voxbatch_green_stream_new(_index as i32, asked, &mut granted, &mut ptr, err, len) })?;
            let stream = SideStream { ptr, index: _index as i32 };
            if granted != asked {
                return Err(ShimError { call: "create a CUDA green context and its stream", message: format!("the SM split gave {granted} SMs where {asked} were asked for") });
            }
            Ok(Some(stream))
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        {
            let _ = sms;
            Ok(None)
        }
    }

    /// Makes this the calling thread's current stream until the guard drops, which makes the
    /// stream current before it current again.
    pub fn enter_scoped(&self) -> Result<EnteredStream, ShimError> {
        #[cfg(voxbatch_cuda_graphs)]
        {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: writes a new handle of the current stream into `ptr`; exceptions are caught in C++.
            checked("read the current CUDA stream", |err, len| unsafe { voxbatch_stream_current(self.index, &mut ptr, err, len) })?;
            let previous = SideStream { ptr, index: self.index };
            self.enter()?;
            Ok(EnteredStream { previous: Some(previous) })
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        Ok(EnteredStream { previous: None })
    }

    /// Makes this the calling thread's current stream (for the rest of the thread's life, or until
    /// another is entered): libtorch queues the thread's kernels on it.
    pub fn enter(&self) -> Result<(), ShimError> {
        #[cfg(voxbatch_cuda_graphs)]
        {
            // SAFETY: `self.ptr` is a live stream handle; exceptions are caught in C++.
            checked("enter a CUDA stream", |err, len| unsafe { voxbatch_stream_enter(self.ptr, err, len) })
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        Ok(())
    }
}

/// The stream that was current before [`SideStream::enter_scoped`], made current again on drop.
pub struct EnteredStream {
    previous: Option<SideStream>,
}

impl Drop for EnteredStream {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            if let Err(e) = previous.enter() {
                tracing::warn!(error = %e, "cannot make the earlier CUDA stream current again");
            }
        }
    }
}

#[cfg(voxbatch_cuda_graphs)]
impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from voxbatch_stream_new and is freed once, here.
        unsafe {
            voxbatch_stream_free(self.ptr)
        };
    }
}

/// The SM count a green context's split is made in multiples of (compute capability 9.0: 8).
pub const GREEN_GRANULARITY: u32 = 8;

/// The SMs of a green context that leaves at least `reserved` of a device's `total` to other
/// streams: the largest multiple of [`GREEN_GRANULARITY`] that does, `None` when that is none.
pub fn green_sms(total: u32, reserved: u32) -> Option<u32> {
    let sms = total.checked_sub(reserved)? / GREEN_GRANULARITY * GREEN_GRANULARITY;
    (sms > 0).then_some(sms)
}

/// `device`'s SM count; `None` on a CPU, or without the CUDA headers at build time.
pub fn sm_count(device: Device) -> Result<Option<u32>, ShimError> {
    let Device::Cuda(_index) = device else { return Ok(None) };
    #[cfg(voxbatch_cuda_graphs)]
    {
        let mut sms = 0i32;
        // SAFETY: a device index and an out integer; exceptions are caught in C++.
        checked("read the device's SM count", |err, len| unsafe { voxbatch_device_sm_count(_index as i32, &mut sms, err, len) })?;
        Ok(u32::try_from(sms).ok())
    }
    #[cfg(not(voxbatch_cuda_graphs))]
    Ok(None)
}

/// Waits for the work the calling thread queued on `device` (its current stream); the whole
/// device without the CUDA headers at build time. Nothing on a CPU.
pub fn synchronize(device: Device) {
    let Device::Cuda(index) = device else { return };
    #[cfg(voxbatch_cuda_graphs)]
    {
        // SAFETY: a plain call on a device index; exceptions are caught in C++.
        let synced = checked("synchronize a CUDA stream", |err, len| unsafe { voxbatch_stream_synchronize_current(index as i32, err, len) });
        if let Err(e) = synced {
            // A failed stream wait: the device-wide one still orders what follows.
            tracing::debug!(error = %e, "stream synchronisation failed; synchronising the device");
            tch::Cuda::synchronize(index as i64);
        }
    }
    #[cfg(not(voxbatch_cuda_graphs))]
    tch::Cuda::synchronize(index as i64);
}

/// A timing event recorded on the calling thread's current CUDA stream ([`CudaEvent::record`]):
/// another thread may wait for the stream to reach it and read the GPU time between two of them.
pub struct CudaEvent {
    #[cfg(voxbatch_cuda_graphs)]
    ptr: *mut c_void,
}

// SAFETY: a c10::Event may be waited for, timed and freed from any thread; the pointer is owned
// by this value alone.
unsafe impl Send for CudaEvent {}

impl CudaEvent {
    /// An event at this point of the calling thread's current stream on `device`. `Ok(None)` on a
    /// CPU and without the CUDA headers at build time (then nothing is queued: there is nothing
    /// to wait for beyond what the caller's own synchronisation gives).
    pub fn record(device: Device) -> Result<Option<CudaEvent>, ShimError> {
        let Device::Cuda(_index) = device else { return Ok(None) };
        #[cfg(voxbatch_cuda_graphs)]
        {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: a device index and an out pointer the shim writes a new c10::Event into;
            // exceptions are caught in C++.
            checked("record a CUDA event", |err, len| unsafe { voxbatch_event_record(_index as i32, &mut ptr, err, len) })?;
            Ok(Some(CudaEvent { ptr }))
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        Ok(None)
    }

    /// Waits until the stream has reached this event.
    pub fn wait(&self) -> Result<(), ShimError> {
        #[cfg(voxbatch_cuda_graphs)]
        // SAFETY: `self.ptr` is a live c10::Event of this value's.
        checked("wait for a CUDA event", |err, len| unsafe { voxbatch_event_synchronize(self.ptr, err, len) })?;
        Ok(())
    }

    /// Seconds of GPU time from this event to `end` (both reached: [`CudaEvent::wait`] on `end` first).
    pub fn seconds_to(&self, end: &CudaEvent) -> Result<f64, ShimError> {
        #[cfg(voxbatch_cuda_graphs)]
        {
            let mut ms = 0.0;
            // SAFETY: both pointers are live c10::Events; exceptions are caught in C++.
            checked("time between CUDA events", |err, len| unsafe { voxbatch_event_elapsed_ms(self.ptr, end.ptr, &mut ms, err, len) })?;
            Ok(ms / 1000.0)
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        {
            let _ = end;
            Ok(0.0)
        }
    }
}

#[cfg(voxbatch_cuda_graphs)]
impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: `self.ptr` came from voxbatch_event_record and is freed once, here.
        unsafe { voxbatch_event_free(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_green_context_leaves_at_least_the_reserved_sms_in_whole_groups_of_eight() {
        // An H100 SXM has 132 SMs.
        assert_eq!(green_sms(132, 16), Some(112), "116 rounds down to whole groups");
        assert_eq!(green_sms(132, 8), Some(120));
        assert_eq!(green_sms(132, 4), Some(128));
        assert_eq!(green_sms(128, 0), Some(128));
        assert_eq!(green_sms(132, 125), None, "7 SMs make no group");
        assert_eq!(green_sms(132, 200), None);
        for (total, reserved) in [(132, 16), (132, 24), (144, 40), (78, 9)] {
            let sms = green_sms(total, reserved).unwrap();
            assert!(total - sms >= reserved && sms % GREEN_GRANULARITY == 0 && total - sms - reserved < GREEN_GRANULARITY);
        }
    }
}
