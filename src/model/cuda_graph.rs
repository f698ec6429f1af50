//! CUDA graphs through the C++ shim (`csrc/cuda_graph.cpp`, `at::cuda::CUDAGraph`): capture a
//! closure's kernels once, replay them with one launch. Decode steps of the speech-token LM are
//! launch-bound in eager libtorch (≈ 10 ms a step whatever the batch); replayed, they cost what
//! their memory traffic costs.
//!
//! A graph replays the exact kernels it captured on the exact buffers they used: the caller keeps
//! the input tensors the closure read (and refills them in place before each replay) and the
//! output tensors it returned (read them after each replay). Capture runs the closure on the
//! graph's side stream (after `warmups` eager runs there, as `torch.cuda.graph` does) in
//! thread-local capture mode; nothing in the closure may copy to or from the host.
//!
//! Without the CUDA runtime headers at build time (see build.rs) every capture fails with
//! [`GraphError::Unavailable`] and callers run eagerly.
//!
//! Neighbours: `shim` (the other libtorch calls tch lacks); `llm::batch` captures the LM decode step with it.

use std::ffi::{c_char, c_void};

use super::shim::{checked, ShimError};

/// Why a graph could not be captured or replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    #[error("CUDA graphs are not available in this build (no CUDA runtime headers next to libtorch)")]
    Unavailable,
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error("the captured computation failed: {0}")]
    Captured(#[source] tch::TchError),
}

#[cfg(voxbatch_cuda_graphs)]
extern "C" {
    fn voxbatch_graph_new(device: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_graph_free(g: *mut c_void);
    fn voxbatch_graph_enter(g: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_graph_leave(g: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_graph_capture_begin(g: *mut c_void, share: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_graph_capture_end(g: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_graph_replay(g: *mut c_void, err: *mut c_char, err_len: usize) -> i32;
}

/// A captured CUDA graph.
pub struct CudaGraph {
    ptr: *mut c_void,
}

// SAFETY: the graph is an owned C++ object with no thread affinity (replays use the calling
// thread's current stream); it is used from one thread at a time through `&self`/`&mut self`.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Captures `f` on CUDA device `device`, after `warmups` eager runs of it; the graph shares
    /// `share`'s memory pool when given (graphs replayed one at a time may). Returns the graph and
    /// what the captured run of `f` returned (the output buffers replays rewrite).
    #[cfg(voxbatch_cuda_graphs)]
    pub fn capture<T>(
        device: usize,
        share: Option<&CudaGraph>,
        warmups: usize,
        mut f: impl FnMut() -> Result<T, tch::TchError>,
    ) -> Result<(CudaGraph, T), GraphError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes a new graph's pointer into `ptr`; exceptions are caught in C++.
        checked("create a CUDA graph", |err, len| unsafe { voxbatch_graph_new(device as i32, &mut ptr, err, len) })?;
        let graph = CudaGraph { ptr };
        // SAFETY: `graph.ptr` is a live graph; enter/leave are paired below on every path.
        checked("enter the capture stream", |err, len| unsafe { voxbatch_graph_enter(graph.ptr, err, len) })?;
        let captured = graph.capture_entered(share, warmups, &mut f);
        // SAFETY: as above.
        let left = checked("leave the capture stream", |err, len| unsafe { voxbatch_graph_leave(graph.ptr, err, len) });
        let out = captured?;
        left?;
        Ok((graph, out))
    }

    #[cfg(voxbatch_cuda_graphs)]
    fn capture_entered<T>(
        &self,
        share: Option<&CudaGraph>,
        warmups: usize,
        f: &mut impl FnMut() -> Result<T, tch::TchError>,
    ) -> Result<T, GraphError> {
        for _ in 0..warmups {
            f().map_err(GraphError::Captured)?;
        }
        let share = share.map_or(std::ptr::null_mut(), |g| g.ptr);
        // SAFETY: both pointers are live graphs (or null); exceptions are caught in C++.
        checked("begin a CUDA graph capture", |err, len| unsafe { voxbatch_graph_capture_begin(self.ptr, share, err, len) })?;
        let out = f();
        // The capture is ended whatever `f` did, so the stream and the allocator leave capture mode.
        // SAFETY: as above.
        let ended = checked("end a CUDA graph capture", |err, len| unsafe { voxbatch_graph_capture_end(self.ptr, err, len) });
        let out = out.map_err(GraphError::Captured)?;
        ended?;
        Ok(out)
    }

    #[cfg(not(voxbatch_cuda_graphs))]
    pub fn capture<T>(
        _device: usize,
        _share: Option<&CudaGraph>,
        _warmups: usize,
        _f: impl FnMut() -> Result<T, tch::TchError>,
    ) -> Result<(CudaGraph, T), GraphError> {
        Err(GraphError::Unavailable)
    }

    /// Runs the captured kernels again on the current stream.
    pub fn replay(&self) -> Result<(), ShimError> {
        #[cfg(voxbatch_cuda_graphs)]
        {
            // SAFETY: `self.ptr` is a live, captured graph; exceptions are caught in C++.
            checked("replay a CUDA graph", |err, len| unsafe { voxbatch_graph_replay(self.ptr, err, len) })
        }
        #[cfg(not(voxbatch_cuda_graphs))]
        {
            Err(ShimError { call: "replay a CUDA graph", message: "CUDA graphs are not available in this build".into() })
        }
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        #[cfg(voxbatch_cuda_graphs)]
        // SAFETY: `self.ptr` came from voxbatch_graph_new and is freed once, here.
        unsafe {
            voxbatch_graph_free(self.ptr)
        };
    }
}

/// Inside tch code (benchmarks timing a graph), a graph failure is a libtorch error like any other.
impl From<GraphError> for tch::TchError {
    fn from(e: GraphError) -> tch::TchError {
        tch::TchError::Torch(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};
    // The replay test needs a GPU: tests/cosyvoice2_llm_parity.rs (ignored, run on the device).

    #[test]
    fn a_failing_capture_is_an_error_not_a_crash() {
        // Without a CUDA device creation fails; with one the closure does: an error either way.
        let r = CudaGraph::capture(0, None, 0, || Tensor::f_zeros([2], (Kind::Float, Device::Cpu))?.f_view([3]));
        assert!(r.is_err());
    }
}
