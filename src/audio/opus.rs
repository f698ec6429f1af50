//! Opus in Ogg (RFC 7845; mono, 20 ms frames) with libopus, the reference encoder, opened from the
//! host's `libopus.so.0`; the Ogg pages are written by the `ogg` crate (pure Rust). The header
//! carries the encoder's pre-skip and the last page's granule position trims the padding, so a
//! decoder gives back exactly the input's duration (at 48 kHz, as Opus always decodes).
//!
//! Neighbours: `audio` (the format switch) calls [`encode_opus`]; `codec_library` opens libopus.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use ogg::writing::{PacketWriteEndInfo, PacketWriter};

use super::codec_library::{once, CodecLibrary, CodecUnavailable};
use super::EncodeError;

const OPUS_APPLICATION_AUDIO: c_int = 2049;
const OPUS_SET_BITRATE_REQUEST: c_int = 4002;
const OPUS_SET_SIGNAL_REQUEST: c_int = 4024;
const OPUS_SIGNAL_VOICE: c_int = 3001;
const OPUS_GET_LOOKAHEAD_REQUEST: c_int = 4027;
/// The input rates libopus accepts.
pub const SAMPLE_RATES: [u32; 5] = [8000, 12000, 16000, 24000, 48000];
/// The logical stream's serial number (one stream per file; fixed so the same audio gives the
/// same bytes).
const SERIAL: u32 = 0x766f_7862;
/// Packets per Ogg page: one second of 20 ms frames, so players can seek.
const PACKETS_PER_PAGE: usize = 50;

/// The part of libopus's API this encoder calls (opus.h, libopus 1.x).
struct Libopus {
    _library: CodecLibrary,
    encoder_create: unsafe extern "C" fn(i32, c_int, c_int, *mut c_int) -> *mut c_void,
    encoder_ctl: unsafe extern "C" fn(*mut c_void, c_int, ...) -> c_int,
    encode_float: unsafe extern "C" fn(*mut c_void, *const f32, c_int, *mut u8, i32) -> i32,
    encoder_destroy: unsafe extern "C" fn(*mut c_void),
    version: String,
}

static LIBOPUS: OnceLock<Result<Libopus, CodecUnavailable>> = OnceLock::new();

fn libopus() -> Result<&'static Libopus, CodecUnavailable> {
    once(&LIBOPUS, || {
        let lib = CodecLibrary::open(&["libopus.so.0", "libopus.so"], "libopus0")?;
        // SAFETY: each type below is the function's signature in opus.h; the version string is
        // a static NUL-terminated string.
        unsafe {
            let version: unsafe extern "C" fn() -> *const c_char = lib.function("opus_get_version_string")?;
            let version = CStr::from_ptr(version()).to_string_lossy().into_owned();
            Ok(Libopus {
                encoder_create: lib.function("opus_encoder_create")?,
                encoder_ctl: lib.function("opus_encoder_ctl")?,
                encode_float: lib.function("opus_encode_float")?,
                encoder_destroy: lib.function("opus_encoder_destroy")?,
                version,
                _library: lib,
            })
        }
    })
}

/// Whether this host can write Opus.
pub fn available() -> Result<(), CodecUnavailable> {
    libopus().map(|_| ())
}

/// One libopus encoder, destroyed on drop.
struct Encoder {
    opus: &'static Libopus,
    handle: *mut c_void,
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // SAFETY: `handle` came from opus_encoder_create and is destroyed once.
        unsafe { (self.opus.encoder_destroy)(self.handle) };
    }
}

fn failed(reason: String) -> EncodeError {
    EncodeError::Codec { format: "opus", reason }
}

/// The error if `sample_rate` is not one libopus takes (the worker checks its model's rate
/// against `[output] format` at start).
pub fn check_rate(sample_rate: u32) -> Result<(), EncodeError> {
    if SAMPLE_RATES.contains(&sample_rate) {
        Ok(())
    } else {
        Err(failed(format!("libopus takes 8, 12, 16, 24 or 48 kHz input, not {sample_rate} Hz")))
    }
}

