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

use std::cell::Cell;

use tch::{Kind, Tensor};

use super::dit::{Dit, DitDims};
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

pub struct Flow {
    embedding: Tensor,
    spk_affine: Linear,
    pub pre_lookahead: PreLookahead,
    pub dit: Dit,
    noise: Tensor,
    sampler: EulerCfg,
    /// Estimator calls since the last `take_steps` (all eager).
    steps_run: Cell<u64>,
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
            steps_run: Cell::new(0),
        }
    }

    pub fn vocab_size(&self) -> i64 {
        self.embedding.size()[0]
    }

    /// Longest mel (frames, prompt included) the fixed noise covers: 300 s.
    pub fn max_frames(&self) -> i64 {
        self.noise.size()[2]
    }

    /// Estimator calls run since the last call.
    pub fn take_steps(&self) -> u64 {
        self.steps_run.replace(0)
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
    /// step's mel `[B, 80, T]` (fp32, prompt frames included).
    pub fn solve(&self, mu: &Tensor, mask: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let (b, _, frames) = mu.size3()?;
        let z = self.noise.f_narrow(2, 0, frames)?.f_expand([b, MEL, frames], false)?.f_to_kind(mu.kind())?;
        // Upstream's buffers are typed as the speaker projection's output: under autocast, its dtype.
        let doubled = Doubled::new(mask, mu, spks, cond, Some(spks.kind()))?;
        let attention = self.dit.frames(&doubled.mask)?;
        solve_euler(&self.sampler, z, &doubled, |_, x_in, t_in| {
            self.steps_run.set(self.steps_run.get() + 1);
            self.dit.forward_with(x_in, &doubled.mu, t_in, &doubled.spks, &doubled.cond, &attention)
        })
    }
}
