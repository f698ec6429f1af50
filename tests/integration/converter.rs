//! `tools/convert_cosyvoice.py` on variants of an official CosyVoice2 directory (the tiny random
//! one `scripts/bootstrap.sh` builds with the reference code, `models/cosyvoice2-tiny-parity/official`):
//! the branches official checkpoints take (`generator.`-prefixed HiFT, `weight_g`/`weight_v` weight
//! norm), the voice formats of `spk2info.pt` (CosyVoice2's own, third-party key names, none at all)
//! and a voice it must refuse; and an official CosyVoice3 directory (the committed tiny one,
//! `tests/data/cosyvoice3/official`) to kind `cosyvoice3-token2wav`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tch::Tensor;
use voxbatch::model::cosyvoice2::Token2Wav;
use voxbatch::model::{Device, Manifest, Precision};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn official() -> PathBuf {
    let dir = root().join("models/cosyvoice2-tiny-parity/official");
    assert!(dir.join("flow.pt").is_file(), "{} is missing: run scripts/bootstrap.sh", dir.display());
    dir
}

/// A copy of the official directory (flow.pt linked, it is only read) in which `edit` (Python, with
/// `torch` imported and `d` the directory) has been run.
fn variant(edit: &str) -> tempfile::TempDir {
    variant_of(&official(), edit)
}

