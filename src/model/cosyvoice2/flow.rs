//! CosyVoice2's flow, `CausalMaskedDiffWithXvec.inference`, batched: speech tokens (with an optional
//! prompt) and a speaker x-vector → mel `[80, 2·tokens]` per item.
//!
//! Token embedding → [`Encoder`] → projection to 80 (`mu`; the two as one compiled package where
//! the model directory has one) → conditional flow matching: from the
//! model's fixed noise, `steps` Euler steps on a cosine time schedule, each one estimator call on a
//! doubled batch (conditioned ‖ unconditioned) for classifier-free guidance. Prompt mel frames
//! condition the first frames and are cut from the output. The batch's mel is padded to a
//! multiple of [`FRAME_MULTIPLE`] frames: every layer is causal or masked, so padding changes no
//! item's frames, and attention bias rows of that length need no aligned copy. Small batches'
//! compiled steps replay as CUDA graphs (`flow_graphs`), where launches would set the pace.

use std::cell::RefCell;

use tch::{Kind, Tensor};

use super::encoder::Encoder;
use crate::model::flow_matching::{solve_euler, Doubled, EulerCfg};
use super::estimator::{Estimator, EstimatorDims, Frames};
use crate::model::flow_graphs::{FlowGraphSettings, FlowGraphStats, FlowGraphs};
use crate::model::layers::{length_mask, Linear, R};
use crate::model::weights::Weights;
use crate::model::compiled::{CompiledStage, KernelCounts};

pub use crate::model::flow_matching::{padded_frames, FRAME_MULTIPLE};

pub use crate::model::token2wav::FlowItem;

pub struct FlowDims {
    pub vocab_size: i64,
    pub encoder_heads: i64,
    pub encoder_units: i64,
    pub encoder_blocks: usize,
    pub encoder_up_blocks: usize,
    pub estimator: EstimatorDims,
    pub steps: usize,
    pub cfg_rate: f64,
}

/// What runs the estimator's calls on one batch's shapes: the compiled package, or the eager port
/// with its attention layout made once.
enum Runs<'a> {
    Compiled(&'a CompiledStage),
    Eager(Frames),
}

pub struct Flow {
    embedding: Tensor,
    spk_affine: Linear,
    encoder: Encoder,
    encoder_proj: Linear,
    pub estimator: Estimator,
    /// The estimator compiled (AOTInductor), when the model directory has a package for this
    /// machine; the eager `estimator` otherwise and for batches outside the package's shapes.
    compiled: Option<CompiledStage>,
    /// The encoder stage (encoder and `encoder_proj`) compiled, likewise; its lengths are tokens.
    compiled_encoder: Option<CompiledStage>,
    /// Encoder calls and estimator steps run (compiled, eager) since the last `take_step_counts`.
    steps_run: KernelCounts,
    /// Small batches' compiled steps as CUDA graphs (off until [`Flow::set_graphs`]).
    graphs: RefCell<FlowGraphs>,
    noise: Tensor,
    sampler: EulerCfg,
}

impl Flow {
    pub fn new(w: &Weights, d: &FlowDims) -> Flow {
        Flow {
            embedding: w.get("flow.input_embedding.weight", &[d.vocab_size, 512]),
            spk_affine: Linear::new(w, "flow.spk_embed_affine_layer", 192, 80, true),
            encoder: Encoder::new(w, "flow.encoder", d.encoder_heads, d.encoder_units, d.encoder_blocks, d.encoder_up_blocks),
            encoder_proj: Linear::new(w, "flow.encoder_proj", 512, 80, true),
            estimator: Estimator::new(w, "flow.decoder.estimator", d.estimator),
            compiled: None,
            compiled_encoder: None,
            steps_run: KernelCounts::default(),
            graphs: RefCell::new(FlowGraphs::off()),
            noise: w.get("flow.rand_noise", &[1, 80, 15000]),
            sampler: EulerCfg { steps: d.steps, cfg_rate: d.cfg_rate },
        }
    }

    /// The encoder's and its output projection's parameters in `kind`, the autocast dtype every
    /// call of [`Flow::encode`] then runs under (`Token2Wav::in_flow_precision`): see
    /// `Encoder::cast_for_autocast`.
    pub fn cast_encoder_for_autocast(&mut self, kind: Kind) -> R<()> {
        self.encoder.cast_for_autocast(kind)?;
        self.encoder_proj.cast_for_autocast(kind)
    }

