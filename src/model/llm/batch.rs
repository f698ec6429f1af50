//! The LM's batched decoder: a slot KV cache that lives as long as the worker (sized once from the
//! memory budget), the static input buffers of the decode step, and on CUDA the step captured as a
//! CUDA graph per (rows, span) bucket and replayed every step. Eager libtorch is the fallback: on
//! the CPU, where the build has no CUDA graphs, or when a capture fails.
//!
//! A step runs over the first `rows` slots (row `i` is slot `i`; the generator keeps sequences in
//! the lowest free slots), `rows` rounded up to a bucket (powers of two to 64, then multiples of
//! 64) and the keys read rounded up to a multiple of `qwen2::SPAN_STEP`. Rows of free slots
//! compute what nobody reads; their writes land at position 0 of a free slot, which the next
//! prefill overwrites.
//!
//! Neighbours: `speech_lm` drives it (`SpeechLm::generate`) and is the [`DecodingLm`] it steps; `qwen2::Qwen2::step` is the step;
//! `sampler::draw` runs inside it; `model::cuda_graph` captures and replays.

use std::collections::HashMap;
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::model::layers::R;
use super::cache::SlotCache;
use super::sampler::{draw, uniforms_tensor, SamplingParams};
use crate::model::cuda_graph::CudaGraph;

/// What one decode step leaves for the sampler: log-probabilities `[rows, V]` (fp32) and each
/// row's (nucleus, full-distribution) draws `[rows, 2]`.
pub struct StepOutputs {
    pub logp: Tensor,
    pub picks: Tensor,
}

impl StepOutputs {
    fn shallow_clone(&self) -> StepOutputs {
        StepOutputs { logp: self.logp.shallow_clone(), picks: self.picks.shallow_clone() }
    }
}

/// The inputs of a step over `rows` rows, refilled in place before each run.
struct StepBuffers {
    x: Tensor,
    positions: Tensor,
    uniforms: Tensor,
}

struct Captured {
    graph: CudaGraph,
    out: StepOutputs,
}

/// How the decoder has run so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DecoderStats {
    pub steps: u64,
    pub graph_replays: u64,
    pub graphs_captured: u64,
    pub capture_seconds: f64,
    /// Sequences admitted while others were mid-decode.
    pub refills: u64,
    /// Why graphs are off, when they are.
    pub eager_reason: Option<String>,
    /// Where the wall time of `SpeechLm::generate` went (seconds): admitting (prefill passes and
    /// first draws, synchronised), preparing and launching steps, waiting for each step's picks
    /// (the GPU's step time plus any launch backlog), and the host's bookkeeping between steps
    /// (the GPU idles through it).
    pub prefill_seconds: f64,
    pub launch_seconds: f64,
    pub wait_seconds: f64,
    pub host_seconds: f64,
    /// Prefill passes and the positions they fed.
    pub prefills: u64,
    pub prefill_positions: u64,
}

impl DecoderStats {
    /// These stats with the time and prefill counters of `before` taken off (graph counters and
    /// steps stay totals).
    pub fn timings_since(&self, before: &DecoderStats) -> DecoderStats {
        DecoderStats {
            prefill_seconds: self.prefill_seconds - before.prefill_seconds,
            launch_seconds: self.launch_seconds - before.launch_seconds,
            wait_seconds: self.wait_seconds - before.wait_seconds,
            host_seconds: self.host_seconds - before.host_seconds,
            prefills: self.prefills - before.prefills,
            prefill_positions: self.prefill_positions - before.prefill_positions,
            ..self.clone()
        }
    }
}

/// One step's inputs, row by row (row `i` = slot `i`).
pub struct StepInput<'a> {
    /// Speech token fed to each row (0 for rows of free slots).
    pub tokens: &'a [i64],
    /// Rows fed an embedding other than a speech token's (`[hidden]` each).
    pub embeddings: &'a [(usize, Tensor)],
    /// Each row's position (its slot's length).
    pub positions: &'a [i64],
    /// Each row's (nucleus, full) uniforms.
    pub uniforms: &'a [(f64, f64)],
}

pub struct BatchDecoder {
    pub(super) cache: SlotCache,
    pub(super) params: SamplingParams,
    device: Device,
    graphs_on: bool,
    buffers: HashMap<i64, StepBuffers>,
    captured: HashMap<(i64, i64), Captured>,
    /// The first graph captured; the others share its memory pool (one replay at a time).
    pool_key: Option<(i64, i64)>,
    stats: DecoderStats,
}