/// [`variant`] of the official directory `src`.
fn variant_of(src: &Path, edit: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dir.path().join(entry.file_name());
        if entry.file_name() == "flow.pt" || entry.file_type().unwrap().is_dir() {
            std::os::unix::fs::symlink(entry.path(), to).unwrap();
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
    let out = Command::new(root().join(".venv/bin/python"))
        .args(["-c", &format!("import sys, torch\nd = sys.argv[1]\n{edit}"), dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

/// Runs the converter: (success, stderr).
fn convert(src: &Path, out: &Path) -> (bool, String) {
    convert_with(src, out, &[])
}

/// [`convert`] with more arguments.
fn convert_with(src: &Path, out: &Path, args: &[&str]) -> (bool, String) {
    // The tokenizer's conversion needs transformers 4.x: bootstrap's LLM site, as bootstrap converts.
    let o = Command::new(root().join(".venv/bin/python"))
        .env("PYTHONPATH", root().join(".run/llm-site"))
        .arg(root().join("tools/convert_cosyvoice.py"))
        .args([src.as_os_str(), out.as_os_str()])
        .args(args)
        .output()
        .unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn tensors(path: &Path) -> std::collections::BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

#[test]
fn a_generator_prefixed_hift_with_weight_g_and_v_converts_to_the_same_weights() {
    let out = tempfile::tempdir().unwrap();
    let (ok, e) = convert(&official(), &out.path().join("plain"));
    assert!(ok, "{e}");
    // HiFT as some official checkpoints store it: `generator.` before every name and the old
    // weight-norm pair (weight_g, weight_v) instead of torch's parametrizations.
    let src = variant(
        "h = torch.load(d + '/hift.pt', weights_only=True)\n\
         r = {}\n\
         for k, v in h.items():\n\
         \x20   k = k.replace('parametrizations.weight.original0', 'weight_g').replace('parametrizations.weight.original1', 'weight_v')\n\
         \x20   r['generator.' + k] = v\n\
         assert any(k.endswith('weight_g') for k in r)\n\
         torch.save(r, d + '/hift.pt')",
    );
    let (ok, e) = convert(src.path(), &out.path().join("old"));
    assert!(ok, "{e}");
    let (plain, old) = (tensors(&out.path().join("plain/token2wav.safetensors")), tensors(&out.path().join("old/token2wav.safetensors")));
    assert_eq!(plain.keys().collect::<Vec<_>>(), old.keys().collect::<Vec<_>>());
    for (name, t) in &plain {
        assert!(t.equal(&old[name]), "{name} differs");
    }
}

#[test]
fn voices_keep_their_llm_prompt_and_third_party_keys_are_read() {
    // `theirs` uses the key names of third-party files; `ours` is what CosyVoice2's
    // add_zero_shot_spk saves (prompt text ids and the LLM's prompt tokens included).
    let src = variant(
        "g = torch.Generator().manual_seed(3)\n\
         tok = torch.randint(0, 50, (1, 7), generator=g)\n\
         feat = torch.randn(1, 14, 80, generator=g)\n\
         s = {\n\
         \x20 'theirs': {'embedding': torch.randn(1, 192, generator=g), 'speech_token': tok, 'speech_feat': feat},\n\
         \x20 'ours': {'flow_embedding': torch.randn(1, 192, generator=g), 'llm_embedding': torch.randn(1, 192, generator=g),\n\
         \x20          'flow_prompt_speech_token': tok[:, :5], 'llm_prompt_speech_token': tok[:, :5], 'prompt_speech_feat': feat[:, :10],\n\
         \x20          'prompt_text': torch.tensor([[5, 9, 2]]), 'prompt_text_len': torch.tensor([3])},\n\
         }\n\
         torch.save(s, d + '/spk2info.pt')",
    );
    let out = tempfile::tempdir().unwrap();
    let (ok, e) = convert(src.path(), out.path());
    assert!(ok, "{e}");
    let m = Manifest::load(out.path()).unwrap();
    assert_eq!(m.voices, ["theirs", "ours"]);
    assert_eq!(m.voice_prompt_tokens, [7, 5]);
    let t2w = Token2Wav::load(out.path(), m, Device::Cpu, Precision::Fp32).unwrap();
    let (theirs, ours) = (&t2w.voices()[0], &t2w.voices()[1]);
    assert_eq!(theirs.prompt_tokens, theirs.llm_prompt_tokens, "third-party speech tokens serve the flow and the LLM");
    assert!(theirs.prompt_text.is_empty());
    assert_eq!(ours.prompt_text, [5, 9, 2]);
    assert_eq!(ours.llm_prompt_tokens, theirs.prompt_tokens[..5]);
}

#[test]
fn no_voices_registers_none_and_an_unreadable_voice_is_refused_by_name() {
    let out = tempfile::tempdir().unwrap();
    let (ok, e) = convert(variant("torch.save({}, d + '/spk2info.pt')").path(), out.path());
    assert!(ok, "{e}");
    assert!(e.contains("none registered"), "says so: {e}");
    let m = Manifest::load(out.path()).unwrap();
    assert!(m.voices.is_empty(), "no zero-vector stand-in: {:?}", m.voices);

    let (ok, e) = convert(variant("torch.save({'x': {'speech_token': torch.zeros(1, 4)}}, d + '/spk2info.pt')").path(), &out.path().join("bad"));
    assert!(!ok);
    assert!(e.contains("voice 'x' has no x-vector") && e.contains("speech_token"), "{e}");
}

#[test]
fn a_cosyvoice3_directory_converts_whole_or_to_its_token2wav_kind_and_misshapen_weights_are_named() {
    let src = root().join("tests/data/cosyvoice3/official");
    let out = tempfile::tempdir().unwrap();
    let (ok, e) = convert_with(&src, out.path(), &["--name", "cv3-test", "--noise-seconds", "2"]);
    assert!(ok, "{e}");
    let m = Manifest::load(out.path()).unwrap();
    // With llm.pt and CosyVoice-BlankEN/: the whole model (its LM, tokenizer and grammars).
    assert_eq!((m.kind, m.name.as_str()), (voxbatch::model::ModelKind::Cosyvoice3, "cv3-test"));
    for f in ["llm.safetensors", "tokenizer.json", "fsts"] {
        assert!(out.path().join(f).exists(), "{f} written");
    }
    let dims = m.cosyvoice3.clone().expect("a [cosyvoice3] section");
    assert!(dims.llm.as_ref().is_some_and(|l| l.end_of_prompt.is_some() && l.speech_tokens == dims.vocab_size), "[cosyvoice3.llm]");
    assert_eq!((dims.dit_dim, dims.dit_depth, dims.dit_heads, dims.dit_head_dim, dims.noise_samples), (48, 2, 2, 24, 2 * 24000));
    assert_eq!(dims.vocoder_precision, None, "the vocoder follows the flow's precision, as upstream runs it");
    assert_eq!((m.voices.as_slice(), m.voice_prompt_tokens.as_slice()), (&["voice0".to_string(), "voice1".to_string()][..], &[0, 4][..]));
    // The same weights as bootstrap's conversion (30 s of noise): the sine noise a prefix of it.
    let (ours, bootstrap) = (tensors(&out.path().join("token2wav.safetensors")), tensors(&root().join("models/cosyvoice3-tiny/token2wav.safetensors")));
    assert_eq!(ours.keys().collect::<Vec<_>>(), bootstrap.keys().collect::<Vec<_>>());
    for (name, t) in &ours {
        let theirs = &bootstrap[name];
        let theirs = if name == "hift.m_source.l_sin_gen.sine_waves" { theirs.narrow(1, 0, t.size()[1]) } else { theirs.shallow_clone() };
        assert!(t.equal(&theirs), "{name} differs");
    }
    let model = voxbatch::model::cosyvoice3::Token2Wav::load(out.path(), m, Device::Cpu, Precision::Fp32).unwrap();
    assert_eq!(model.hift.max_frames(), 100, "2 s of source noise");

    // Without llm.pt: its token2wav alone.
    let no_llm = variant_of(&src, "import os\nos.remove(d + '/llm.pt')");
    let (ok, e) = convert_with(no_llm.path(), &out.path().join("t2w"), &["--noise-seconds", "1"]);
    assert!(ok, "{e}");
    let t2w = Manifest::load(&out.path().join("t2w")).unwrap();
    assert_eq!(t2w.kind, voxbatch::model::ModelKind::Cosyvoice3Token2Wav);
    assert!(t2w.cosyvoice3.is_some_and(|d| d.llm.is_none()) && !out.path().join("t2w/llm.safetensors").exists());

    // `--llm llm.rl.pt`: the RL-tuned LM the release ships beside llm.pt, converted in its place;
    // asked for and not there, an error naming it.
    let rl = variant_of(&src, "import os, shutil\nshutil.copyfile(d + '/llm.pt', d + '/llm.rl.pt')\nos.remove(d + '/llm.pt')");
    let (ok, e) = convert_with(rl.path(), &out.path().join("rl"), &["--noise-seconds", "1", "--llm", "llm.rl.pt"]);
    assert!(ok, "{e}");
    assert_eq!(Manifest::load(&out.path().join("rl")).unwrap().kind, voxbatch::model::ModelKind::Cosyvoice3);
    let (rl_llm, llm) = (tensors(&out.path().join("rl/llm.safetensors")), tensors(&out.path().join("llm.safetensors")));
    assert!(rl_llm.len() == llm.len() && rl_llm.iter().all(|(k, t)| t.equal(&llm[k])), "the same LM's weights");
    let (ok, e) = convert_with(&src, &out.path().join("norl"), &["--noise-seconds", "1", "--llm", "llm.rl.pt"]);
    assert!(!ok && e.contains("no llm.rl.pt"), "{e}");

    // A hift.pt with a tensor of the wrong shape and one missing (flow.pt is linked: never edited):
    // both named in one error.
    let bad = variant_of(
        &src,
        "h = torch.load(d + '/hift.pt', weights_only=True)\n\
         h['conv_post.bias'] = torch.zeros(3)\n\
         del h['m_source.l_linear.bias']\n\
         torch.save(h, d + '/hift.pt')",
    );
    let (ok, e) = convert_with(bad.path(), &out.path().join("bad"), &["--noise-seconds", "1"]);
    assert!(!ok);
    assert!(e.contains("hift.conv_post.bias: shape [3]") && e.contains("hift.m_source.l_linear.bias: missing"), "{e}");
}
