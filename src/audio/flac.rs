//! FLAC (16-bit mono, lossless) with `flacenc`, pure Rust.
//!
//! Neighbours: `audio` (the format switch) calls [`encode_flac`]; tests decode its output with
//! Debian's reference `flac` and with symphonia.

use super::pcm16;

/// Encodes `samples` as a 16-bit mono FLAC stream; the error is flacenc's, in words.
pub fn encode_flac(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, String> {
    use flacenc::component::BitRepr;
    use flacenc::error::Verify;
    let pcm: Vec<i32> = pcm16(samples).map(i32::from).collect();
    let config = flacenc::config::Encoder::default().into_verified().map_err(|(_, e)| format!("{e:?}"))?;
    let source = flacenc::source::MemSource::from_samples(&pcm, 1, 16, sample_rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size).map_err(|e| format!("{e:?}"))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).map_err(|e| format!("{e:?}"))?;
    let mut bytes = sink.as_slice().to_vec();
    // STREAMINFO's minimum block size must exclude the last block (FLAC format); flacenc counts
    // it, which makes strict decoders (symphonia) take the fixed-size stream for a variable-size
    // one and find no frame. Every block but the last has the maximum size: say so.
    if bytes.len() >= 12 && &bytes[..4] == b"fLaC" && bytes[4] & 0x7f == 0 {
        let max = [bytes[10], bytes[11]];
        bytes[8..10].copy_from_slice(&max);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flac_decodes_to_the_wavs_samples_with_a_strict_decoder() {
        // The reference decoder checks the stored files in tests/integration/output_formats.rs; symphonia (the
        // reader `voice add` uses) is stricter about STREAMINFO.
        for n in [30_000usize, 4096, 1000] {
            let samples: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).sin() * 0.6).collect();
            let flac = encode_flac(&samples, 24000).unwrap();
            assert!(flac.starts_with(b"fLaC"));
            let (rate, decoded) = crate::audio::decode_with_symphonia(flac);
            assert_eq!(rate, Some(24000));
            let decoded: Vec<i16> = decoded.iter().map(|&v| (v * 32768.0).round() as i16).collect();
            assert_eq!(decoded, pcm16(&samples).collect::<Vec<_>>(), "{n} samples, lossless");
        }
    }
}
