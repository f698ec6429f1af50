//! The Qwen2 decoder (Hugging Face `Qwen2Model`, as CosyVoice2's `Qwen2Encoder` wraps it): token
//! embeddings, `layers` × (RMSNorm → grouped-query self-attention with rotary positions, q/k/v with
//! bias → RMSNorm → SwiGLU), final RMSNorm. Dimensions come from the checkpoint's config.
//!
//! It runs over a [`SlotCache`]: [`Qwen2::prefill_packed`] feeds newly admitted sequences' prompts
//! into their free slots in one pass, none padded to another; [`Qwen2::step`] (graph-capturable)
//! and [`Qwen2::decode`] advance a set of slots by one position
//! each, every row at its own position and attending to its own slot's length. A slot freed and
//! refilled mid-decode does not disturb the others.
//!
//! Neighbours: `cache` holds the keys and values; `weights` loads the tensors.

use tch::{Kind, Tensor};

use crate::model::layers::R;
use crate::model::weights::Weights;
use super::cache::SlotCache;

/// Qwen2's dimensions (CosyVoice2-0.5B: 24 layers, hidden 896, 14 heads, 2 KV heads of 64,
/// intermediate 4864, θ 1e6, ε 1e-6, vocabulary 151936).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Qwen2Dims {
    pub layers: usize,
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub intermediate: i64,
    pub vocab: i64,
    pub rope_theta: f64,
    pub eps: f64,
}

/// `Qwen2RMSNorm` (fp32 statistics, times the weight) as libtorch's fused `rms_norm`: one kernel
/// on CUDA. The reference rounds the normalised input to the input's dtype before the weight's
/// product; the fused kernel rounds once — the same in fp32, within one bf16 step in bf16.
struct RmsNorm {
    w: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> R<Tensor> {
        let h = self.w.size()[0];
        x.f_rms_norm([h], Some(&self.w), self.eps)
    }
}

/// One decoder layer, its projections fused for the decode step's sake (a step of a 0.5B model
/// is bound by kernel launches, not arithmetic): q, k and v as one GEMM with the query heads
/// reordered so that the heads sharing a KV head are `kv_heads` apart (`[group, kv_heads,
/// head_dim]`, with `o_proj`'s columns reordered to match) — the order FlashAttention's grouped
/// decode reads without a copy; gate and up as one GEMM; o and down add into the residual in
/// their GEMM. The arithmetic is the reference's.
struct DecoderLayer {
    input_norm: RmsNorm,
    /// `[heads·hd + 2·kv_heads·hd, hidden]` (query rows reordered) and its bias.
    qkv: Tensor,
    qkv_bias: Tensor,
    /// `o_proj` transposed, `[heads·hd, hidden]`, rows reordered as the query heads.
    o_t: Tensor,
    post_norm: RmsNorm,
    /// gate and up transposed, `[hidden, 2·intermediate]`.
    gate_up_t: Tensor,
    /// `down_proj` transposed, `[intermediate, hidden]`.
    down_t: Tensor,
}

/// Reorders query-head rows (or, with `dim` 1, columns) from the checkpoint's `[kv_heads, group,
/// head_dim]` order (HF's `repeat_kv`: head `h` reads KV head `h / group`) to `[group, kv_heads,
/// head_dim]` (head `g·kv_heads + j` reads KV head `j`).
fn heads_by_group(t: &Tensor, d: &Qwen2Dims, dim: i64) -> R<Tensor> {
    let group = d.heads / d.kv_heads;
    let mut shape = t.size();
    let rest = shape.clone();
    shape.splice(dim as usize..dim as usize + 1, [d.kv_heads, group, d.head_dim]);
    t.f_view(shape.as_slice())?.f_transpose(dim, dim + 1)?.f_contiguous()?.f_view(rest.as_slice())
}

