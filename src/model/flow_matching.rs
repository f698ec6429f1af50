//! Conditional flow matching's sampler, as both families run it offline (`ConditionalCFM.solve_euler`
//! in CosyVoice2, `CausalConditionalCFM.solve_euler` in CosyVoice3): from the fixed noise `z`,
//! `steps` Euler steps on the cosine schedule `t_k = 1 − cos(k/steps · π/2)`, each one estimator
//! call on the doubled batch — rows `[conditioned 0..B, unconditioned 0..B]`, the unconditioned
//! rows' mu, speaker and prompt condition zero — whose velocities classifier-free guidance mixes:
//! `v = (1 + rate)·v_c − rate·v_u`, `x += dt·v`, `dt` from the accumulated `t` (its rounding kept).
//!
//! Also the mel padding both flows use: a batch's mel is padded to a multiple of
//! [`FRAME_MULTIPLE`] frames (every layer of both estimators is causal or masks padded keys, so
//! padding changes no item's frames).
//!
//! What runs the estimator (an eager port, a compiled package, a replayed graph) is the caller's:
//! [`solve_euler`] calls it once a step with that step's doubled inputs.
//!
//! Neighbours: `cosyvoice2::flow` (the U-Net estimator), `cosyvoice3::flow` (the DiT), each with
//! its compiled steps and step graphs.

use tch::{Kind, Tensor};

use super::layers::R;

/// The estimator runs on mel lengths that are multiples of this (and at least two of them):
/// SDPA's memory-efficient kernel copies a bias whose rows are not 8-element aligned (once per
/// attention call), and both families' estimator packages are exported for these lengths
/// (tools/compile/families/*/ `FRAME_MULTIPLE`).
pub const FRAME_MULTIPLE: i64 = 8;

/// `frames` rounded up to the estimator's multiple, unless that passes `max` (the fixed noise's length).
pub fn padded_frames(frames: i64, max: i64) -> i64 {
    let padded = (frames.max(2 * FRAME_MULTIPLE) + FRAME_MULTIPLE - 1) / FRAME_MULTIPLE * FRAME_MULTIPLE;
    if padded <= max { padded } else { frames }
}

/// The sampler's settings (`[cosyvoice2]`/`[cosyvoice3]` `flow_steps`, `cfg_rate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EulerCfg {
    pub steps: usize,
    pub cfg_rate: f64,
}

/// The estimator's inputs that stay the same through the steps, doubled for guidance: mask and
/// the conditioned rows' mu, speakers and prompt condition, then zeros for the unconditioned rows.
pub struct Doubled {
    pub mask: Tensor,
    pub mu: Tensor,
    pub spks: Tensor,
    pub cond: Tensor,
    /// The dtype the steps' `x` and `t` are given in (see [`Doubled::new`]).
    kind: Option<Kind>,
}

impl Doubled {
    /// `mask` `[B, 1, T]`, `mu`/`cond` `[B, 80, T]`, `spks` `[B, 80]`. `kind`: the dtype of the
    /// estimator's inputs, every step's `x` and `t` included — CosyVoice3's buffers are typed as
    /// its speaker projection's output (fp16 under upstream's autocast: `t` is rounded there
    /// before the time embedding); `None` passes them as they are (CosyVoice2).
    pub fn new(mask: &Tensor, mu: &Tensor, spks: &Tensor, cond: &Tensor, kind: Option<Kind>) -> R<Doubled> {
        let double = |x: &Tensor| -> R<Tensor> {
            let both = Tensor::f_cat(&[x.shallow_clone(), x.f_zeros_like()?], 0)?;
            kind.map_or(Ok(both.shallow_clone()), |k| both.f_to_kind(k))
        };
        let mask = Tensor::f_cat(&[mask, mask], 0)?;
        let mask = kind.map_or(Ok(mask.shallow_clone()), |k| mask.f_to_kind(k))?;
        Ok(Doubled { mask, mu: double(mu)?, spks: double(spks)?, cond: double(cond)?, kind })
    }

    fn input(&self, x: Tensor) -> R<Tensor> {
        self.kind.map_or(Ok(x.shallow_clone()), |k| x.f_to_kind(k))
    }
}

