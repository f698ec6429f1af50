//! Sizing of the speech-token LM stage: how many sequences decode at once. Every slot of the KV
//! cache holds its longest possible segment (`[llm]` limits: sos + prompt text + text + task id +
//! prompt speech tokens + `max_token_text_ratio` × text), at a cost known exactly — 2 × layers ×
//! kv_heads × head_dim × element bytes per position (12 KiB in bf16 for CosyVoice2-0.5B) — plus the
//! decode step's per-row activations (the fp32 log-probabilities and the sampler's sort and
//! cumulative sums over the 6,564 outputs). The LM's weights and its prefill and graph workspace
//! come off the share first.
//!
//! Neighbours: `config::llm` (the settings); `model::llm::batch` allocates the cache
//! this sizes; `bench llm` reports the measured peak beside it.

use tch::Kind;

use crate::config::LlmConfig;
use crate::model::llm::cache::SlotCache;
use crate::model::LlmDims;

/// Fixed workspace of the LM stage besides weights and slots: a prefill pass of up to 4,096
/// positions, the captured graphs' shared pool and libtorch's allocator slack. Calibrated on the
/// H200 (`bench/results/2026-12-03-h200-llm-fused-*graphs.json`, CosyVoice2-0.5B shape, bf16):
/// the peak minus KV cache and weights was 0.28–0.33 GiB at one slot and grew by at most 1.08 MiB
/// a slot (1.76 GiB at 2,048 slots); this keeps 512 MiB fixed and [`step_bytes_per_row`] per slot.
pub const WORKSPACE_BYTES: u64 = 512 << 20;

/// Bytes of the decode step's activations per row: 48 fp32 vectors of the output size (logits,
/// log-probabilities, probabilities, cumulative sums, CDFs, the sampler's temporaries, the
/// graphs' per-bucket outputs) — 1.26 MB for CosyVoice2, above the 1.08 MiB a slot measured
/// (see [`WORKSPACE_BYTES`]).
pub fn step_bytes_per_row(dims: &LlmDims) -> u64 {
    48 * 4 * (dims.speech_tokens as u64 + 3)
}

/// Bytes of keys and values per position of one slot, in `kind` (the cache's own arithmetic).
pub fn kv_bytes_per_position(dims: &LlmDims, kind: Kind) -> u64 {
    SlotCache::bytes_per_token(dims.layers as i64, dims.kv_heads, dims.head_dim, kind)
}

pub use crate::model::llm::request::max_positions;

/// What the LM stage gets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlmPlan {
    pub slots: usize,
    pub max_positions: i64,
    pub bytes_per_slot: u64,
    /// What the slots take (cache and step activations).
    pub slots_bytes: u64,
    /// The share of the budget the stage was given.
    pub share_bytes: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum LlmSizingError {
    #[error(
        "the LM stage's share of the memory budget ({share} bytes = llm.memory_share × budget) does not hold its weights \
         ({weights} bytes) and workspace ({WORKSPACE_BYTES} bytes) and one slot of {per_slot} bytes: raise llm.memory_share \
         or the budget, or lower llm.max_text_tokens / max_prompt_speech_tokens"
    )]
    NoSlot { share: u64, weights: u64, per_slot: u64 },
}

/// The slot count for `budget_bytes` (the worker's memory budget): a fixed `llm.slots`, or as many
/// as `llm.memory_share` of the budget holds after the weights and workspace, at most
/// `llm.max_slots`.
/// `system_tokens`: the LM's system prompt (`model::tts::system_prompt_tokens`).
pub fn plan(c: &LlmConfig, dims: &LlmDims, system_tokens: usize, kind: Kind, weights_bytes: u64, budget_bytes: u64) -> Result<LlmPlan, LlmSizingError> {
    let max_positions = max_positions(c, dims, system_tokens);
    let per_slot = max_positions as u64 * kv_bytes_per_position(dims, kind) + step_bytes_per_row(dims);
    let share = (budget_bytes as f64 * c.memory_share) as u64;
    let slots = match c.slots {
        Some(n) => n,
        None => {
            let room = share.saturating_sub(weights_bytes + WORKSPACE_BYTES);
            let fit = (room / per_slot.max(1)) as usize;
            if fit == 0 {
                return Err(LlmSizingError::NoSlot { share, weights: weights_bytes, per_slot });
            }
            fit.min(c.max_slots)
        }
    };
    Ok(LlmPlan { slots, max_positions, bytes_per_slot: per_slot, slots_bytes: slots as u64 * per_slot, share_bytes: share })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> LlmDims {
        LlmDims {
            layers: 24,
            hidden: 896,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            intermediate: 4864,
            vocab: 151936,
            rope_theta: 1e6,
            eps: 1e-6,
            speech_tokens: 6561,
            top_p: 0.8,
            top_k: 25,
            win_size: 10,
            tau_r: 0.1,
            min_token_text_ratio: 2.0,
            max_token_text_ratio: 20.0,
            end_of_prompt: None,
            silent_tokens: Vec::new(),
            max_silent_tokens: 0,
        }
    }

    fn config() -> LlmConfig {
        crate::config::Config::defaults().unwrap().llm
    }

    #[test]
    fn a_slot_costs_its_longest_segment_at_12_kib_a_position_in_bf16() {
        let c = config();
        assert_eq!(kv_bytes_per_position(&dims(), Kind::BFloat16), 12 * 1024);
        // 2 + 60 + 80 + 300 + 20 × 80.
        assert_eq!(max_positions(&c, &dims(), 0), 2042);
        // CosyVoice3's system prompt (say 7 tokens) before a cross-lingual segment: 7 more input
        // positions and 20 × 7 more of max_len.
        assert_eq!(max_positions(&c, &dims(), 7), 2042 + 7 + 140);
    }

    #[test]
    fn slots_fill_the_share_after_weights_and_workspace_up_to_the_cap() {
        let c = config();
        let weights = 1_000_000_000;
        // An H200's budget (~110 GB): 30 % is 33 GB, ~24.7 MB a slot: capped at max_slots.
        let big = plan(&c, &dims(), 0, Kind::BFloat16, weights, 110_000_000_000).unwrap();
        assert_eq!(big.slots, c.max_slots);
        // A 16 GB budget: 4.8 GB share, minus weights and workspace, over the per-slot bytes.
        let small = plan(&c, &dims(), 0, Kind::BFloat16, weights, 16_000_000_000).unwrap();
        let expected = (4_800_000_000 - weights - WORKSPACE_BYTES) / small.bytes_per_slot;
        assert_eq!(small.slots as u64, expected);
        assert!(small.slots_bytes + weights + WORKSPACE_BYTES <= small.share_bytes);
        let fixed = plan(&LlmConfig { slots: Some(7), ..c.clone() }, &dims(), 0, Kind::BFloat16, weights, 16_000_000_000).unwrap();
        assert_eq!(fixed.slots, 7);
    }

    #[test]
    fn a_share_that_holds_no_slot_is_an_error_that_says_what_to_change() {
        let e = plan(&config(), &dims(), 0, Kind::BFloat16, 1_000_000_000, 4_000_000_000).unwrap_err();
        assert!(matches!(e, LlmSizingError::NoSlot { .. }));
        assert!(e.to_string().contains("llm.memory_share"), "{e}");
    }
}