impl DecoderLayer {
    fn new(w: &Weights, p: &str, d: &Qwen2Dims) -> R<DecoderLayer> {
        let (h, q_out, kv_out, i) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate);
        let get = |name: &str, shape: &[i64]| w.get(&format!("{p}.{name}"), shape);
        let q = heads_by_group(&get("self_attn.q_proj.weight", &[q_out, h]), d, 0)?;
        let q_bias = heads_by_group(&get("self_attn.q_proj.bias", &[q_out]), d, 0)?;
        let qkv = Tensor::f_cat(&[q, get("self_attn.k_proj.weight", &[kv_out, h]), get("self_attn.v_proj.weight", &[kv_out, h])], 0)?;
        let qkv_bias = Tensor::f_cat(&[q_bias, get("self_attn.k_proj.bias", &[kv_out]), get("self_attn.v_proj.bias", &[kv_out])], 0)?;
        let o = heads_by_group(&get("self_attn.o_proj.weight", &[h, q_out]), d, 1)?;
        let gate_up = Tensor::f_cat(&[get("mlp.gate_proj.weight", &[i, h]), get("mlp.up_proj.weight", &[i, h])], 0)?;
        Ok(DecoderLayer {
            input_norm: RmsNorm { w: get("input_layernorm.weight", &[h]), eps: d.eps },
            qkv,
            qkv_bias,
            o_t: o.f_tr()?.f_contiguous()?,
            post_norm: RmsNorm { w: get("post_attention_layernorm.weight", &[h]), eps: d.eps },
            gate_up_t: gate_up.f_tr()?.f_contiguous()?,
            down_t: get("mlp.down_proj.weight", &[h, i]).f_tr()?.f_contiguous()?,
        })
    }

    /// q `[N, heads, hd]` (grouped order, rotated), k `[N, kv_heads, hd]` (rotated) and v of `x`
    /// `[N, hidden]` at the rotary angles `rope`.
    fn qkv(&self, x: &Tensor, rope: &Rope, d: &Qwen2Dims) -> R<(Tensor, Tensor, Tensor)> {
        let n = x.size2()?.0;
        let qkv = self.input_norm.forward(x)?.f_linear(&self.qkv, Some(&self.qkv_bias))?;
        let (q_heads, hd) = (d.heads + d.kv_heads, d.head_dim);
        let qk = rope.apply(&qkv.f_narrow(1, 0, q_heads * hd)?.f_view([n, q_heads, hd])?)?;
        let v = qkv.f_narrow(1, q_heads * hd, d.kv_heads * hd)?.f_view([n, d.kv_heads, hd])?;
        Ok((qk.f_narrow(1, 0, d.heads)?, qk.f_narrow(1, d.heads, d.kv_heads)?, v))
    }

    /// `x + o(attention)` then `+ mlp`: `a` `[N, heads·hd]` in grouped head order.
    fn finish(&self, x: &Tensor, a: &Tensor) -> R<Tensor> {
        let x = x.f_addmm(a, &self.o_t)?;
        let gate_up = self.post_norm.forward(&x)?.f_mm(&self.gate_up_t)?;
        let i = self.down_t.size()[0];
        let act = gate_up.f_narrow(1, 0, i)?.f_silu()?.f_mul(&gate_up.f_narrow(1, i, i)?)?;
        x.f_addmm(&act, &self.down_t)
    }
}

/// The rotary embedding at a set of positions: `x·cos + rotate_half(x)·sin`, with `rotate_half`'s
/// sign folded into `sin` (`[-sin, sin]` over the two halves) so that a rotation is a flip and
/// two products.
struct Rope {
    /// `[N, 1, head_dim]`
    cos: Tensor,
    signed_sin: Tensor,
}

impl Rope {
    /// `x` `[N, heads, head_dim]` rotated.
    fn apply(&self, x: &Tensor) -> R<Tensor> {
        let (n, heads, hd) = x.size3()?;
        let swapped = x.f_view([n, heads, 2, hd / 2])?.f_flip([2])?.f_view([n, heads, hd])?;
        x.f_mul(&self.cos)?.f_addcmul(&swapped, &self.signed_sin)
    }
}

pub struct Qwen2 {
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    inv_freq: Tensor,
    dims: Qwen2Dims,
}

