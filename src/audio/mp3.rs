//! MP3 (constant bitrate, mono) with LAME, the reference encoder, opened from the host's
//! `libmp3lame.so.0`. The stream starts with LAME's Info frame, which carries the encoder delay
//! and padding, so decoders that read it (ffmpeg) give back exactly the input's duration.
//!
//! Neighbours: `audio` (the format switch) calls [`encode_mp3`]; `codec_library` opens LAME.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::codec_library::{once, CodecLibrary, CodecUnavailable};
use super::EncodeError;

/// LAME's `MPEG_mode` value for one channel.
const MONO: c_int = 3;
/// The sampling rates of MPEG-1, MPEG-2 and MPEG-2.5 Layer III.
const SAMPLE_RATES: [u32; 9] = [8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000];
/// Samples handed to LAME per call.
const CHUNK: usize = 1 << 16;

/// The part of LAME's API this encoder calls (lame.h, LAME 3.100).
struct Lame {
    _library: CodecLibrary,
    init: unsafe extern "C" fn() -> *mut c_void,
    set_in_samplerate: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    set_out_samplerate: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    set_num_channels: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    set_mode: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    set_brate: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    set_write_id3tag_automatic: unsafe extern "C" fn(*mut c_void, c_int),
    init_params: unsafe extern "C" fn(*mut c_void) -> c_int,
    encode_buffer_ieee_float: unsafe extern "C" fn(*mut c_void, *const f32, *const f32, c_int, *mut u8, c_int) -> c_int,
    encode_flush: unsafe extern "C" fn(*mut c_void, *mut u8, c_int) -> c_int,
    get_lametag_frame: unsafe extern "C" fn(*mut c_void, *mut u8, usize) -> usize,
    close: unsafe extern "C" fn(*mut c_void) -> c_int,
}

static LAME: OnceLock<Result<Lame, CodecUnavailable>> = OnceLock::new();

fn lame() -> Result<&'static Lame, CodecUnavailable> {
    once(&LAME, || {
        let lib = CodecLibrary::open(&["libmp3lame.so.0", "libmp3lame.so"], "libmp3lame0")?;
        // SAFETY: each type below is the function's signature in lame.h (3.100).
        unsafe {
            Ok(Lame {
                init: lib.function("lame_init")?,
                set_in_samplerate: lib.function("lame_set_in_samplerate")?,
                set_out_samplerate: lib.function("lame_set_out_samplerate")?,
                set_num_channels: lib.function("lame_set_num_channels")?,
                set_mode: lib.function("lame_set_mode")?,
                set_brate: lib.function("lame_set_brate")?,
                set_write_id3tag_automatic: lib.function("lame_set_write_id3tag_automatic")?,
                init_params: lib.function("lame_init_params")?,
                encode_buffer_ieee_float: lib.function("lame_encode_buffer_ieee_float")?,
                encode_flush: lib.function("lame_encode_flush")?,
                get_lametag_frame: lib.function("lame_get_lametag_frame")?,
                close: lib.function("lame_close")?,
                _library: lib,
            })
        }
    })
}

/// Whether this host can write MP3.
pub fn available() -> Result<(), CodecUnavailable> {
    lame().map(|_| ())
}

/// One LAME encoder, closed on drop.
struct Encoder {
    lame: &'static Lame,
    handle: *mut c_void,
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // SAFETY: `handle` came from lame_init and is closed once.
        unsafe { (self.lame.close)(self.handle) };
    }
}

fn failed(reason: String) -> EncodeError {
    EncodeError::Codec { format: "mp3", reason }
}