    /// Runs the estimator's steps through `compiled` (or the eager port again with `None`).
    pub fn set_compiled(&mut self, compiled: Option<CompiledStage>) {
        self.compiled = compiled;
    }

    /// Runs the encoder stage through `compiled` (or the eager port again with `None`).
    pub fn set_compiled_encoder(&mut self, compiled: Option<CompiledStage>) {
        self.compiled_encoder = compiled;
    }

    /// Whether the encoder stage runs compiled (for batches within the package's shapes).
    pub fn encoder_is_compiled(&self) -> bool {
        self.compiled_encoder.is_some()
    }

    /// Replays small batches' compiled steps as CUDA graphs on `device` as `settings` allow
    /// (dropping any captured before).
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

    /// Whether the estimator runs compiled (for batches within the package's shapes).
    pub fn is_compiled(&self) -> bool {
        self.compiled.is_some()
    }

    /// Encoder calls and estimator steps run (compiled, eager) since the last call.
    pub fn take_step_counts(&self) -> (u64, u64) {
        self.steps_run.take()
    }

    /// Longest mel (frames, prompt included) the fixed noise covers: 300 s.
    pub fn max_frames(&self) -> i64 {
        self.noise.size()[2]
    }

    /// Encoder stage: `[B, T_mel, 80]` mu and the mel lengths (prompt included).
    pub fn encode(&self, items: &[FlowItem]) -> R<(Tensor, Vec<i64>)> {
        let device = self.embedding.device();
        let lens: Vec<i64> = items.iter().map(|i| (i.tokens.len() + i.prompt_tokens.len()) as i64).collect();
        let t = lens.iter().copied().max().unwrap_or(1).max(1);
        let mut flat = vec![0i64; items.len() * t as usize];
        for (row, item) in items.iter().enumerate() {
            let start = row * t as usize;
            let p = item.prompt_tokens.len();
            flat[start..start + p].copy_from_slice(item.prompt_tokens);
            flat[start + p..start + p + item.tokens.len()].copy_from_slice(item.tokens);
        }
        let tokens = Tensor::f_from_slice(&flat)?.f_view([items.len() as i64, t])?.f_to_device(device)?;
        let mask = length_mask(&lens, t, device)?;
        let h = Tensor::f_embedding(&self.embedding, &tokens.f_clamp_min(0)?, -1, false, false)?.f_mul(&mask.f_unsqueeze(-1)?)?;
        let mel_lens = lens.iter().map(|l| 2 * l).collect();
        let compiled = self.compiled_encoder.as_ref().filter(|c| c.fits(items.len() as i64, t));
        self.steps_run.count(compiled.is_some());
        if let Some(c) = compiled {
            let token_lens = Tensor::f_from_slice(&lens)?.f_to_device(device)?;
            let mu = c.package.run(&[&h, &token_lens])?.into_iter().next();
            return Ok((mu.ok_or_else(|| tch::TchError::Torch("the compiled encoder returned nothing".into()))?, mel_lens));
        }
        let h = self.encoder.forward(&h, &mask)?;
        Ok((self.encoder_proj.forward(&h)?, mel_lens))
    }

    pub fn vocab_size(&self) -> i64 {
        self.embedding.size()[0]
    }

    /// Encoder stage, then sampling: per item the mel `[80, frames]` without the prompt frames.
    pub fn forward(&self, items: &[FlowItem]) -> R<Vec<Tensor>> {
        self.sample(items, &self.encode(items)?)
    }

