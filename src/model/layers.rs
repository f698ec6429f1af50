//! The building blocks both model families' flows and vocoders are made of (CosyVoice2's and
//! CosyVoice3's): linear, convolutions (causal, centred, grouped, strided), layer norm, the
//! sinusoidal time embedding, and the padding masks that keep a padded batch equal, item by item,
//! to unbatched runs.
//!
//! Every forward pass of the ports uses tch's fallible `f_*` operations and returns [`R`]: a
//! libtorch failure (out of memory above all) is an error value, never a panic.
//!
//! Neighbours: `weights` (the tensors each layer asks for by name and shape); the families'
//! folders (`cosyvoice2/`, `cosyvoice3/`) and the shared `vocoder`, `flow_matching`,
//! `pre_lookahead` build on these.

use tch::{Kind, TchError, Tensor};

/// The result of a libtorch computation.
pub type R<T> = Result<T, TchError>;

use super::weights::Weights;

pub struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    pub fn new(w: &Weights, prefix: &str, input: i64, output: i64, bias: bool) -> Linear {
        Linear {
            w: w.get(&format!("{prefix}.weight"), &[output, input]),
            b: bias.then(|| w.get(&format!("{prefix}.bias"), &[output])),
        }
    }
    /// Projections of one input `prefixes` as one (their outputs side by side, in order, each
    /// `output` wide, with its bias when `bias`): one matmul instead of several.
    pub fn fused(w: &Weights, prefixes: &[&str], input: i64, output: i64, bias: bool) -> Linear {
        let names = |what: &str| -> Vec<String> { prefixes.iter().map(|p| format!("{p}.{what}")).collect() };
        Linear { w: w.get_concatenated(&names("weight"), &[output, input]), b: bias.then(|| w.get_concatenated(&names("bias"), &[output])) }
    }
    pub fn forward(&self, x: &Tensor) -> R<Tensor> {
        x.f_linear(&self.w, self.b.as_ref())
    }
    /// Keeps weight and bias in `kind`, the dtype of the autocast this layer always runs under:
    /// autocast then casts only the input instead of the parameters on every call (the same
    /// values — one rounding to `kind` — and fewer kernels). A layer cast so must never run
    /// outside that autocast.
    pub fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        (self.w, self.b) = cast_parameters(&self.w, self.b.as_ref(), kind)?;
        Ok(())
    }
    /// Weight and bias in `kind` for good: a layer that computes in another dtype than the
    /// weights file's (CosyVoice3's F0 predictor runs in float64, as upstream moves it there).
    pub fn cast(&mut self, kind: Kind) -> R<()> {
        self.cast_for_autocast(kind)
    }
}

/// A layer's weight and optional bias in `kind` (see [`Linear::cast_for_autocast`]).
fn cast_parameters(w: &Tensor, b: Option<&Tensor>, kind: Kind) -> R<(Tensor, Option<Tensor>)> {
    Ok((w.f_to_kind(kind)?, b.map(|b| b.f_to_kind(kind)).transpose()?))
}

/// `Conv1d` with explicit (left, right) zero padding; `left == right` uses the kernel's own padding.
pub struct Conv1d {
    w: Tensor,
    b: Option<Tensor>,
    stride: i64,
    dilation: i64,
    pad: (i64, i64),
    groups: i64,
}