impl Qwen2 {
    /// The decoder under `prefix` (`llm.model.model` in CosyVoice2's `llm.pt`).
    pub fn new(w: &Weights, prefix: &str, dims: Qwen2Dims) -> R<Qwen2> {
        let device = w.get(&format!("{prefix}.norm.weight"), &[dims.hidden]).device();
        let hd = dims.head_dim;
        let exponents = Tensor::f_arange_start_step(0, hd, 2, (Kind::Float, device))?.f_div_scalar(hd as f64)?;
        let inv_freq = Tensor::f_full([hd / 2], dims.rope_theta, (Kind::Float, device))?.f_pow(&exponents)?.f_reciprocal()?;
        Ok(Qwen2 {
            embed_tokens: w.get(&format!("{prefix}.embed_tokens.weight"), &[dims.vocab, dims.hidden]),
            layers: (0..dims.layers).map(|i| DecoderLayer::new(w, &format!("{prefix}.layers.{i}"), &dims)).collect::<R<_>>()?,
            norm: RmsNorm { w: w.get(&format!("{prefix}.norm.weight"), &[dims.hidden]), eps: dims.eps },
            inv_freq,
            dims,
        })
    }

    pub fn dims(&self) -> Qwen2Dims {
        self.dims
    }

    /// Token embeddings `[T, hidden]` of `ids`.
    pub fn embed(&self, ids: &[i64]) -> R<Tensor> {
        self.embed_ids(&Tensor::f_from_slice(ids)?.f_to_device(self.embed_tokens.device())?)
    }

    /// Token embeddings of `ids` (a device tensor `[T]`).
    pub fn embed_ids(&self, ids: &Tensor) -> R<Tensor> {
        self.embed_tokens.f_index_select(0, ids)
    }

    /// A cache for this model: `slots` sequences of up to `max_len` positions, in `kind`.
    pub fn cache(&self, slots: usize, max_len: i64, kind: Kind) -> R<SlotCache> {
        let d = self.dims;
        SlotCache::new(d.layers as i64, slots, d.kv_heads, max_len, d.head_dim, kind, self.embed_tokens.device())
    }

