//! CosyVoice3's flow, `CausalMaskedDiffWithDiT.inference` (cosyvoice/flow/flow.py; offline:
//! `streaming=False`, `finalize=True`), batched: speech tokens (after an optional prompt) and a
//! speaker x-vector → mel `[80, 2·tokens]` per item. (Upstream asserts a batch of one.)
//!
//! Token embedding (80 wide, × the length mask) → `PreLookaheadLayer` (`model::pre_lookahead`)
//! → each frame repeated ×2 = mu; the x-vector L2-normalised and projected to 80; the prompt's mel
//! conditions the first frames. Then `CausalConditionalCFM` (`model::flow_matching`): from the
//! model's fixed noise, 10 Euler steps on the cosine schedule, each one [`Dit`] call on the doubled
//! batch for guidance (0.7); the estimator's inputs typed as the speaker projection's output, as
//! upstream's buffers are (fp16 under its autocast). The prompt's frames are cut from the output.
//!
//! Batching: tokens past an item's end embed to zero (its look-ahead reads zeros, as alone), mu is
//! zero past its frames, the mel is padded to a multiple of `FRAME_MULTIPLE` frames, the mask
//! hides the padding from attention, and the noise is the same prefix for every item.
//!
//! The DiT's steps run through a compiled package (`model::compiled`, stage `estimator`:
//! tools/compile/families/cosyvoice3/dit.py, the same six inputs as CosyVoice2's) when the model
//! directory has one for this machine and the doubled batch fits it, else eager; on CUDA a small
//! batch's compiled steps replay as CUDA graphs (`model::flow_graphs`, off until
//! [`Flow::set_graphs`]). The package takes fp32 and computes at its precision inside (autocast);
//! its velocities are given back in the eager DiT's dtype (the inputs', [`Flow::solve`]), so
//! guidance rounds as the eager steps do.

use std::cell::RefCell;

use tch::{Kind, TchError, Tensor};

use super::dit::{Dit, DitDims, Frames};
use crate::model::compiled::{CompiledStage, KernelCounts};
use crate::model::flow_graphs::{FlowGraphSettings, FlowGraphStats, FlowGraphs};
use crate::model::flow_matching::{padded_frames, solve_euler, Doubled, EulerCfg};
use crate::model::layers::{length_mask, Linear, R};
use crate::model::pre_lookahead::PreLookahead;
use crate::model::token2wav::FlowItem;
use crate::model::weights::Weights;

/// The flow's dimensions (`[cosyvoice3]`).
pub struct FlowDims {
    pub vocab_size: i64,
    pub lookahead: i64,
    pub lookahead_channels: i64,
    pub dit: DitDims,
    pub steps: usize,
    pub cfg_rate: f64,
}

/// Mel bins, the token embedding's width.
const MEL: i64 = 80;

/// What runs the DiT's calls on one batch's shapes: the compiled package, or the eager port with
/// its attention's frames made once.
enum Runs<'a> {
    Compiled(&'a CompiledStage),
    Eager(Frames),
}

pub struct Flow {
    embedding: Tensor,
    spk_affine: Linear,
    pub pre_lookahead: PreLookahead,
    pub dit: Dit,
    noise: Tensor,
    sampler: EulerCfg,
    /// The DiT compiled (AOTInductor), when the model directory has a package for this machine;
    /// the eager `dit` otherwise and for batches outside the package's shapes.
    compiled: Option<CompiledStage>,
    /// Small batches' compiled steps as CUDA graphs (off until [`Flow::set_graphs`]).
    graphs: RefCell<FlowGraphs>,
    /// DiT steps run (compiled, eager) since the last `take_step_counts`.
    steps_run: KernelCounts,
}

impl Flow {
    pub fn new(w: &Weights, d: &FlowDims) -> Flow {
        Flow {
            embedding: w.get("flow.input_embedding.weight", &[d.vocab_size, MEL]),
            spk_affine: Linear::new(w, "flow.spk_embed_affine_layer", 192, MEL, true),
            pre_lookahead: PreLookahead::new(w, "flow.pre_lookahead_layer", MEL, d.lookahead_channels, d.lookahead),
            dit: Dit::new(w, "flow.decoder.estimator", d.dit),
            noise: w.get("flow.rand_noise", &[1, MEL, 15000]),
            sampler: EulerCfg { steps: d.steps, cfg_rate: d.cfg_rate },
            compiled: None,
            graphs: RefCell::new(FlowGraphs::off()),
            steps_run: KernelCounts::default(),
        }
    }

    /// Runs the DiT's steps through `compiled` (or the eager port again with `None`).
    pub fn set_compiled(&mut self, compiled: Option<CompiledStage>) {
        self.compiled = compiled;
    }

