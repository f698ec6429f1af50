//! Prompt recordings (issue 15): the resampler against the reference's
//! (`torchaudio.transforms.Resample`, fixtures by `tools/make_voice_fixtures.py`, made by bootstrap)
//! at the rates recordings arrive in, to the 1e-4.

use std::path::PathBuf;

use voxbatch::voice::recording::Recording;

#[test]
fn resampling_matches_the_reference_resampler_at_every_common_rate() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/voice-parity/voice_parity.safetensors");
    assert!(path.is_file(), "{} missing: run scripts/bootstrap.sh", path.display());
    let tensors = tch::Tensor::read_safetensors(&path).unwrap();
    let get = |name: &str| -> Vec<f32> {
        let t = &tensors.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in the fixtures")).1;
        Vec::<f32>::try_from(t.to_kind(tch::Kind::Float).flatten(0, -1)).unwrap()
    };
    let mut checked = 0;
    for (from, to) in [(24000, 16000), (44100, 16000), (48000, 16000), (22050, 24000), (16000, 24000), (48000, 24000)] {
        let input = Recording { samples: get(&format!("resample.{from}.{to}.in")), sample_rate: from };
        let want = get(&format!("resample.{from}.{to}.out"));
        let got = input.resampled(to).unwrap();
        assert_eq!((got.sample_rate, got.samples.len()), (to, want.len()), "{from} → {to}: length");
        let worst = got.samples.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-4, "{from} → {to}: worst difference {worst}");
        checked += 1;
    }
    assert_eq!(checked, 6);
}