    /// The rotary embedding at `positions` `[N]`, in `kind`.
    fn rope(&self, positions: &Tensor, kind: Kind) -> R<Rope> {
        let freqs = positions.f_to_kind(Kind::Float)?.f_unsqueeze(1)?.f_mul(&self.inv_freq.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        let sin = freqs.f_sin()?;
        let signed_sin = Tensor::f_cat(&[&sin.f_neg()?, &sin], -1)?;
        Ok(Rope { cos: emb.f_cos()?.f_to_kind(kind)?.f_unsqueeze(1)?, signed_sin: signed_sin.f_to_kind(kind)?.f_unsqueeze(1)? })
    }

    /// Feeds `x` (`[T, hidden]` input embeddings of one sequence) into free `slot`; returns the
    /// final hidden states `[T, hidden]`.
    pub fn prefill(&self, cache: &mut SlotCache, slot: usize, x: &Tensor) -> R<Tensor> {
        self.prefill_packed(cache, &[slot], &[x.size2()?.0], x)
    }

    /// Feeds several sequences at once, each into its own free slot, none padded: the items'
    /// positions laid end to end in `x` (`[ΣT, hidden]`), item `i` `lens[i]` positions long going
    /// into free slot `item_slots[i]`. They attend causally within their own sequence
    /// (FlashAttention's variable-length kernel on CUDA bf16/fp16, a block-diagonal causal mask
    /// elsewhere), so one call per layer serves them all. Returns the hidden states `[ΣT, hidden]`.
    pub fn prefill_packed(&self, cache: &mut SlotCache, item_slots: &[usize], lens: &[i64], x: &Tensor) -> R<Tensor> {
        let d = self.dims;
        if item_slots.is_empty() {
            return Tensor::f_zeros([0, d.hidden], (x.kind(), x.device()));
        }
        let mut slots = Vec::new();
        let mut positions = Vec::new();
        let mut owner = Vec::new();
        for (i, (&slot, &t)) in item_slots.iter().zip(lens).enumerate() {
            if !cache.is_empty(slot) {
                return Err(tch::TchError::Shape(format!("slot {slot} is not free ({} positions held)", cache.len(slot))));
            }
            if t > cache.max_len() {
                return Err(tch::TchError::Shape(format!("slot {slot}: {t} positions exceed the cache's {}", cache.max_len())));
            }
            slots.extend(std::iter::repeat_n(slot as i64, t as usize));
            positions.extend(0..t);
            owner.extend(std::iter::repeat_n(i as i64, t as usize));
        }
        if x.size2()?.0 != positions.len() as i64 {
            return Err(tch::TchError::Shape(format!("{} input positions for items of {} in all", x.size2()?.0, positions.len())));
        }
        let device = x.device();
        let total = positions.len() as i64;
        let slot_index = Tensor::f_from_slice(&slots)?.f_to_device(device)?;
        let positions = Tensor::f_from_slice(&positions)?.f_to_device(device)?;
        let rope = self.rope(&positions, x.kind())?;
        let group = d.heads / d.kv_heads;
        let (heads, kvh, hd) = (d.heads, d.kv_heads, d.head_dim);
        let attend: Box<Attend> = if flash_capable(x) {
            // FlashAttention, causal within each sequence (offsets `cu`), GQA in its own head
            // order (query head h reads KV head h / group): the grouped order is transposed in and out.
            let mut cu = vec![0i32];
            for len in lens {
                cu.push(cu[cu.len() - 1] + *len as i32);
            }
            let cu = Tensor::f_from_slice(&cu)?.f_to_device(device)?;
            let longest = lens.iter().copied().max().unwrap_or(1);
            Box::new(move |q: &Tensor, k: &Tensor, v: &Tensor| -> R<Tensor> {
                let q = q.f_view([total, group, kvh, hd])?.f_transpose(1, 2)?.f_contiguous()?.f_view([total, heads, hd])?;
                let a = crate::model::shim::flash_attention_varlen(&q, &k.f_contiguous()?, &v.f_contiguous()?, &cu, &cu, None, longest, longest, true)?;
                a.f_view([total, kvh, group, hd])?.f_transpose(1, 2)?.f_reshape([total, heads * hd])
            })
        } else {
            // Query i sees key j when both are of one sequence and j is not later.
            let owner = Tensor::f_from_slice(&owner)?.f_to_device(device)?;
            let same = owner.f_unsqueeze(1)?.f_eq_tensor(&owner.f_unsqueeze(0)?)?;
            let earlier = positions.f_unsqueeze(0)?.f_le_tensor(&positions.f_unsqueeze(1)?)?;
            let mask = same.f_logical_and(&earlier)?.f_view([1, 1, total, total])?;
            Box::new(move |q: &Tensor, k: &Tensor, v: &Tensor| -> R<Tensor> {
                // [1, H, ΣT, hd]: query head g·kv_heads + j reads KV head j (grouped order).
                let spread = |t: &Tensor| -> R<Tensor> { t.f_repeat([1, group, 1])?.f_transpose(0, 1)?.f_unsqueeze(0) };
                let a = Tensor::f_scaled_dot_product_attention(&q.f_transpose(0, 1)?.f_unsqueeze(0)?, &spread(k)?, &spread(v)?, Some(&mask), 0.0, false, None, false)?;
                a.f_squeeze_dim(0)?.f_transpose(0, 1)?.f_reshape([total, heads * hd])
            })
        };
        let cache_rows = cache.rows(&slot_index, &positions)?;
        let mut x = x.shallow_clone();
        for (l, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = layer.qkv(&x, &rope, &d)?;
            cache.write(l, &cache_rows, &k, &v)?;
            let a = attend(&q, &k, &v)?;
            x = layer.finish(&x, &a)?;
        }
        for (&slot, &t) in item_slots.iter().zip(lens) {
            cache.advance(slot, t);
        }
        self.norm.forward(&x)
    }

    /// Advances each of `slots` by one position: `x` `[N, hidden]` holds each slot's next input
    /// embedding, row `i` for `slots[i]`. Returns the final hidden states `[N, hidden]`.
    pub fn decode(&self, cache: &mut SlotCache, slots: &[usize], x: &Tensor) -> R<Tensor> {
        let device = x.device();
        if let Some(full) = slots.iter().find(|&&s| cache.len(s) >= cache.max_len()) {
            return Err(tch::TchError::Shape(format!("slot {full} is full ({} positions)", cache.max_len())));
        }
        let lens: Vec<i64> = slots.iter().map(|&s| cache.len(s)).collect();
        let span = span_for(lens.iter().copied().max().unwrap_or(0) + 1, cache.max_len());
        let positions = Tensor::f_from_slice(&lens)?.f_to_device(device)?;
        let slot_ids: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
        let slot_index = Tensor::f_from_slice(&slot_ids)?.f_to_device(device)?;
        let hidden = self.step(cache, Rows::Slots(&slot_index), x, &positions, span)?;
        for &s in slots {
            cache.advance(s, 1);
        }
        Ok(hidden)
    }

    /// One decode step on the device alone (no host copies, so a CUDA graph can capture it): row
    /// `i` of `x` `[N, hidden]` goes into its slot at position `positions[i]` and attends to that
    /// slot's keys `0..=positions[i]`, reading the first `span` positions. Writes the keys and
    /// values; the caller advances the slots' lengths. Returns the final hidden states `[N, hidden]`.
    ///
    /// Grouped-query attention without copies. On CUDA in bf16/fp16, FlashAttention's
    /// variable-length kernel (through the shim) reads each row's own filled positions of its slot
    /// straight from the cache. Elsewhere SDPA with the query heads sharing a KV head laid out as
    /// that head's query positions (`[N, kv_heads, group, head_dim]`), reading `span` positions
    /// under a per-row mask — in place with [`Rows::First`], gathered with [`Rows::Slots`].
    pub fn step(&self, cache: &SlotCache, rows: Rows<'_>, x: &Tensor, positions: &Tensor, span: i64) -> R<Tensor> {
        let d = self.dims;
        let (n, _) = x.size2()?;
        let device = x.device();
        let slot_index = match rows {
            Rows::First => Tensor::f_arange(n, (Kind::Int64, device))?,
            Rows::Slots(index) => index.shallow_clone(),
        };
        let rope = self.rope(positions, x.kind())?;
        // FlashAttention (bf16/fp16 on CUDA) reads each row's own filled positions only; elsewhere
        // SDPA reads `span` positions under a per-row mask.
        let attend: Box<Attend> = if flash_capable(x) {
            let max_len = cache.max_len();
            let offsets = slot_index.f_mul_scalar(max_len)?;
            let cu_k = Tensor::f_cat(&[&offsets, &offsets.f_narrow(0, n - 1, 1)?.f_add_scalar(max_len)?], 0)?.f_to_kind(Kind::Int)?;
            // The `group` query heads sharing a KV head become that head's `group` query positions
            // (not causal: all see the same keys), so each KV head is read once per row, not once
            // per query head.
            let group = d.heads / d.kv_heads;
            let cu_q = Tensor::f_arange(n + 1, (Kind::Int, device))?.f_mul_scalar(group)?;
            let used = positions.f_add_scalar(1)?.f_to_kind(Kind::Int)?;
            let (s, kvh, hd) = (cache.slots() as i64, d.kv_heads, d.head_dim);
            Box::new(move |q: &Tensor, ck: &Tensor, cv: &Tensor| -> R<Tensor> {
                let flat = |c: &Tensor| c.f_view([s * max_len, kvh, hd]);
                // [N, H, hd] in grouped order is [N × group, KVH, hd] row-major, and so is the output.
                let q = q.f_contiguous()?.f_view([n * group, kvh, hd])?;
                let a = crate::model::shim::flash_attention_varlen(&q, &flat(ck)?, &flat(cv)?, &cu_q, &cu_k, Some(&used), group, span, false)?;
                a.f_view([n, kvh * group * hd])
            })
        } else {
            let mask = Tensor::f_arange(span, (Kind::Int64, device))?
                .f_unsqueeze(0)?
                .f_le_tensor(&positions.f_unsqueeze(1)?)?
                .f_view([n, 1, 1, span])?;
            let group = d.heads / d.kv_heads;
            let slot_index = slot_index.shallow_clone();
            Box::new(move |q: &Tensor, ck: &Tensor, cv: &Tensor| -> R<Tensor> {
                // [N, KVH, span, hd], read in place with Rows::First.
                let read = |c: &Tensor| -> R<Tensor> {
                    let rows = match rows {
                        Rows::First => c.f_narrow(0, 0, n)?,
                        Rows::Slots(_) => c.f_index_select(0, &slot_index)?,
                    };
                    rows.f_narrow(1, 0, span)?.f_transpose(1, 2)?.f_to_kind(q.kind())
                };
                // Grouped order: [N, group, KVH, hd] → [N, KVH, group, hd] (and back after).
                let q = q.f_view([n, group, d.kv_heads, d.head_dim])?.f_transpose(1, 2)?;
                let a = Tensor::f_scaled_dot_product_attention(&q, &read(ck)?, &read(cv)?, Some(&mask), 0.0, false, None, false)?;
                a.f_transpose(1, 2)?.f_reshape([n, d.heads * d.head_dim])
            })
        };
        let cache_rows = cache.rows(&slot_index, positions)?;
        let mut x = x.shallow_clone();
        for (l, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = layer.qkv(&x, &rope, &d)?;
            cache.write(l, &cache_rows, &k, &v)?;
            let a = attend(&q, &cache.k.f_get(l as i64)?, &cache.v.f_get(l as i64)?)?;
            x = layer.finish(&x, &a)?;
        }
        self.norm.forward(&x)
    }
}

/// Whether FlashAttention (through the shim) serves activations like `x`: bf16/fp16 on CUDA.
fn flash_capable(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.kind(), Kind::BFloat16 | Kind::Half)
}