/// The Euler loop from `z` (`[B, 80, T]`, fp32 state): `estimate(step, x_in, t_in)` (steps
/// 1..=`steps`; `x_in` `[2B, 80, T]`, `t_in` `[2B]`, with `doubled`'s inputs) returns the
/// velocities of the doubled batch, guidance is applied in their dtype, and the state stays fp32.
/// Returns the last step's state.
pub fn solve_euler(cfg: &EulerCfg, z: Tensor, doubled: &Doubled, mut estimate: impl FnMut(usize, &Tensor, &Tensor) -> R<Tensor>) -> R<Tensor> {
    let device = doubled.mu.device();
    let t_span = Tensor::f_linspace(0.0, 1.0, cfg.steps as i64 + 1, (Kind::Float, device))?;
    let t_span = t_span.f_mul_scalar(0.5)?.f_mul_scalar(std::f64::consts::PI)?.f_cos()?.f_mul_scalar(-1.0)?.f_add_scalar(1.0)?;
    let mut t = t_span.f_narrow(0, 0, 1)?;
    let mut dt = t_span.f_narrow(0, 1, 1)?.f_sub(&t_span.f_narrow(0, 0, 1)?)?;
    let b = doubled.mu.size().first().copied().unwrap_or(0) / 2;
    let mut x = z.f_to_kind(Kind::Float)?;
    for step in 1..=cfg.steps {
        let x_in = doubled.input(Tensor::f_cat(&[&x, &x], 0)?)?;
        let t_in = doubled.input(t.f_expand([2 * b], false)?)?;
        let d = estimate(step, &x_in, &t_in)?;
        let (d, uncond) = (d.f_narrow(0, 0, b)?, d.f_narrow(0, b, b)?);
        let d = d.f_mul_scalar(1.0 + cfg.cfg_rate)?.f_sub(&uncond.f_mul_scalar(cfg.cfg_rate)?)?;
        // A new tensor, not in place: x starts as an expanded (broadcast) view of the fixed noise.
        x = x.f_add(&dt.f_mul(&d)?)?;
        t = t.f_add(&dt)?;
        if step < cfg.steps {
            dt = t_span.f_narrow(0, step as i64 + 1, 1)?.f_sub(&t)?;
        }
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_lengths_are_padded_to_the_estimators_multiple_within_the_noise() {
        assert_eq!(padded_frames(500, 15000), 504);
        assert_eq!(padded_frames(504, 15000), 504);
        assert_eq!(padded_frames(2, 15000), 2 * FRAME_MULTIPLE, "at least two multiples");
        assert_eq!(padded_frames(14_999, 15000), 15000);
        assert_eq!(padded_frames(14_995, 14_998), 14_995, "never past the fixed noise");
    }

    #[test]
    fn the_steps_see_the_cosine_schedule_and_guidance_mixes_the_two_halves() {
        // A velocity of 1 conditioned and 0 unconditioned: each step adds (1 + rate)·dt, so the
        // state ends at (1 + rate)·t_end = 1.7; the times the estimator saw are 1 − cos(kπ/20).
        let cfg = EulerCfg { steps: 10, cfg_rate: 0.7 };
        let z = Tensor::zeros([2, 80, 16], (Kind::Float, tch::Device::Cpu));
        let mask = Tensor::ones([2, 1, 16], (Kind::Float, tch::Device::Cpu));
        let doubled = Doubled::new(&mask, &z, &Tensor::zeros([2, 80], (Kind::Float, tch::Device::Cpu)), &z, None).unwrap();
        let mut seen = Vec::new();
        let x = solve_euler(&cfg, z.shallow_clone(), &doubled, |_, x_in, t_in| {
            seen.push(t_in.double_value(&[0]));
            assert_eq!(x_in.size(), [4, 80, 16]);
            Tensor::cat(&[x_in.ones_like().narrow(0, 0, 2), x_in.zeros_like().narrow(0, 0, 2)], 0).f_mul_scalar(1.0)
        })
        .unwrap();
        for (k, t) in seen.iter().enumerate() {
            assert!((t - (1.0 - (k as f64 * std::f64::consts::PI / 20.0).cos())).abs() < 1e-6, "step {k}: t = {t}");
        }
        assert!((x.double_value(&[1, 3, 5]) - 1.7).abs() < 1e-5);
    }
}
