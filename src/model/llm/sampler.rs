//! The reference's repetition-aware sampling (`ras_sampling` in `cosyvoice/utils/common.py`),
//! vectorised over a batch: nucleus sampling (top-p 0.8, at most top-k 25, in probability order);
//! if the pick already occurs ≥ `win_size · tau_r` times among the sequence's last `win_size`
//! tokens, a draw from the full distribution instead — CosyVoice3's reference (FunAudioLLM/CosyVoice
//! `ace7c47`) leaves the repeated pick out of that draw, CosyVoice2's (PyPI `token2wav-cosyvoice`)
//! does not ([`SamplingParams::full_excludes_nucleus`]). Probabilities in fp32.
//!
//! The draws are inverse-CDF picks from uniforms the caller supplies, one pair per row, so each
//! sequence has its own seeded stream ([`SequenceRng`]) and a batched run picks what a solo run
//! would.
//!
//! Neighbours: `speech_lm` calls [`ras_sample`] on each decode step's log-probabilities.

use rand::{Rng, SeedableRng};
use tch::{Kind, Tensor};

use crate::model::layers::R;

/// Sampling settings (CosyVoice2's `cosyvoice2.yaml`: top_p 0.8, top_k 25, win_size 10, tau_r 0.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub top_p: f64,
    pub top_k: i64,
    pub win_size: usize,
    pub tau_r: f64,
    /// The full-distribution draw leaves the nucleus pick out (its score set to −∞ first, as
    /// CosyVoice3's reference does).
    pub full_excludes_nucleus: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { top_p: 0.8, top_k: 25, win_size: 10, tau_r: 0.1, full_excludes_nucleus: false }
    }
}

/// One sequence's stream of uniforms, seeded (e.g. from job id and segment), so that a retried
/// job samples the same draws.
pub struct SequenceRng(rand::rngs::StdRng);

impl SequenceRng {
    pub fn new(seed: u64) -> SequenceRng {
        SequenceRng(rand::rngs::StdRng::seed_from_u64(seed))
    }
    /// The (nucleus, full-distribution) uniforms of the next draw.
    pub fn next_pair(&mut self) -> (f64, f64) {
        (self.0.gen::<f64>(), self.0.gen::<f64>())
    }
}