impl Conv1d {
    #[allow(clippy::too_many_arguments)]
    pub fn new(w: &Weights, prefix: &str, input: i64, output: i64, kernel: i64, stride: i64, dilation: i64, pad: (i64, i64)) -> Conv1d {
        Conv1d {
            w: w.get(&format!("{prefix}.weight"), &[output, input, kernel]),
            b: Some(w.get(&format!("{prefix}.bias"), &[output])),
            stride,
            dilation,
            pad,
            groups: 1,
        }
    }
    /// A stride-1 grouped convolution (`groups` input and output channel groups; weight
    /// `[output, input / groups, kernel]`) with explicit (left, right) zero padding.
    pub fn grouped(w: &Weights, prefix: &str, channels: i64, kernel: i64, groups: i64, pad: (i64, i64)) -> Conv1d {
        Conv1d {
            w: w.get(&format!("{prefix}.weight"), &[channels, channels / groups, kernel]),
            b: Some(w.get(&format!("{prefix}.bias"), &[channels])),
            stride: 1,
            dilation: 1,
            pad,
            groups,
        }
    }
    /// A stride-1 convolution that sees only the past: `kernel - 1` zeros on the left.
    pub fn causal(w: &Weights, prefix: &str, input: i64, output: i64, kernel: i64) -> Conv1d {
        Conv1d::new(w, prefix, input, output, kernel, 1, 1, (kernel - 1, 0))
    }
    /// Same-length convolution (`padding = dilation * (kernel - 1) / 2` on both sides).
    pub fn same(w: &Weights, prefix: &str, input: i64, output: i64, kernel: i64, dilation: i64) -> Conv1d {
        let p = dilation * (kernel - 1) / 2;
        Conv1d::new(w, prefix, input, output, kernel, 1, dilation, (p, p))
    }
    pub fn forward(&self, x: &Tensor) -> R<Tensor> {
        let (l, r) = self.pad;
        if l == r {
            x.f_conv1d(&self.w, self.b.as_ref(), [self.stride], [l], [self.dilation], self.groups)
        } else {
            x.f_constant_pad_nd([l, r])?.f_conv1d(&self.w, self.b.as_ref(), [self.stride], [0], [self.dilation], self.groups)
        }
    }
    /// As [`Linear::cast_for_autocast`].
    pub fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        (self.w, self.b) = cast_parameters(&self.w, self.b.as_ref(), kind)?;
        Ok(())
    }
    /// As [`Linear::cast`].
    pub fn cast(&mut self, kind: Kind) -> R<()> {
        self.cast_for_autocast(kind)
    }
}

pub struct ConvTranspose1d {
    w: Tensor,
    b: Tensor,
    stride: i64,
    padding: i64,
}

impl ConvTranspose1d {
    pub fn new(w: &Weights, prefix: &str, input: i64, output: i64, kernel: i64, stride: i64, padding: i64) -> ConvTranspose1d {
        ConvTranspose1d {
            w: w.get(&format!("{prefix}.weight"), &[input, output, kernel]),
            b: w.get(&format!("{prefix}.bias"), &[output]),
            stride,
            padding,
        }
    }
    pub fn forward(&self, x: &Tensor) -> R<Tensor> {
        x.f_conv_transpose1d(&self.w, Some(&self.b), [self.stride], [self.padding], [0], 1, [1])
    }
}

pub struct LayerNorm {
    w: Tensor,
    b: Tensor,
    dim: i64,
    eps: f64,
}

impl LayerNorm {
    pub fn new(w: &Weights, prefix: &str, dim: i64, eps: f64) -> LayerNorm {
        LayerNorm { w: w.get(&format!("{prefix}.weight"), &[dim]), b: w.get(&format!("{prefix}.bias"), &[dim]), dim, eps }
    }
    /// Normalises the last dimension.
    pub fn forward(&self, x: &Tensor) -> R<Tensor> {
        x.f_layer_norm([self.dim], Some(&self.w), Some(&self.b), self.eps, true)
    }
}

/// The sinusoidal embedding of the flow's time `t` (`[B]`) as both families' estimators make it
/// (Matcha's `SinusoidalPosEmb`, F5-TTS's `SinusPositionEmbedding`): `dim / 2` frequencies
/// `exp(−j · ln 10000 / (dim/2 − 1))`, arguments `(1000 · t) · f_j`, sines then cosines → `[B, dim]`.
pub fn time_sinusoids(t: &Tensor, dim: i64) -> R<Tensor> {
    let half = dim / 2;
    let step = 10000f64.ln() / (half - 1) as f64;
    let freqs = Tensor::f_arange(half, (Kind::Float, t.device()))?.f_mul_scalar(-step)?.f_exp()?;
    let emb = t.f_unsqueeze(1)?.f_mul_scalar(1000.0)?.f_mul(&freqs.f_unsqueeze(0)?)?;
    Tensor::f_cat(&[emb.f_sin()?, emb.f_cos()?], -1)
}

