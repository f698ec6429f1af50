//! The slot KV cache: `[layers, slots, max_len, kv_heads, head_dim]` keys and values (a layer
//! viewed `[slots × max_len, kv_heads, head_dim]` is what FlashAttention's variable-length kernel reads),
//! preallocated, with each slot's filled length. A slot holds one sequence; freeing it is setting
//! its length to 0 (stale entries past a slot's length are never attended to).
//!
//! Neighbours: `qwen2` writes and reads it.

use tch::{Device, Kind, Tensor};

use crate::model::layers::R;

pub struct SlotCache {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    lens: Vec<i64>,
    max_len: i64,
}

impl SlotCache {
    /// A cache for `slots` sequences of up to `max_len` positions.
    pub fn new(layers: i64, slots: usize, kv_heads: i64, max_len: i64, head_dim: i64, kind: Kind, device: Device) -> R<SlotCache> {
        let shape = [layers, slots as i64, max_len, kv_heads, head_dim];
        Ok(SlotCache { k: Tensor::f_zeros(shape, (kind, device))?, v: Tensor::f_zeros(shape, (kind, device))?, lens: vec![0; slots], max_len })
    }

    /// Bytes one position of one slot takes (keys and values, every layer).
    pub fn bytes_per_token(layers: i64, kv_heads: i64, head_dim: i64, kind: Kind) -> u64 {
        (2 * layers * kv_heads * head_dim) as u64 * kind.elt_size_in_bytes() as u64
    }

    /// Bytes the keys and values take.
    pub fn bytes(&self) -> u64 {
        2 * (self.k.numel() * self.k.kind().elt_size_in_bytes()) as u64
    }

    pub fn slots(&self) -> usize {
        self.lens.len()
    }
    pub fn max_len(&self) -> i64 {
        self.max_len
    }
    /// Positions filled in `slot`.
    pub fn len(&self, slot: usize) -> i64 {
        self.lens[slot]
    }
    pub fn is_empty(&self, slot: usize) -> bool {
        self.lens[slot] == 0
    }
    /// Frees `slot` for the next sequence.
    pub fn free(&mut self, slot: usize) {
        self.lens[slot] = 0;
    }
    /// The rows of a layer viewed `[slots × max_len, kv_heads, head_dim]` that (`slots[i]`,
    /// `positions[i]`) are (device tensors `[N]`, int64): computed once for a pass, read by every
    /// layer's [`SlotCache::write`].
    pub(super) fn rows(&self, slots: &Tensor, positions: &Tensor) -> R<Tensor> {
        slots.f_mul_scalar(self.max_len)?.f_add(positions)
    }

    /// Writes keys and values `[N, kv_heads, head_dim]` of layer `layer` at `rows` (from
    /// [`SlotCache::rows`]): one copy kernel each.
    pub(super) fn write(&self, layer: usize, rows: &Tensor, k: &Tensor, v: &Tensor) -> R<()> {
        for (cache, new) in [(&self.k, k), (&self.v, v)] {
            // [S, T, KVH, hd] as [S·T, KVH, hd]: a layer of the contiguous cache flattens to a
            // view, so the write lands in the cache.
            let mut flat = cache.f_get(layer as i64)?.f_flatten(0, 1)?;
            let _ = flat.f_index_copy_(0, rows, &new.f_to_kind(flat.kind())?)?;
        }
        Ok(())
    }

    pub(super) fn advance(&mut self, slot: usize, by: i64) {
        self.lens[slot] += by;
    }
}