/// Rows a step over the first `used` slots runs: `used` rounded up to a power of two up to 64,
/// then to a multiple of 64, at most `slots`.
pub fn rows_for(used: usize, slots: usize) -> i64 {
    let used = used.max(1);
    let rounded = if used <= 64 { used.next_power_of_two() } else { used.div_ceil(64) * 64 };
    rounded.min(slots) as i64
}

/// What the batched decoder needs of a speech-token LM: a slot cache, its device, width and
/// weights' kind, the embeddings of the tokens just drawn, and one decode step's outputs with
/// their draws (device work only, so a step can be captured as a CUDA graph). CosyVoice2's
/// `SpeechLm` implements it; another LM over a Qwen2 backbone (other heads, another input
/// layout) decodes on this same decoder by implementing it too.
pub trait DecodingLm {
    fn new_cache(&self, slots: usize, max_positions: i64) -> R<SlotCache>;
    fn device(&self) -> tch::Device;
    fn kind(&self) -> Kind;
    fn hidden_size(&self) -> i64;
    /// Writes the speech embeddings of `tokens` `[N]` into `out` `[N, hidden]`.
    fn speech_embeddings_into(&self, out: &Tensor, tokens: &Tensor) -> R<Tensor>;
    /// The decode step over the first rows of `cache` and its sampler draws.
    fn step_outputs(&self, cache: &SlotCache, x: &Tensor, positions: &Tensor, uniforms: &Tensor, span: i64, params: &SamplingParams) -> R<StepOutputs>;
}

impl BatchDecoder {
    /// A decoder of `slots` sequences of up to `max_positions` positions each, sampling with
    /// `params`; CUDA graphs on a CUDA device unless `graphs` is false.
    pub fn new(lm: &impl DecodingLm, slots: usize, max_positions: i64, params: SamplingParams, graphs: bool) -> R<BatchDecoder> {
        let cache = lm.new_cache(slots.max(1), max_positions)?;
        let device = lm.device();
        let graphs_on = graphs && device.is_cuda();
        let eager_reason = match (graphs, device.is_cuda()) {
            (false, _) => Some("CUDA graphs disabled".to_string()),
            (true, false) => Some("not a CUDA device".to_string()),
            (true, true) => None,
        };
        Ok(BatchDecoder {
            cache,
            params,
            device,
            graphs_on,
            buffers: HashMap::new(),
            captured: HashMap::new(),
            pool_key: None,
            stats: DecoderStats { eager_reason, ..DecoderStats::default() },
        })
    }