/// `[B, T]` float mask: 1 where `t < lengths[b]`.
pub fn length_mask(lengths: &[i64], t: i64, device: tch::Device) -> R<Tensor> {
    let b = lengths.len() as i64;
    let lens = Tensor::f_from_slice(lengths)?.f_to_device(device)?.f_view([b, 1])?;
    Tensor::f_arange(t, (Kind::Int64, device))?.f_view([1, t])?.f_lt_tensor(&lens)?.f_to_kind(Kind::Float)
}

/// The most elements one output of CUDA's upsampling kernels may have: they index with 32 bits and
/// refuse more ("Expected output.numel() <= std::numeric_limits<int32_t>::max()": CosyVoice3's
/// vocoder, 256 items of 20 s, on an H100 on 2026-12-06).
pub const UPSAMPLE_MAX_ELEMENTS: i64 = i32::MAX as i64;

/// `up` applied to `x`'s rows (dim 0) in chunks whose outputs have at most
/// [`UPSAMPLE_MAX_ELEMENTS`] elements each (`out_per_row` elements a row), concatenated; `x` whole
/// when its output fits. Rows are independent in every caller, so the result is the same.
pub fn upsample_by_rows(x: &Tensor, out_per_row: i64, up: impl Fn(&Tensor) -> R<Tensor>) -> R<Tensor> {
    upsample_in_chunks(x, out_per_row, UPSAMPLE_MAX_ELEMENTS, up)
}

fn upsample_in_chunks(x: &Tensor, out_per_row: i64, max_elements: i64, up: impl Fn(&Tensor) -> R<Tensor>) -> R<Tensor> {
    let rows = x.size().first().copied().unwrap_or(1);
    let per_chunk = (max_elements / out_per_row.max(1)).max(1);
    if rows <= per_chunk {
        return up(x);
    }
    let mut parts = Vec::new();
    let mut start = 0;
    while start < rows {
        let n = per_chunk.min(rows - start);
        parts.push(up(&x.f_narrow(0, start, n)?)?);
        start += n;
    }
    Tensor::f_cat(&parts, 0)
}

/// Largest absolute difference of two tensors relative to the largest absolute value of
/// `reference` (infinite when they cannot be compared, e.g. shapes that do not broadcast).
pub fn relative_error(actual: &Tensor, reference: &Tensor) -> f64 {
    let compare = || -> R<f64> {
        let a = actual.f_to_kind(Kind::Double)?.f_to_device(tch::Device::Cpu)?;
        let r = reference.f_to_kind(Kind::Double)?.f_to_device(tch::Device::Cpu)?;
        let diff = a.f_sub(&r)?.f_abs()?.f_max()?.f_double_value(&[])?;
        let scale = r.f_abs()?.f_max()?.f_double_value(&[])?.max(f64::MIN_POSITIVE);
        Ok(diff / scale)
    };
    compare().unwrap_or(f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunked over rows (the limit forced small), an upsampling gives what it gives whole.
    #[test]
    fn an_upsampling_cut_into_row_chunks_equals_the_whole() {
        let x = Tensor::randn([7, 3, 5], (Kind::Float, tch::Device::Cpu));
        let nearest = |t: &Tensor| t.f_upsample_nearest1d([20], 4.0);
        let whole = nearest(&x).unwrap();
        // 3 × 20 outputs a row, at most 2 rows a chunk: chunks of 2, 2, 2, 1.
        let chunked = upsample_in_chunks(&x, 60, 120, nearest).unwrap();
        assert_eq!(chunked.size(), [7, 3, 20]);
        assert!(chunked.equal(&whole));
        let calls = std::cell::Cell::new(0);
        let counted = |t: &Tensor| {
            calls.set(calls.get() + 1);
            t.f_upsample_linear1d([20], false, 4.0)
        };
        assert!(upsample_in_chunks(&x, 60, 120, counted).unwrap().equal(&x.upsample_linear1d([20], false, 4.0)));
        assert_eq!(calls.get(), 4);
        // A row larger than the limit still goes one row at a time.
        assert!(upsample_in_chunks(&x, 60, 10, nearest).unwrap().equal(&whole));
        calls.set(0);
        let _whole = upsample_by_rows(&x, 60, counted).unwrap();
        assert_eq!(calls.get(), 1, "what fits runs whole");
    }
}