/// Encodes `samples` (clipped to [-1, 1], NaN as silence) as an Ogg Opus file at `kbps`.
pub fn encode_opus(samples: &[f32], sample_rate: u32, kbps: u32) -> Result<Vec<u8>, EncodeError> {
    check_rate(sample_rate)?;
    let opus = libopus().map_err(EncodeError::Unavailable)?;
    let bits = c_int::try_from(u64::from(kbps) * 1000).map_err(|_| failed(format!("bitrate {kbps} kbit/s")))?;
    let mut status: c_int = 0;
    // SAFETY: valid rate and channel count; `status` receives the error code.
    let handle = unsafe { (opus.encoder_create)(sample_rate as i32, 1, OPUS_APPLICATION_AUDIO, &mut status) };
    if handle.is_null() || status != 0 {
        return Err(failed(format!("opus_encoder_create: {status}")));
    }
    let encoder = Encoder { opus, handle };
    let mut lookahead: i32 = 0;
    // SAFETY: the requests take an int (SET) or an int pointer (GET), as opus_defines.h says.
    let (rate_ok, signal_ok, lookahead_ok) = unsafe {
        (
            (opus.encoder_ctl)(encoder.handle, OPUS_SET_BITRATE_REQUEST, bits),
            (opus.encoder_ctl)(encoder.handle, OPUS_SET_SIGNAL_REQUEST, OPUS_SIGNAL_VOICE),
            (opus.encoder_ctl)(encoder.handle, OPUS_GET_LOOKAHEAD_REQUEST, &mut lookahead as *mut i32),
        )
    };
    if rate_ok != 0 || signal_ok != 0 || lookahead_ok != 0 || lookahead < 0 {
        return Err(failed(format!("opus_encoder_ctl refused {kbps} kbit/s voice ({rate_ok}, {signal_ok}, {lookahead_ok})")));
    }

    // Granule positions count 48 kHz samples whatever the input rate.
    let scale = u64::from(48_000 / sample_rate);
    let pre_skip = lookahead as u64 * scale;
    let pre_skip16 = u16::try_from(pre_skip).map_err(|_| failed(format!("pre-skip {pre_skip} does not fit the header")))?;
    let frame = (sample_rate / 50) as usize;
    // The encoder's lookahead delays the output: feed that much silence after the input so its
    // end is encoded, then round up to whole frames.
    let fed = (samples.len() + lookahead as usize).div_ceil(frame).max(1) * frame;
    let mut pcm: Vec<f32> = samples.iter().map(|&s| super::clipped(s)).collect();
    pcm.resize(fed, 0.0);
    let end_granule = pre_skip + samples.len() as u64 * scale;

    let mut writer = PacketWriter::new(Vec::with_capacity(samples.len() * kbps as usize / 8 / sample_rate as usize * 1000 + 1024));
    let ogg = |e: std::io::Error| failed(format!("ogg: {e}"));
    writer.write_packet(opus_head(pre_skip16, sample_rate), SERIAL, PacketWriteEndInfo::EndPage, 0).map_err(ogg)?;
    writer.write_packet(opus_tags(&opus.version), SERIAL, PacketWriteEndInfo::EndPage, 0).map_err(ogg)?;
    let frames = fed / frame;
    let mut packet = vec![0u8; 4000];
    for (k, chunk) in pcm.chunks(frame).enumerate() {
        // SAFETY: `chunk` holds one frame of samples; `packet` has room for the 4,000 bytes asked.
        let n = unsafe { (opus.encode_float)(encoder.handle, chunk.as_ptr(), frame as c_int, packet.as_mut_ptr(), packet.len() as i32) };
        if n < 0 {
            return Err(failed(format!("opus_encode_float: {n}")));
        }
        let last = k + 1 == frames;
        let granule = if last { end_granule } else { (k as u64 + 1) * frame as u64 * scale };
        let end = if last {
            PacketWriteEndInfo::EndStream
        } else if (k + 1) % PACKETS_PER_PAGE == 0 {
            PacketWriteEndInfo::EndPage
        } else {
            PacketWriteEndInfo::NormalPacket
        };
        writer.write_packet(packet[..n as usize].to_vec(), SERIAL, end, granule).map_err(ogg)?;
    }
    Ok(writer.into_inner())
}

/// The identification header (RFC 7845 §5.1): one channel, mapping family 0.
fn opus_head(pre_skip: u16, input_rate: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(19);
    h.extend_from_slice(b"OpusHead");
    h.push(1); // version
    h.push(1); // channels
    h.extend_from_slice(&pre_skip.to_le_bytes());
    h.extend_from_slice(&input_rate.to_le_bytes());
    h.extend_from_slice(&0i16.to_le_bytes()); // output gain
    h.push(0); // channel mapping family
    h
}

/// The comment header (RFC 7845 §5.2): the vendor, no comments.
fn opus_tags(libopus_version: &str) -> Vec<u8> {
    let vendor = format!("voxbatch {} ({libopus_version})", env!("CARGO_PKG_VERSION"));
    let mut t = Vec::with_capacity(16 + vendor.len());
    t.extend_from_slice(b"OpusTags");
    t.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
    t.extend_from_slice(vendor.as_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ogg_opus_has_its_headers_and_a_last_granule_that_trims_to_the_inputs_duration() {
        let n = 30_000usize;
        let samples: Vec<f32> = (0..n).map(|i| (i as f32 * 0.05).sin() * 0.5).collect();
        let file = encode_opus(&samples, 24000, 32).expect("libopus (libopus0; scripts/bootstrap.sh installs it)");
        let mut reader = ogg::reading::PacketReader::new(std::io::Cursor::new(file));
        let head = reader.read_packet_expected().unwrap();
        assert!(head.first_in_stream() && head.data.starts_with(b"OpusHead") && head.data.len() == 19);
        let pre_skip = u64::from(u16::from_le_bytes([head.data[10], head.data[11]]));
        assert_eq!(u32::from_le_bytes(head.data[12..16].try_into().unwrap()), 24000);
        let tags = reader.read_packet_expected().unwrap();
        assert!(tags.data.starts_with(b"OpusTags") && tags.absgp_page() == 0);
        let (mut packets, mut last) = (0, None);
        while let Some(p) = reader.read_packet().unwrap() {
            packets += 1;
            last = Some((p.absgp_page(), p.last_in_stream()));
        }
        let (granule, eos) = last.unwrap();
        assert!(eos, "the last packet ends the stream");
        assert_eq!(granule, pre_skip + 2 * n as u64, "end trimming: the decoder keeps exactly the input's 48 kHz samples");
        assert!(packets * 480 >= n + pre_skip as usize / 2, "{packets} packets of 20 ms cover the input");
    }

    #[test]
    fn a_rate_libopus_does_not_take_is_refused_with_the_rates_it_does() {
        let err = encode_opus(&[0.0; 100], 22050, 32).unwrap_err();
        assert!(err.to_string().contains("22050") && err.to_string().contains("24"), "{err}");
    }
}
