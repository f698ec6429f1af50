//! CUDA graphs of the flow's estimator step, for small token2wav batches: where launches, not the
//! GPU, set the pace. A compiled estimator call launches ≈ 700 kernels; on the H200 a bucket of
//! short segments took ≈ 18 ms a step whatever its size (the 2026-12-04 corpus run: 36
//! buckets with flow steps of 150–300 ms, 13 s of a 137-s drain, NVML at 40–70 % through them).
//! Replayed as one graph, a step costs what its kernels cost.
//!
//! One graph per step shape (rows of the doubled batch, mel frames) up to `max_frames` rows ×
//! frames, captured the first time a batch of that shape runs (one eager warm-up call, then the
//! capture: a step's launch time, then every step of the batch replays) and kept, least recently
//! used first out, up to `graphs` of them; all share one memory pool (replays run one at a time on
//! the model's stream, and each step's output is consumed before the next replay). A graph reads
//! its own input buffers: each batch copies its constant inputs (mask, mu, speakers, prompt mel) in
//! once and each step its `x` and `t`. On the CPU, with `graphs = 0`, or once a capture has failed
//! (a warning says why), every step runs as before: graphs are an optimisation, never a failure.
//! A capture that runs out of memory is tried once more after the caching allocator's unused
//! blocks go back to the driver (the graphs' pool cannot take them).
//!
//! Memory: per graph its input buffers and output (4 × rows × frames × 80 fp32 ≈ 42 MB at the
//! default limit), and the shared pool holds one call's activations at the largest captured shape;
//! the batch sizing leaves the most that can come to aside where an estimator package is there to
//! capture ([`FlowGraphSettings::reserve_bytes`], ≈ 1.2 GB at the defaults), and a token2wav
//! out-of-memory error drops them all (`Token2Wav::release_cached`: from a text batch's bucket
//! and, through `Synthesizer::release_memory`, after any whole batch on the model thread).
//!
//! Neighbours: `cosyvoice2::flow` and `cosyvoice3::flow` (their Euler loops call
//! [`FlowGraphs::step`]: both families' estimator packages take the same six inputs),
//! `model::cuda_graph` (capture and replay), `model::compiled` (the package a graph captures).

use std::collections::HashMap;
use std::time::Instant;

use tch::{Kind, TchError, Tensor};

use crate::model::compiled::CompiledPackage;
use crate::model::cuda_graph::CudaGraph;
use crate::model::Device;

pub use crate::config::FlowGraphSettings;


/// What the graphs did since the flow loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FlowGraphStats {
    pub captured: u64,
    pub replays: u64,
    /// Seconds spent capturing (warm-up call and capture).
    pub capture_seconds: f64,
    pub evicted: u64,
}

impl FlowGraphStats {
    pub fn add(&mut self, other: &FlowGraphStats) {
        self.captured += other.captured;
        self.replays += other.replays;
        self.capture_seconds += other.capture_seconds;
        self.evicted += other.evicted;
    }
}

/// One captured estimator step.
struct StepGraph {
    graph: CudaGraph,
    /// What the captured call reads, in the package's order: x, mask, mu, t, spks, cond.
    inputs: [Tensor; 6],
    /// What it writes (fp32), rewritten by every replay.
    out: Tensor,
    last_used: u64,
}

/// Input positions the flow's Euler loop changes every step (the rest: once per batch).
const X: usize = 0;
const T: usize = 3;

pub struct FlowGraphs {
    settings: FlowGraphSettings,
    /// The CUDA device graphs are captured on; `None` on the CPU.
    device: Option<usize>,
    graphs: HashMap<(i64, i64), StepGraph>,
    clock: u64,
    /// A capture failed: no more are tried.
    failed: bool,
    stats: FlowGraphStats,
}

impl FlowGraphs {
    pub fn new(settings: FlowGraphSettings, device: Device) -> FlowGraphs {
        let device = match device {
            Device::Cuda(i) => Some(i),
            Device::Cpu => None,
        };
        FlowGraphs { settings, device, graphs: HashMap::new(), clock: 0, failed: false, stats: FlowGraphStats::default() }
    }

    pub fn off() -> FlowGraphs {
        FlowGraphs::new(FlowGraphSettings::OFF, Device::Cpu)
    }

    /// Whether steps of `rows` × `frames` run as graphs (captured or to be).
    pub fn wants(&self, rows: i64, frames: i64) -> bool {
        wanted(&self.settings, self.device.is_some() && !self.failed, rows, frames)
    }

    pub fn stats(&self) -> FlowGraphStats {
        self.stats
    }

    /// Drops every graph and its memory (after an out-of-memory error); they are captured again
    /// as batches need them.
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// One estimator step of `package` on `inputs` (x, mask, mu, t, spks, cond: the package's
    /// order) through the graph of their shapes — captured now if it is new; `first`: the batch's
    /// first step, whose constant inputs are copied in. `Ok(None)`: no graph serves (off, too
    /// large, or a capture just failed): run the step as before. The output is the graph's buffer,
    /// rewritten by the next replay of any graph: consume it first.
    pub fn step(&mut self, package: &CompiledPackage, inputs: [&Tensor; 6], first: bool) -> Result<Option<Tensor>, TchError> {
        let (rows, _, frames) = inputs[X].size3()?;
        if !self.wants(rows, frames) {
            return Ok(None);
        }
        self.clock += 1;
        let key = (rows, frames);
        let fresh = !self.graphs.contains_key(&key);
        if fresh && !self.capture(package, key, &inputs)? {
            return Ok(None);
        }
        let Some(g) = self.graphs.get_mut(&key) else { return Ok(None) };
        g.last_used = self.clock;
        // A graph just captured holds this batch's inputs already; otherwise copy them in.
        if !fresh {
            for (i, (buffer, input)) in g.inputs.iter_mut().zip(inputs).enumerate() {
                if first || i == X || i == T {
                    buffer.f_copy_(input)?;
                }
            }
        }
        g.graph.replay().map_err(|e| TchError::Torch(e.to_string()))?;
        self.stats.replays += 1;
        Ok(Some(g.out.shallow_clone()))
    }