/// The seed of a job segment's draws: the job id and the segment index, mixed, so that a retried
/// job samples the same tokens and no two segments share a stream.
pub fn sequence_seed(job_id: uuid::Uuid, segment: u32) -> u64 {
    let id = job_id.as_u128();
    let mixed = (id as u64) ^ ((id >> 64) as u64).rotate_left(29) ^ u64::from(segment).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser: nearby inputs give unrelated seeds.
    let mut z = mixed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// For rows whose uniform `u` falls in `cdf` `[N, V]` (non-decreasing, ending at 1): the first
/// column whose value exceeds `u`.
fn inverse_cdf(cdf: &Tensor, u: &Tensor) -> R<Tensor> {
    let (_, v) = cdf.size2()?;
    cdf.f_le_tensor(&u.f_unsqueeze(1)?)?.f_sum_dim_intlist(Some([1i64].as_slice()), false, Kind::Int64)?.f_clamp_max(v - 1)
}

/// The two candidate draws of every row of `logp` `[N, V]` (log-probabilities) from its uniforms
/// `[N, 2]` (fp32, on `logp`'s device): column 0 the nucleus pick, column 1 the pick from the full
/// distribution; `[N, 2]` int64. Device operations only, so a CUDA graph can capture it with the
/// decode step.
pub fn draw(logp: &Tensor, uniforms: &Tensor, p: &SamplingParams) -> R<Tensor> {
    let probs = logp.f_to_kind(Kind::Float)?.f_softmax(-1, Kind::Float)?;
    let (_, v) = probs.size2()?;
    // The reference sorts the whole distribution (stable, descending) and adds tokens in that
    // order while the sum so far is under top_p and fewer than top_k are taken: only the top_k
    // largest can be taken, so those are all it needs. Ordered as the stable sort orders them:
    // by probability, ties by id (top-k's own order of ties is unspecified).
    let k = p.top_k.clamp(1, v);
    let (_, top_ids) = probs.f_topk(k, -1, true, false)?;
    let (top_ids, _) = top_ids.f_sort(-1, false)?;
    let (top, order) = probs.f_gather(1, &top_ids, false)?.f_sort_stable(true, -1, true)?;
    let top_ids = top_ids.f_gather(1, &order, false)?;
    let before = top.f_cumsum(-1, Kind::Float)?.f_sub(&top)?;
    let kept = top.f_mul(&before.f_lt(p.top_p)?.f_to_kind(Kind::Float)?)?;
    let nucleus_cdf = kept.f_cumsum(-1, Kind::Float)?.f_div(&kept.f_sum_dim_intlist(Some([-1i64].as_slice()), true, Kind::Float)?)?;
    let nucleus = top_ids.f_gather(1, &inverse_cdf(&nucleus_cdf, &uniforms.f_select(1, 0)?)?.f_unsqueeze(1)?, false)?;
    let full = if p.full_excludes_nucleus { probs.f_scatter_value(1, &nucleus, 0.0)? } else { probs };
    let full_cdf = full.f_cumsum(-1, Kind::Float)?.f_div(&full.f_sum_dim_intlist(Some([-1i64].as_slice()), true, Kind::Float)?)?;
    let full = inverse_cdf(&full_cdf, &uniforms.f_select(1, 1)?)?.f_unsqueeze(1)?;
    Tensor::f_cat(&[nucleus, full], 1)
}

/// The reference's choice between a row's two draws: the nucleus pick, unless it already occurs
/// ≥ `win_size · tau_r` times among the last `win_size` tokens of `history`.
pub fn choose(nucleus: i64, full: i64, history: &[i64], p: &SamplingParams) -> i64 {
    let window = &history[history.len().saturating_sub(p.win_size)..];
    let repeats = window.iter().filter(|&&t| t == nucleus).count();
    if repeats as f64 >= p.win_size as f64 * p.tau_r {
        full
    } else {
        nucleus
    }
}

/// The uniforms of `pairs` as a `[N, 2]` fp32 tensor on `device`.
pub fn uniforms_tensor(pairs: &[(f64, f64)], device: tch::Device) -> R<Tensor> {
    let flat: Vec<f32> = pairs.iter().flat_map(|&(a, b)| [a as f32, b as f32]).collect();
    Tensor::f_from_slice(&flat)?.f_view([pairs.len() as i64, 2])?.f_to_device(device)
}

/// Picks one token per row of `logp` `[N, V]` (log-probabilities). `history[i]` is row i's
/// tokens so far; `uniforms[i]` its (nucleus, full) draws.
pub fn ras_sample(logp: &Tensor, history: &[&[i64]], uniforms: &[(f64, f64)], p: &SamplingParams) -> R<Vec<i64>> {
    let picks = draw(logp, &uniforms_tensor(uniforms, logp.device())?, p)?;
    let picks = Vec::<i64>::try_from(picks.f_to_device(tch::Device::Cpu)?.f_flatten(0, -1)?)?;
    Ok(picks.chunks(2).zip(history).map(|(pair, h)| choose(pair[0], pair[1], h, p)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logp(probs: &[f32]) -> Tensor {
        Tensor::from_slice(probs).log().unsqueeze(0)
    }

    #[test]
    fn nucleus_picks_stay_within_top_p_and_top_k_in_probability_order() {
        // Sorted: 0.5 (id 2), 0.2 (id 0), 0.15 (id 3), 0.1 (id 1), 0.05 (id 4). Sum before each:
        // 0, 0.5, 0.7, 0.85 → ids 2, 0, 3 are kept under top_p 0.8.
        let lp = logp(&[0.2, 0.1, 0.5, 0.15, 0.05]);
        let p = SamplingParams::default();
        let pick = |u: f64| ras_sample(&lp, &[&[]], &[(u, 0.0)], &p).unwrap()[0];
        // Renormalised over 0.85: id 2 up to 0.588, id 0 up to 0.824, id 3 after.
        assert_eq!((pick(0.1), pick(0.7), pick(0.95), pick(0.9999)), (2, 0, 3, 3));
        let k1 = SamplingParams { top_k: 1, ..p };
        assert_eq!(ras_sample(&lp, &[&[]], &[(0.99, 0.0)], &k1).unwrap()[0], 2, "top_k 1 is greedy");
    }

    #[test]
    fn tied_probabilities_are_taken_in_id_order_as_the_reference_stable_sort_takes_them() {
        // Sorted stably: 0.25 (ids 0, 1, 4), then 0.125 (ids 2, 3); sums before: 0, .25, .5, .75,
        // .875 → ids 0, 1, 4, 2 kept, renormalised over 0.875.
        let lp = logp(&[0.25, 0.25, 0.125, 0.125, 0.25]);
        let p = SamplingParams::default();
        let picks: Vec<i64> = [0.1, 0.4, 0.7, 0.95].iter().map(|&u| ras_sample(&lp, &[&[]], &[(u, 0.0)], &p).unwrap()[0]).collect();
        assert_eq!(picks, vec![0, 1, 4, 2]);
    }

    #[test]
    fn a_repeated_pick_is_drawn_again_from_the_full_distribution() {
        let lp = logp(&[0.2, 0.1, 0.5, 0.15, 0.05]);
        let p = SamplingParams::default();
        // The nucleus pick (id 2) occurs once in the last 10 tokens (≥ 10 · 0.1): the full draw
        // (u = 0.25 → cumulative 0.2, 0.3 → id 1) is taken instead.
        let history: &[i64] = &[2, 7, 7];
        assert_eq!(ras_sample(&lp, &[history], &[(0.1, 0.25)], &p).unwrap()[0], 1);
        // Outside the window it does not count.
        let old: Vec<i64> = std::iter::once(2).chain(std::iter::repeat_n(7, 10)).collect();
        assert_eq!(ras_sample(&lp, &[&old], &[(0.1, 0.25)], &p).unwrap()[0], 2);
    }

    #[test]
    fn cosyvoice3s_full_draw_leaves_the_repeated_pick_out() {
        let lp = logp(&[0.2, 0.1, 0.5, 0.15, 0.05]);
        let p = SamplingParams { full_excludes_nucleus: true, ..SamplingParams::default() };
        // Nucleus pick id 2 repeated: the full draw is over 0.2, 0.1, 0.15, 0.05 renormalised
        // (cumulative 0.4, 0.6, 0.9, 1.0): u = 0.55 → id 1; u = 0.7 → id 3, where CosyVoice2's
        // draw over the whole distribution gives id 2 (cumulative 0.2, 0.3, 0.8).
        let history: &[i64] = &[2];
        assert_eq!(ras_sample(&lp, &[history], &[(0.1, 0.55)], &p).unwrap()[0], 1);
        assert_eq!(ras_sample(&lp, &[history], &[(0.1, 0.7)], &p).unwrap()[0], 3);
        assert_eq!(ras_sample(&lp, &[history], &[(0.1, 0.7)], &SamplingParams::default()).unwrap()[0], 2);
    }

    #[test]
    fn seeds_are_stable_per_job_segment_and_differ_between_segments() {
        let job = uuid::Uuid::parse_str("6f1c1b5e-2f7a-4b8e-9a43-0c1d2e3f4a5b").unwrap();
        assert_eq!(sequence_seed(job, 0), sequence_seed(job, 0));
        assert_ne!(sequence_seed(job, 0), sequence_seed(job, 1));
        assert_ne!(sequence_seed(job, 0), sequence_seed(uuid::Uuid::nil(), 0));
    }

    #[test]
    fn rows_are_sampled_independently_with_their_own_streams() {
        let lp = Tensor::cat(&[logp(&[0.2, 0.1, 0.5, 0.15, 0.05]), logp(&[0.05, 0.05, 0.05, 0.05, 0.8])], 0);
        let (mut a, mut b) = (SequenceRng::new(1), SequenceRng::new(1));
        assert_eq!(a.next_pair(), b.next_pair(), "a seed gives the same draws again");
        let picks = ras_sample(&lp, &[&[], &[]], &[(0.1, 0.0), (0.5, 0.0)], &SamplingParams::default()).unwrap();
        assert_eq!(picks, vec![2, 4]);
    }
}