/// Attention of one layer's queries over keys and values: `(q, keys, values)` — a step's
/// cached layer, or a prefill's own.
type Attend<'a> = dyn Fn(&Tensor, &Tensor, &Tensor) -> R<Tensor> + 'a;

/// Which slots the rows of a decode step are.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// Row `i` is slot `i`, for the first `N` slots: keys and values are read in place.
    First,
    /// Row `i` is slot `index[i]` (a device tensor of slot indices): keys and values are gathered.
    Slots(&'a Tensor),
}

/// Positions a decode step reads: `needed` rounded up to a multiple of [`SPAN_STEP`] (so that CUDA
/// graphs are captured for few spans), at most the cache's `max_len`.
pub fn span_for(needed: i64, max_len: i64) -> i64 {
    ((needed + SPAN_STEP - 1) / SPAN_STEP * SPAN_STEP).min(max_len)
}

/// Granularity of decode spans.
pub const SPAN_STEP: i64 = 128;

/// Every tensor a decoder of `d` under `prefix` has, filled by `random` (tests make random models).
#[cfg(test)]
pub(crate) fn random_tensors(prefix: &str, d: &Qwen2Dims, random: &dyn Fn(&[i64]) -> Tensor) -> Vec<(String, Tensor)> {
    let (h, q, kv, i) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate);
    let mut tensors = vec![(format!("{prefix}.embed_tokens.weight"), random(&[d.vocab, h])), (format!("{prefix}.norm.weight"), random(&[h]) + 1.0)];
    for l in 0..d.layers {
        for (name, shape) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.q_proj.bias", vec![q]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.k_proj.bias", vec![kv]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.bias", vec![kv]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            tensors.push((format!("{prefix}.layers.{l}.{name}"), random(&shape)));
        }
    }
    tensors
}

impl From<&crate::model::LlmDims> for Qwen2Dims {
    fn from(d: &crate::model::LlmDims) -> Qwen2Dims {
        Qwen2Dims {
            layers: d.layers,
            hidden: d.hidden,
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
            intermediate: d.intermediate,
            vocab: d.vocab,
            rope_theta: d.rope_theta,
            eps: d.eps,
        }
    }
}

#[cfg(test)]
mod tests;