    /// Captures the step of `key`'s shapes on buffers holding `inputs`, after making room.
    /// `Ok(false)`: the capture failed, graphs are off from now on (warned once).
    fn capture(&mut self, package: &CompiledPackage, key: (i64, i64), inputs: &[&Tensor; 6]) -> Result<bool, TchError> {
        let Some(device) = self.device else { return Ok(false) };
        while self.graphs.len() >= self.settings.graphs.max(1) {
            let Some(oldest) = self.graphs.iter().min_by_key(|(_, g)| g.last_used).map(|(k, _)| *k) else { break };
            self.graphs.remove(&oldest);
            self.stats.evicted += 1;
        }
        let started = Instant::now();
        // The buffers the graph reads: dense fp32 copies (the package's inputs as it takes them),
        // allocated outside the capture.
        let buffers = inputs
            .iter()
            .map(|t| {
                let t = if t.is_floating_point() { t.f_to_kind(Kind::Float)? } else { t.shallow_clone() };
                let mut buffer = t.f_contiguous()?.f_zeros_like()?;
                buffer.f_copy_(&t)?;
                Ok(buffer)
            })
            .collect::<Result<Vec<Tensor>, TchError>>()?;
        let inputs: [Tensor; 6] = match buffers.try_into() {
            Ok(b) => b,
            Err(_) => return Ok(false),
        };
        let attempt = |graphs: &HashMap<(i64, i64), StepGraph>| {
            let share = graphs.values().next().map(|g| &g.graph);
            CudaGraph::capture(device, share, 1, || {
                let refs: Vec<&Tensor> = inputs.iter().collect();
                package
                    .run(&refs)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| TchError::Torch("the compiled estimator returned nothing".into()))?
                    .f_to_kind(Kind::Float)
            })
        };
        let mut captured = attempt(&self.graphs);
        if let Err(e) = &captured {
            // A capture allocates from the graphs' own pool, which cannot take the blocks the
            // caching allocator holds for other work, nor free them mid-capture: on an H100
            // (2026-12-08) one failed with 60.7 GiB reserved but unallocated. Those blocks go
            // back to the driver and the capture is tried once more.
            if captured_out_of_memory(e) {
                tracing::info!(rows = key.0, frames = key.1, "capturing a flow step ran out of memory: the allocator's cached blocks go back to the driver, the capture is tried again");
                crate::torch_shim::cuda_empty_cache();
                captured = attempt(&self.graphs);
            }
        }
        match captured {
            Ok((graph, out)) => {
                self.stats.captured += 1;
                self.stats.capture_seconds += started.elapsed().as_secs_f64();
                tracing::debug!(rows = key.0, frames = key.1, ms = started.elapsed().as_millis() as u64, "flow step graph captured");
                self.graphs.insert(key, StepGraph { graph, inputs, out, last_used: self.clock });
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = key.0, frames = key.1, "capturing a flow step as a CUDA graph failed: flow steps run without graphs from now on");
                self.failed = true;
                self.graphs.clear();
                Ok(false)
            }
        }
    }
}

/// Whether a capture failed for want of memory (sorted as every libtorch error is).
fn captured_out_of_memory(e: &crate::model::cuda_graph::GraphError) -> bool {
    crate::model::torchscript::classify(TchError::Torch(e.to_string()), 0).is_oom()
}

/// Whether a step of `rows` × `frames` is within `settings` (graphs `on` for this device).
fn wanted(settings: &FlowGraphSettings, on: bool, rows: i64, frames: i64) -> bool {
    on && settings.graphs > 0 && rows.saturating_mul(frames) <= settings.max_frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_steps_on_a_gpu_with_graphs_allowed_run_as_graphs() {
        let s = FlowGraphSettings { graphs: 16, max_frames: 32_768 };
        assert!(wanted(&s, true, 256, 128), "at the limit");
        assert!(!wanted(&s, true, 256, 136), "past it");
        assert!(!wanted(&s, false, 2, 64), "not on this device");
        assert!(!wanted(&FlowGraphSettings { graphs: 0, ..s }, true, 2, 64), "none allowed");
        assert!(!FlowGraphs::new(s, Device::Cpu).wants(2, 64), "never on the CPU");
        assert!(FlowGraphs::new(s, Device::Cuda(0)).wants(2, 64));
    }

    #[test]
    fn a_capture_that_ran_out_of_memory_is_told_from_other_failures() {
        use crate::model::cuda_graph::GraphError;
        let oom = GraphError::Captured(TchError::Torch("libtorch run package failed: CUDA out of memory inside the compiled package".into()));
        assert!(captured_out_of_memory(&oom));
        assert!(!captured_out_of_memory(&GraphError::Unavailable));
        assert!(!captured_out_of_memory(&GraphError::Captured(TchError::Torch("CUDA error: operation not permitted when stream is capturing".into()))));
    }

    #[test]
    fn the_memory_graphs_may_hold_is_their_buffers_and_one_calls_activations() {
        let s = FlowGraphSettings { graphs: 16, max_frames: 32_768 };
        assert_eq!(s.reserve_bytes(), 16 * 4 * 32_768 * 80 * 4 + 32_768 * 16 * 1024);
        assert_eq!(FlowGraphSettings::OFF.reserve_bytes(), 0);
    }
}