    /// Whether the DiT runs compiled (for batches within the package's shapes).
    pub fn is_compiled(&self) -> bool {
        self.compiled.is_some()
    }

    /// Replays small batches' compiled steps as CUDA graphs on `device` as `settings` allow
    /// (nothing on the CPU, nor without a package).
    pub fn set_graphs(&mut self, settings: FlowGraphSettings, device: crate::model::Device) {
        self.graphs = RefCell::new(FlowGraphs::new(settings, device));
    }

    /// What the step graphs did since the flow loaded.
    pub fn graph_stats(&self) -> FlowGraphStats {
        self.graphs.borrow().stats()
    }

    /// Drops the captured step graphs and their memory (after an out-of-memory error).
    pub fn clear_graphs(&self) {
        self.graphs.borrow_mut().clear();
    }

    pub fn vocab_size(&self) -> i64 {
        self.embedding.size()[0]
    }

    /// Longest mel (frames, prompt included) the fixed noise covers: 300 s.
    pub fn max_frames(&self) -> i64 {
        self.noise.size()[2]
    }

    /// DiT steps run (compiled, eager) since the last call.
    pub fn take_step_counts(&self) -> (u64, u64) {
        self.steps_run.take()
    }

    /// The token embedding of each item's prompt and speech tokens, padded: `[B, N, 80]`, zero
    /// past each item's tokens; and the tokens per item.
    pub fn embed(&self, items: &[FlowItem]) -> R<(Tensor, Vec<i64>)> {
        let device = self.embedding.device();
        let lens: Vec<i64> = items.iter().map(|i| (i.tokens.len() + i.prompt_tokens.len()) as i64).collect();
        let n = lens.iter().copied().max().unwrap_or(1).max(1);
        let mut flat = vec![0i64; items.len() * n as usize];
        for (row, item) in items.iter().enumerate() {
            let start = row * n as usize;
            let p = item.prompt_tokens.len();
            flat[start..start + p].copy_from_slice(item.prompt_tokens);
            flat[start + p..start + p + item.tokens.len()].copy_from_slice(item.tokens);
        }
        let tokens = Tensor::f_from_slice(&flat)?.f_view([items.len() as i64, n])?.f_to_device(device)?;
        let mask = length_mask(&lens, n, device)?;
        let e = Tensor::f_embedding(&self.embedding, &tokens.f_clamp_min(0)?, -1, false, false)?.f_mul(&mask.f_unsqueeze(-1)?)?;
        Ok((e, lens))
    }

    /// The pre-lookahead layer's output `[B, N, 80]` (from [`Flow::embed`]) repeated ×2 in time:
    /// mu `[B, 80, 2N]`, zero past each item's `2 · tokens` frames; and the frames per item.
    pub fn mu(&self, pre: &Tensor, token_lens: &[i64]) -> R<(Tensor, Vec<i64>)> {
        let mel_lens: Vec<i64> = token_lens.iter().map(|l| 2 * l).collect();
        let mu = pre.f_repeat_interleave_self_int(2, 1, None)?.f_transpose(1, 2)?;
        let frames = mu.size3()?.2;
        let mask = length_mask(&mel_lens, frames, mu.device())?.f_unsqueeze(1)?;
        Ok((mu.f_mul(&mask)?, mel_lens))
    }

    /// Embedding, pre-lookahead, ×2: mu `[B, 80, 2N]` and the mel frames per item (prompt included).
    pub fn encode(&self, items: &[FlowItem]) -> R<(Tensor, Vec<i64>)> {
        let (e, lens) = self.embed(items)?;
        self.mu(&self.pre_lookahead.forward(&e)?, &lens)
    }

    /// Encoder stage, then sampling: per item the mel `[80, frames]` without the prompt frames.
    pub fn forward(&self, items: &[FlowItem]) -> R<Vec<Tensor>> {
        self.sample(items, &self.encode(items)?)
    }

    /// Flow matching from [`Flow::encode`]'s output: per item its generated frames `[80, 2·tokens]`.
    pub fn sample(&self, items: &[FlowItem], encoded: &(Tensor, Vec<i64>)) -> R<Vec<Tensor>> {
        let device = self.embedding.device();
        let b = items.len() as i64;
        let (mu, mel_lens) = encoded;
        let (_, _, longest) = mu.size3()?;
        let frames = padded_frames(longest, self.max_frames());
        let mu = mu.f_constant_pad_nd([0, frames - longest])?;
        let embeddings = items.iter().map(|i| i.embedding.f_to_kind(Kind::Float)).collect::<R<Vec<_>>>()?;
        let spks = self.speakers(&Tensor::f_stack(&embeddings, 0)?.f_to_device(device)?)?;
        // The prompt's mel conditions the first frames.
        let cond = Tensor::f_zeros([b, frames, MEL], (Kind::Float, device))?;
        for (row, item) in items.iter().enumerate() {
            let p = item.prompt_feat.size().first().copied().unwrap_or(0);
            if p > 0 {
                let mut rows = cond.f_get(row as i64)?.f_narrow(0, 0, p)?;
                rows.f_copy_(&item.prompt_feat.f_to_device(device)?)?;
            }
        }
        let cond = cond.f_transpose(1, 2)?.f_contiguous()?;
        let mask = length_mask(mel_lens, frames, device)?.f_unsqueeze(1)?;
        let x = self.solve(&mu, &mask, &spks, &cond)?;
        items
            .iter()
            .enumerate()
            .map(|(row, item)| {
                let p = 2 * item.prompt_tokens.len() as i64;
                x.f_get(row as i64)?.f_narrow(1, p, 2 * item.tokens.len() as i64)
            })
            .collect()
    }