/// Encodes `samples` (clipped to [-1, 1], NaN as silence) as CBR mono MP3 at `kbps` (LAME takes
/// the nearest bitrate the sample rate allows: 8–160 for MPEG-2 rates such as 24 kHz).
pub fn encode_mp3(samples: &[f32], sample_rate: u32, kbps: u32) -> Result<Vec<u8>, EncodeError> {
    if !SAMPLE_RATES.contains(&sample_rate) {
        return Err(failed(format!("MP3 has no {sample_rate} Hz sampling rate (it has 8–48 kHz: {SAMPLE_RATES:?})")));
    }
    let lame = lame().map_err(EncodeError::Unavailable)?;
    let rate = c_int::try_from(sample_rate).map_err(|_| failed(format!("sample rate {sample_rate} Hz")))?;
    let kbps = c_int::try_from(kbps).map_err(|_| failed(format!("bitrate {kbps} kbit/s")))?;
    // SAFETY: lame_init has no preconditions; a null handle is an allocation failure.
    let handle = unsafe { (lame.init)() };
    if handle.is_null() {
        return Err(failed("lame_init returned no encoder".into()));
    }
    let encoder = Encoder { lame, handle };
    // SAFETY: `handle` is a live encoder; the setters only store values, lame_init_params checks them.
    let init = unsafe {
        (lame.set_in_samplerate)(handle, rate);
        (lame.set_out_samplerate)(handle, rate);
        (lame.set_num_channels)(handle, 1);
        (lame.set_mode)(handle, MONO);
        (lame.set_brate)(handle, kbps);
        (lame.set_write_id3tag_automatic)(handle, 0);
        (lame.init_params)(handle)
    };
    if init < 0 {
        return Err(failed(format!("LAME refused {sample_rate} Hz mono at {kbps} kbit/s (lame_init_params: {init})")));
    }

    let clean: Vec<f32> = samples.iter().map(|&s| super::clipped(s)).collect();
    let mut out = Vec::with_capacity(clean.len() / 4 + 8192);
    // LAME's worst case for n samples: 1.25 n + 7200 bytes.
    let mut buf = vec![0u8; CHUNK + CHUNK / 4 + 7200];
    for chunk in clean.chunks(CHUNK) {
        // SAFETY: `chunk` holds chunk.len() samples (the right channel is ignored for mono) and
        // `buf` has room for LAME's worst case for that many.
        let n = unsafe {
            (lame.encode_buffer_ieee_float)(encoder.handle, chunk.as_ptr(), chunk.as_ptr(), chunk.len() as c_int, buf.as_mut_ptr(), buf.len() as c_int)
        };
        if n < 0 {
            return Err(failed(format!("lame_encode_buffer_ieee_float: {n}")));
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: `buf` is larger than the 7,200 bytes a flush may write.
    let n = unsafe { (lame.encode_flush)(encoder.handle, buf.as_mut_ptr(), buf.len() as c_int) };
    if n < 0 {
        return Err(failed(format!("lame_encode_flush: {n}")));
    }
    out.extend_from_slice(&buf[..n as usize]);
    // The stream began with a placeholder frame; the Info (LAME) tag, now complete, replaces it.
    // SAFETY: `buf` is writable for its length.
    let tag = unsafe { (lame.get_lametag_frame)(encoder.handle, buf.as_mut_ptr(), buf.len()) };
    if tag > 0 && tag <= out.len() && tag <= buf.len() {
        out[..tag].copy_from_slice(&buf[..tag]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mp3_starts_with_lames_info_frame_and_decodes_to_the_inputs_duration_and_level() {
        let n = 48_000;
        let samples: Vec<f32> = (0..n).map(|i| (i as f32 * 2.0 * std::f32::consts::PI * 440.0 / 24000.0).sin() * 0.5).collect();
        let mp3 = encode_mp3(&samples, 24000, 64).expect("LAME (libmp3lame0; scripts/bootstrap.sh installs it)");
        assert_eq!(mp3[0], 0xff, "no ID3 tag: the first frame's sync word");
        assert!(mp3.windows(4).take(64).any(|w| w == b"Info"), "LAME's Info tag in the first frame");
        let (rate, decoded) = crate::audio::decode_with_symphonia(mp3);
        assert_eq!(rate, Some(24000));
        assert_eq!(decoded.len(), n, "the Info tag's delay and padding trim the decoded stream to the input's length");
        let rms = |x: &[f32]| (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
        let db = 20.0 * (rms(&decoded) / rms(&samples)).log10();
        assert!(db.abs() < 0.5, "level {db:.2} dB from the input's");
    }

    #[test]
    fn an_impossible_sample_rate_is_an_error_not_a_crash() {
        let err = encode_mp3(&[0.0; 100], 7, 64).unwrap_err();
        assert!(err.to_string().contains("7 Hz"), "{err}");
    }
}