    /// Flow matching from the encoder's output ([`Flow::encode`]).
    pub fn sample(&self, items: &[FlowItem], encoded: &(Tensor, Vec<i64>)) -> R<Vec<Tensor>> {
        let device = self.embedding.device();
        let b = items.len() as i64;
        let (mu, mel_lens) = encoded;
        let (_, longest, _) = mu.size3()?;
        let frames = padded_frames(longest, self.max_frames());
        let mu_t = mu.f_transpose(1, 2)?.f_constant_pad_nd([0, frames - longest])?.f_contiguous()?;
        // x-vectors: L2-normalised, then affine to 80.
        let embeddings = items.iter().map(|i| i.embedding.f_to_kind(Kind::Float)).collect::<R<Vec<_>>>()?;
        let emb = Tensor::f_stack(&embeddings, 0)?.f_to_device(device)?;
        let norm = emb.f_norm_scalaropt_dim(2.0, [1], true)?.f_clamp_min(1e-12)?;
        let spks = self.spk_affine.forward(&emb.f_div(&norm)?)?;
        // Prompt mel conditions the first frames.
        let cond = Tensor::f_zeros([b, frames, 80], (Kind::Float, device))?;
        for (row, item) in items.iter().enumerate() {
            let p = item.prompt_feat.size().first().copied().unwrap_or(0);
            if p > 0 {
                let mut rows = cond.f_get(row as i64)?.f_narrow(0, 0, p)?;
                rows.f_copy_(&item.prompt_feat.f_to_device(device)?)?;
            }
        }
        let cond = cond.f_transpose(1, 2)?.f_contiguous()?;
        let mask = length_mask(mel_lens, frames, device)?.f_unsqueeze(1)?;
        let z = self.noise.f_narrow(2, 0, frames)?.f_expand([b, 80, frames], false)?.f_to_kind(mu_t.kind())?;
        let x = self.solve_euler(z, &mask, &mu_t, &spks, &cond)?;
        items
            .iter()
            .enumerate()
            .map(|(row, item)| {
                let p = 2 * item.prompt_tokens.len() as i64;
                x.f_get(row as i64)?.f_narrow(1, p, 2 * item.tokens.len() as i64)
            })
            .collect()
    }

    /// One estimator call as a step of [`Flow::sample`] makes it — through the compiled package
    /// when it has one for these shapes, the eager port otherwise — fp32 out. (Stage checks.)
    pub fn estimate(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let (b, _, frames) = mu.size3()?;
        let runs = self.runs(b, frames, mask, mu)?;
        self.estimate_with(&runs, x, mask, mu, t, spks, cond)
    }

    /// What runs the estimator on a batch of `b` items of `frames` frames.
    fn runs(&self, b: i64, frames: i64, mask: &Tensor, mu: &Tensor) -> R<Runs<'_>> {
        Ok(match self.compiled.as_ref().filter(|c| c.fits(b, frames)) {
            Some(c) => Runs::Compiled(c),
            None => Runs::Eager(self.estimator.frames(mask, mu)?),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn estimate_with(&self, runs: &Runs, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        self.steps_run.count(matches!(runs, Runs::Compiled(_)));
        match runs {
            Runs::Compiled(c) => c
                .package
                .run(&[x, mask, mu, t, spks, cond])?
                .into_iter()
                .next()
                .ok_or_else(|| tch::TchError::Torch("the compiled estimator returned nothing".into()))?,
            Runs::Eager(layout) => self.estimator.forward_with(x, mask, mu, t, spks, cond, layout)?,
        }
        .f_to_kind(Kind::Float)
    }

    /// `ConditionalCFM.solve_euler` with classifier-free guidance as one doubled batch
    /// (`flow_matching::solve_euler`), each step through the compiled package (a small batch's as
    /// a replayed graph) or the eager port.
    fn solve_euler(&self, z: Tensor, mask: &Tensor, mu: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let (b, _, frames) = mu.size3()?;
        let doubled = Doubled::new(mask, mu, spks, cond, None)?;
        // Every step runs on the same shapes: the compiled package or the eager port (whose
        // attention layout, packed or padded, is made once).
        let runs = self.runs(2 * b, frames, &doubled.mask, &doubled.mu)?;
        let mut graphs = self.graphs.borrow_mut();
        solve_euler(&self.sampler, z, &doubled, |step, x_in, t_in| {
            let inputs = [x_in, &doubled.mask, &doubled.mu, t_in, &doubled.spks, &doubled.cond];
            let graphed = match &runs {
                Runs::Compiled(c) => graphs.step(&c.package, inputs, step == 1)?,
                Runs::Eager(_) => None,
            };
            match graphed {
                Some(d) => {
                    self.steps_run.count(true);
                    Ok(d)
                }
                None => self.estimate_with(&runs, x_in, &doubled.mask, &doubled.mu, t_in, &doubled.spks, &doubled.cond),
            }
        })
    }
}