    /// `spk_embed_affine_layer(F.normalize(embedding, dim=1))`: x-vectors `[B, 192]` → `[B, 80]`.
    pub fn speakers(&self, embeddings: &Tensor) -> R<Tensor> {
        let norm = embeddings.f_norm_scalaropt_dim(2.0, [1], true)?.f_clamp_min(1e-12)?;
        self.spk_affine.forward(&embeddings.f_div(&norm)?)
    }

    /// `CausalConditionalCFM.forward` + `solve_euler` on a batch: `mu`, `cond` `[B, 80, T]`,
    /// `mask` `[B, 1, T]`, `spks` `[B, 80]`, from the fixed noise's first `T` frames → the last
    /// step's mel `[B, 80, T]` (fp32, prompt frames included). Each step through the compiled
    /// package when the doubled batch fits it (a small batch's as a replayed graph), else eager.
    pub fn solve(&self, mu: &Tensor, mask: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let (b, _, frames) = mu.size3()?;
        let z = self.noise.f_narrow(2, 0, frames)?.f_expand([b, MEL, frames], false)?.f_to_kind(mu.kind())?;
        // Upstream's buffers are typed as the speaker projection's output: under autocast, its dtype.
        let doubled = Doubled::new(mask, mu, spks, cond, Some(spks.kind()))?;
        // Every step runs on the same shapes: the package, or the eager port with its frames made once.
        let runs = self.runs(2 * b, frames, &doubled.mask)?;
        let mut graphs = self.graphs.borrow_mut();
        solve_euler(&self.sampler, z, &doubled, |step, x_in, t_in| {
            self.steps_run.count(matches!(runs, Runs::Compiled(_)));
            match &runs {
                Runs::Compiled(c) => {
                    let inputs = [x_in, &doubled.mask, &doubled.mu, t_in, &doubled.spks, &doubled.cond];
                    match graphs.step(&c.package, inputs, step == 1)? {
                        Some(v) => v.f_to_kind(x_in.kind()),
                        None => run_package(c, &inputs),
                    }
                }
                Runs::Eager(attention) => self.dit.forward_with(x_in, &doubled.mu, t_in, &doubled.spks, &doubled.cond, attention),
            }
        })
    }

    /// One DiT call as a step of [`Flow::solve`] makes it (the doubled batch's `x`, `mask`, `mu`,
    /// `t`, `spks`, `cond`, all in the eager DiT's input dtype) — through the compiled package when
    /// it has one for these shapes, the eager port otherwise — in that dtype. (Stage checks.)
    pub fn estimate(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let (rows, _, frames) = x.size3()?;
        let runs = self.runs(rows, frames, mask)?;
        self.steps_run.count(matches!(runs, Runs::Compiled(_)));
        match &runs {
            Runs::Compiled(c) => run_package(c, &[x, mask, mu, t, spks, cond]),
            Runs::Eager(attention) => self.dit.forward_with(x, mu, t, spks, cond, attention),
        }
    }

    /// What runs the DiT on `rows` × `frames`: the package if it takes them, else the eager port.
    fn runs(&self, rows: i64, frames: i64, mask: &Tensor) -> R<Runs<'_>> {
        Ok(match self.compiled.as_ref().filter(|c| c.fits(rows, frames)) {
            Some(c) => Runs::Compiled(c),
            None => Runs::Eager(self.dit.frames(mask)?),
        })
    }
}

/// The DiT package on a step's six inputs (x, mask, mu, t, spks, cond). Its output, fp32, in the
/// eager DiT's dtype again (`x`'s: its last projection's under autocast; exact, as the package
/// rounds there too), so that guidance rounds as after an eager step.
fn run_package(c: &CompiledStage, inputs: &[&Tensor; 6]) -> R<Tensor> {
    let v = c.package.run(inputs)?.into_iter().next().ok_or_else(|| TchError::Torch("the compiled DiT returned nothing".into()))?;
    v.f_to_kind(inputs[0].kind())
}