    pub fn slots(&self) -> usize {
        self.cache.slots()
    }
    pub fn max_positions(&self) -> i64 {
        self.cache.max_len()
    }
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }
    pub fn stats(&self) -> &DecoderStats {
        &self.stats
    }
    /// Bytes the KV cache holds.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.bytes()
    }

    /// Runs one step over the first `rows` slots reading `span` positions: writes each row's keys
    /// and values at its position and returns the step's outputs (valid until the next step).
    /// Advancing the slots' lengths is the caller's.
    pub fn step(&mut self, lm: &impl DecodingLm, rows: i64, span: i64, input: &StepInput<'_>) -> R<StepOutputs> {
        if !self.buffers.contains_key(&rows) {
            let h = lm.hidden_size();
            let buffers = StepBuffers {
                x: Tensor::f_zeros([rows, h], (lm.kind(), self.device))?,
                positions: Tensor::f_zeros([rows], (Kind::Int64, self.device))?,
                uniforms: Tensor::f_zeros([rows, 2], (Kind::Float, self.device))?,
            };
            self.buffers.insert(rows, buffers);
        }
        let Some(buf) = self.buffers.get_mut(&rows) else {
            return Err(tch::TchError::Shape(format!("no step buffers for {rows} rows")));
        };
        let tokens = Tensor::f_from_slice(input.tokens)?.f_to_device(self.device)?;
        let _ = lm.speech_embeddings_into(&buf.x, &tokens)?;
        for (row, embedding) in input.embeddings {
            let mut x_row = buf.x.f_get(*row as i64)?;
            x_row.f_copy_(embedding)?;
        }
        buf.positions.f_copy_(&Tensor::f_from_slice(input.positions)?)?;
        buf.uniforms.f_copy_(&uniforms_tensor(input.uniforms, Device::Cpu)?)?;
        self.stats.steps += 1;
        if self.graphs_on {
            match self.replay(lm, rows, span) {
                Ok(out) => return Ok(out),
                Err(e) => {
                    tracing::warn!(error = %e, rows, span, "CUDA graph capture or replay failed; the LM decodes eagerly from now on");
                    self.stats.eager_reason = Some(e.to_string());
                    self.graphs_on = false;
                    self.captured.clear();
                    self.pool_key = None;
                }
            }
        }
        let buf = &self.buffers[&rows];
        lm.step_outputs(&self.cache, &buf.x, &buf.positions, &buf.uniforms, span, &self.params)
    }

    /// Replays the graph of (`rows`, `span`), capturing it first if needed.
    fn replay(&mut self, lm: &impl DecodingLm, rows: i64, span: i64) -> Result<StepOutputs, crate::model::cuda_graph::GraphError> {
        let key = (rows, span);
        if !self.captured.contains_key(&key) {
            let started = Instant::now();
            let buf = &self.buffers[&rows];
            let (cache, params) = (&self.cache, &self.params);
            let share = self.pool_key.and_then(|k| self.captured.get(&k)).map(|c| &c.graph);
            let device = match self.device {
                Device::Cuda(i) => i,
                _ => 0,
            };
            let (graph, out) = CudaGraph::capture(device, share, 1, || lm.step_outputs(cache, &buf.x, &buf.positions, &buf.uniforms, span, params))?;
            self.captured.insert(key, Captured { graph, out });
            self.pool_key.get_or_insert(key);
            self.stats.graphs_captured += 1;
            self.stats.capture_seconds += started.elapsed().as_secs_f64();
        }
        let captured = &self.captured[&key];
        captured.graph.replay()?;
        self.stats.graph_replays += 1;
        Ok(captured.out.shallow_clone())
    }

    /// Benchmarks: the mean seconds of one step over `rows` rows reading `span` positions (every
    /// row at position `span - 1`), run `n` times back to back — graph replays alone on CUDA with
    /// graphs on, so no host work is counted — then synchronised. Clobbers the cache's contents.
    pub fn time_step(&mut self, lm: &impl DecodingLm, rows: i64, span: i64, n: usize) -> R<f64> {
        let r = rows as usize;
        let (tokens, positions, uniforms) = (vec![0i64; r], vec![span - 1; r], vec![(0.5, 0.5); r]);
        let input = StepInput { tokens: &tokens, embeddings: &[], positions: &positions, uniforms: &uniforms };
        self.step(lm, rows, span, &input)?;
        self.synchronize();
        let started = Instant::now();
        for _ in 0..n {
            match self.captured.get(&(rows, span)) {
                Some(c) if self.graphs_on => c.graph.replay()?,
                _ => {
                    let buf = &self.buffers[&rows];
                    lm.step_outputs(&self.cache, &buf.x, &buf.positions, &buf.uniforms, span, &self.params)?;
                }
            }
        }
        self.synchronize();
        Ok(started.elapsed().as_secs_f64() / n.max(1) as f64)
    }

    /// Benchmarks: the mean seconds of the sampler's draws alone over `rows` rows of `vocab`
    /// log-probabilities (captured as a graph when graphs are on), run `n` times.
    pub fn time_sampler(&self, rows: i64, vocab: i64, n: usize) -> R<f64> {
        let logp = Tensor::f_randn([rows, vocab], (Kind::Float, self.device))?.f_log_softmax(-1, Kind::Float)?;
        let uniforms = Tensor::f_rand([rows, 2], (Kind::Float, self.device))?;
        let params = self.params;
        let graph = match (self.graphs_on, self.device) {
            (true, Device::Cuda(i)) => {
                Some(CudaGraph::capture(i, None, 1, || draw(&logp, &uniforms, &params))?.0)
            }
            _ => None,
        };
        self.synchronize();
        let started = Instant::now();
        for _ in 0..n {
            match &graph {
                Some(g) => g.replay()?,
                None => {
                    let _ = draw(&logp, &uniforms, &params)?;
                }
            }
        }
        self.synchronize();
        Ok(started.elapsed().as_secs_f64() / n.max(1) as f64)
    }

    fn synchronize(&self) {
        if let Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
    }

    pub(super) fn count_refill(&mut self) {
        self.stats.refills += 1;
    }
    pub(super) fn stats_mut(&mut self) -> &mut DecoderStats {
        &mut self.stats
    }

}
