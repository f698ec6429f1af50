//! Where the text pipeline's stages queue their kernels on CUDA, chosen once at the model's load
//! from `[llm]`: token2wav's buckets (the decode's stream, one of their own with
//! `overlap_token2wav`, or a CUDA green context's with `decode_sms`), a batch's closing buckets
//! (every SM again with `closing_on_all_sms`) and the decode's steps (high priority with
//! `prioritise_decode`). On a CPU, or without the CUDA headers at build time, there are none.
//!
//! Neighbours: `mod.rs` (`TextToSpeech::load` makes them, the decode and token2wav threads enter
//! them), `model::cuda_stream` (the streams and the SM split).

use crate::config::LlmConfig;
use crate::model::cuda_stream::{green_sms, sm_count, Priority, SideStream};
use crate::model::Device;

/// The streams of the two stages (`None`: the calling thread's current stream).
pub(super) struct StageStreams {
    /// token2wav's buckets' (`None`: the decode's): with `[llm] decode_sms` one of a CUDA green
    /// context that leaves the decode that many SMs, with `overlap_token2wav` one of its own.
    pub buckets: Option<SideStream>,
    /// After a green one with `closing_on_all_sms`, the batch's last buckets' (every SM; `None`:
    /// `buckets` to the end).
    pub closing: Option<SideStream>,
    /// The decode's while token2wav runs on `buckets`: with `prioritise_decode`, one of high
    /// priority.
    pub decode: Option<SideStream>,
}

impl StageStreams {
    /// The streams `[llm]` asks for on `device`. `Err` says why one cannot be made.
    pub(super) fn new(llm: &LlmConfig, device: Device) -> Result<StageStreams, String> {
        let (buckets, closing) = token2wav_streams(llm, device)?;
        let decode = if buckets.is_some() && llm.prioritise_decode {
            SideStream::new(device, Priority::High).map_err(|e| format!("cannot create the decode's CUDA stream: {e}"))?
        } else {
            None
        };
        if buckets.is_some() && llm.decode_sms == 0 {
            tracing::info!(decode_priority = if decode.is_some() { "high" } else { "normal" }, "token2wav on a CUDA stream of its own beside the decode's");
        }
        Ok(StageStreams { buckets, closing, decode })
    }
}

/// token2wav's buckets' stream and its closing buckets' (the decode's is `StageStreams::new`'s).
fn token2wav_streams(llm: &LlmConfig, device: Device) -> Result<(Option<SideStream>, Option<SideStream>), String> {
    let own = || SideStream::new(device, Priority::Normal).map_err(|e| format!("cannot create token2wav's CUDA stream: {e}"));
    if llm.decode_sms == 0 {
        return Ok((if llm.overlap_token2wav { own()? } else { None }, None));
    }
    let Some(total) = sm_count(device).map_err(|e| format!("cannot read the GPU's SM count: {e}"))? else { return Ok((None, None)) };
    let sms = green_sms(total, llm.decode_sms).ok_or_else(|| format!("[llm] decode_sms = {} leaves token2wav no group of SMs of the GPU's {total}", llm.decode_sms))?;
    let refused = |e| format!("cannot give token2wav {sms} of the GPU's {total} SMs ([llm] decode_sms): {e}");
    let Some(buckets) = SideStream::green(device, sms).map_err(refused)? else { return Ok((None, None)) };
    tracing::info!(token2wav_sms = sms, decode_sms = total - sms, "token2wav on a CUDA green context: the decode keeps the other SMs while a bucket runs");
    let closing = if llm.closing_on_all_sms { own()? } else { None };
    Ok((Some(buckets), closing))
}
