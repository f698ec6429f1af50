//! The CosyVoice3 token2wav port computes the same function as the reference, stage by stage, and
//! a padded batch computes for each item what the item computes alone.
//!
//! Fixtures: `tests/data/cosyvoice3/` (committed), made by `tools/make_cv3_fixtures.py` with the
//! reference classes of FunAudioLLM/CosyVoice ace7c47 (tiny dimensions, random weights, seed 1234,
//! fp32, CPU: three items of 6/3/8 tokens after prompts of 2/0/2); the model is
//! `models/cosyvoice3-tiny`, `tools/convert_cosyvoice.py` of the fixtures' `official/` directory
//! (scripts/bootstrap.sh converts it). fp32 on the CPU, as the fixtures. The stage tests also run
//! on a full-size set: `VOXBATCH_CV3_PARITY_DIR=DIR` (`tools/make_cv3_fixtures.py --config full`'s
//! fixtures in DIR, its official directory converted into `DIR/model`).
//!
//! Tolerances, on max |ours − reference| / max(1, max |reference|) per stage — relative for F0 in
//! Hz, absolute for mels and waveforms (the full-size random model's waveform peaks near 6e-3, so
//! a relative bound there would ask for less than fp32 can give): [`AGAINST_REFERENCE`] (the same
//! libtorch kernels on the same inputs; what differs is summation order where the port pads or
//! batches: the measured distances are printed as `PARITY` lines). A padded batch against each
//! item alone: [`BATCH_VS_ALONE`] — the reference's own classes differ by up to 4.8e-7 (tiny) and
//! 8.3e-7 (full) between the two on the flow's stages, 2.2e-8 on the vocoder with its edges taken
//! per item (parity.json `gaps`). [`THROUGH_THE_PHASE`] for waveforms made from the port's own mel.

use std::collections::HashMap;
use std::path::PathBuf;

use tch::{Kind, Tensor};
use voxbatch::model::cosyvoice3::Token2Wav;
use voxbatch::model::layers::relative_error;
use voxbatch::model::token2wav::{at_speed, pack_mels, FlowItem};
use voxbatch::model::vocoder::SAMPLES_PER_FRAME;
use voxbatch::model::{Device, Manifest, ModelError, Precision, SynthItem, Synthesizer};

const AGAINST_REFERENCE: f64 = 1e-5;
const BATCH_VS_ALONE: f64 = 2e-6;
/// A waveform from the flow's mel rather than the reference's: the last bits in which two runs of
/// the flow may differ (the mel padded to 8 frames alone, or batched: ~1e-7) move the F0 the
/// vocoder predicts, and the source integrates F0 into thousands of radians of phase, so they reach
/// the waveform ~100 times larger (the vocoder from one mel: [`AGAINST_REFERENCE`] and
/// [`BATCH_VS_ALONE`] hold).
const THROUGH_THE_PHASE: f64 = 2e-5;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A full-size fixture set instead of the committed tiny one (see the module's doc).
fn full_size() -> Option<PathBuf> {
    std::env::var_os("VOXBATCH_CV3_PARITY_DIR").map(PathBuf::from)
}

fn fixture_dir() -> PathBuf {
    full_size().unwrap_or_else(|| root().join("tests/data/cosyvoice3"))
}

fn model_dir() -> PathBuf {
    full_size().map_or_else(|| root().join("models/cosyvoice3-tiny"), |d| d.join("model"))
}

fn load_model(precision: Precision) -> Token2Wav {
    let dir = model_dir();
    let manifest = Manifest::load(&dir).unwrap_or_else(|e| panic!("{e}; run scripts/bootstrap.sh (it converts tests/data/cosyvoice3/official)"));
    Token2Wav::load(&dir, manifest, Device::Cpu, precision).unwrap()
}

/// One fixture file's tensors.
struct Fixture(HashMap<String, Tensor>);

impl Fixture {
    fn load(stage: &str) -> Fixture {
        let path = fixture_dir().join(format!("parity-{stage}.safetensors"));
        Fixture(Tensor::read_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).into_iter().collect())
    }
    fn get(&self, name: &str) -> &Tensor {
        self.0.get(name).unwrap_or_else(|| panic!("fixture {name} is missing"))
    }
    fn item(&self, i: usize, name: &str) -> &Tensor {
        self.get(&format!("item{i}.{name}"))
    }
    fn ids(&self, i: usize, name: &str) -> Vec<i64> {
        Vec::<i64>::try_from(self.item(i, name)).unwrap()
    }
}

const ITEMS: usize = 3;

fn close(what: &str, ours: &Tensor, reference: &Tensor, tolerance: f64) {
    assert_eq!(ours.size(), reference.size(), "{what}: shapes differ");
    let abs = ours.to_kind(Kind::Double).f_sub(&reference.to_kind(Kind::Double)).unwrap().abs().max().double_value(&[]);
    let scale = reference.to_kind(Kind::Double).abs().max().double_value(&[]).max(1.0);
    let err = abs / scale;
    eprintln!("PARITY {what}: {err:.3e} (max abs {abs:.3e}, relative {:.3e})", relative_error(ours, reference));
    assert!(err <= tolerance, "{what}: error {err:.3e} > {tolerance:e}");
}

/// The reference's own prompts and x-vectors of the whole-token2wav fixture.
struct Inputs {
    tokens: Vec<i64>,
    prompt: Vec<i64>,
    prompt_feat: Tensor,
    embedding: Tensor,
}

fn inputs(fx: &Fixture) -> Vec<Inputs> {
    (0..ITEMS)
        .map(|i| Inputs {
            tokens: fx.ids(i, "token"),
            prompt: fx.ids(i, "prompt_token"),
            prompt_feat: fx.item(i, "prompt_feat").shallow_clone(),
            embedding: fx.item(i, "embedding").shallow_clone(),
        })
        .collect()
}

fn flow_items(inputs: &[Inputs]) -> Vec<FlowItem<'_>> {
    inputs.iter().map(|i| FlowItem { tokens: &i.tokens, prompt_tokens: &i.prompt, prompt_feat: &i.prompt_feat, embedding: &i.embedding }).collect()
}

#[test]
fn the_converted_model_carries_the_reference_flow_noise_and_every_tensor_it_asks_for() {
    let model = load_model(Precision::Fp32);
    let noise = Fixture::load("euler");
    let reference = noise.get("noise");
    let ours = voxbatch::model::weights::Weights::load(&model_dir().join("token2wav.safetensors"), tch::Device::Cpu).unwrap();
    let ours = ours.get("flow.rand_noise", &[1, 80, 15000]).get(0).narrow(1, 0, reference.size()[1]);
    assert!(ours.equal(reference), "the flow starts from the reference's noise, bit for bit");
    assert_eq!(model.flow.max_frames(), 15000);
    if full_size().is_none() {
        assert_eq!(model.hift.max_frames(), 30 * 50, "bootstrap converts with 30 s of the source's noise");
    }
}

#[test]
fn the_pre_lookahead_layer_matches_the_reference_alone_and_in_a_padded_batch() {
    let fx = Fixture::load("prelookahead");
    let model = load_model(Precision::Fp32);
    let _no_grad = tch::no_grad_guard();
    let empty = Tensor::zeros([0, 80], (Kind::Float, tch::Device::Cpu));
    let embedding = Tensor::zeros([192], (Kind::Float, tch::Device::Cpu));
    let tokens: Vec<Vec<i64>> = (0..ITEMS).map(|i| fx.ids(i, "token")).collect();
    let items: Vec<FlowItem> = tokens.iter().map(|t| FlowItem { tokens: t, prompt_tokens: &[], prompt_feat: &empty, embedding: &embedding }).collect();
    let mut alone = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let (e, lens) = model.flow.embed(std::slice::from_ref(item)).unwrap();
        close(&format!("item{i} embedding"), &e.get(0), fx.item(i, "embedded"), AGAINST_REFERENCE);
        let pre = model.flow.pre_lookahead.forward(&e).unwrap();
        close(&format!("item{i} pre-lookahead"), &pre.get(0), fx.item(i, "pre"), AGAINST_REFERENCE);
        let (mu, frames) = model.flow.mu(&pre, &lens).unwrap();
        assert_eq!(frames, [2 * tokens[i].len() as i64]);
        close(&format!("item{i} mu (×2)"), &mu.get(0), fx.item(i, "mu"), AGAINST_REFERENCE);
        alone.push(mu.get(0));
    }
    let (e, lens) = model.flow.embed(&items).unwrap();
    close("batch embedding (zero past each end)", &e, fx.get("batch.embedded"), 0.0);
    let pre = model.flow.pre_lookahead.forward(&e).unwrap();
    let (mu, _) = model.flow.mu(&pre, &lens).unwrap();
    for (i, n) in lens.iter().enumerate() {
        let valid = pre.get(i as i64).narrow(0, 0, *n);
        close(&format!("item{i} pre-lookahead, batch vs reference batch"), &valid, &fx.get("batch.pre").get(i as i64).narrow(0, 0, *n), AGAINST_REFERENCE);
        close(&format!("item{i} mu, batch vs alone"), &mu.get(i as i64).narrow(1, 0, 2 * n), &alone[i], BATCH_VS_ALONE);
        let past = mu.get(i as i64).narrow(1, 2 * n, mu.size()[2] - 2 * n);
        assert_eq!(past.abs().sum(Kind::Double).double_value(&[]), 0.0, "item{i}: mu zero past its frames");
    }
}

/// The DiT fixture's item `i` inputs padded to `t` frames (zeros, mask 0 past its end).
fn padded(fx: &Fixture, i: usize, name: &str, t: i64) -> Tensor {
    let x = fx.item(i, name);
    let pad = t - x.size()[x.dim() - 1];
    x.constant_pad_nd([0, pad])
}

#[test]
fn one_dit_step_matches_the_reference_with_and_without_guidance_alone_and_in_a_padded_batch() {
    let fx = Fixture::load("dit");
    let model = load_model(Precision::Fp32);
    let _no_grad = tch::no_grad_guard();
    let dit = &model.flow.dit;
    let step = |x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor| dit.forward(x, mask, mu, t, spks, cond).unwrap();
    let mut alone = Vec::new();
    for i in 0..ITEMS {
        let g = |k: &str| fx.item(i, k);
        let out = step(g("x"), g("mask"), g("mu"), g("t"), g("spks"), g("cond"));
        close(&format!("item{i} DiT, CFG-doubled"), &out, g("out"), AGAINST_REFERENCE);
        let row0 = |k: &str| g(k).narrow(0, 0, 1);
        let single = step(&row0("x"), &row0("mask"), &row0("mu"), &row0("t"), &row0("spks"), &row0("cond"));
        close(&format!("item{i} DiT, conditioned row alone"), &single, g("out_single"), AGAINST_REFERENCE);
        alone.push(out);
    }
    // The padded CFG batch: rows [conditioned 0..B, unconditioned 0..B], as the Euler loop makes it.
    let t_max = (0..ITEMS).map(|i| fx.item(i, "x").size()[2]).max().unwrap();
    // Row order: (row 0 of items 0..B), then (row 1 of items 0..B).
    let order: Vec<(i64, usize)> = (0..2).flat_map(|r| (0..ITEMS).map(move |i| (r, i))).collect();
    let batch = |name: &str| Tensor::stack(&order.iter().map(|&(r, i)| padded(&fx, i, name, t_max).get(r)).collect::<Vec<_>>(), 0);
    let rows_t: Vec<Tensor> = order.iter().map(|&(r, i)| fx.item(i, "t").get(r)).collect();
    let spks: Vec<Tensor> = order.iter().map(|&(r, i)| fx.item(i, "spks").get(r)).collect();
    let (x, mask, mu, cond) = (batch("x"), batch("mask"), batch("mu"), batch("cond"));
    let out = step(&x, &mask, &mu, &Tensor::stack(&rows_t, 0), &Tensor::stack(&spks, 0), &cond);
    let b = ITEMS as i64;
    for i in 0..ITEMS {
        let t = fx.item(i, "x").size()[2];
        for r in 0..2 {
            let row = out.get(r * b + i as i64).narrow(1, 0, t);
            close(&format!("item{i} DiT row {r}, padded batch vs reference batch"), &row, &fx.get("batch.out").get(r * b + i as i64).narrow(1, 0, t), AGAINST_REFERENCE);
            close(&format!("item{i} DiT row {r}, padded batch vs alone"), &row, &alone[i].get(r), BATCH_VS_ALONE);
        }
    }
    // Without guidance: the conditioned rows alone, padded.
    let first = |y: &Tensor| y.narrow(0, 0, b);
    let single = step(&first(&x), &first(&mask), &first(&mu), &first(&Tensor::stack(&rows_t, 0)), &first(&Tensor::stack(&spks, 0)), &first(&cond));
    for i in 0..ITEMS {
        let t = fx.item(i, "x").size()[2];
        close(&format!("item{i} DiT without guidance, padded batch vs reference"), &single.get(i as i64).narrow(1, 0, t), &fx.item(i, "out_single").get(0), AGAINST_REFERENCE);
    }
}

#[test]
fn the_euler_loop_matches_the_reference_alone_and_in_a_padded_batch() {
    let fx = Fixture::load("euler");
    let model = load_model(Precision::Fp32);
    let _no_grad = tch::no_grad_guard();
    let lens: Vec<i64> = (0..ITEMS).map(|i| fx.item(i, "mu").size()[1]).collect();
    let mut alone = Vec::new();
    for (i, &t) in lens.iter().enumerate() {
        let mask = Tensor::ones([1, 1, t], (Kind::Float, tch::Device::Cpu));
        let out = model.flow.solve(&fx.item(i, "mu").unsqueeze(0), &mask, &fx.item(i, "spks").unsqueeze(0), &fx.item(i, "cond").unsqueeze(0)).unwrap();
        close(&format!("item{i} Euler loop (10 steps, guidance)"), &out.get(0), fx.item(i, "out"), AGAINST_REFERENCE);
        alone.push(out.get(0));
    }
    // Padded as the flow pads a batch: to a multiple of 8 frames, at least 16.
    let frames = voxbatch::model::flow_matching::padded_frames(*lens.iter().max().unwrap(), 15000);
    let stack = |name: &str| Tensor::stack(&(0..ITEMS).map(|i| fx.item(i, name).constant_pad_nd([0, frames - lens[i]])).collect::<Vec<_>>(), 0);
    let mask = Tensor::stack(&lens.iter().map(|&t| Tensor::ones([1, t], (Kind::Float, tch::Device::Cpu)).constant_pad_nd([0, frames - t])).collect::<Vec<_>>(), 0);
    let spks = Tensor::stack(&(0..ITEMS).map(|i| fx.item(i, "spks").shallow_clone()).collect::<Vec<_>>(), 0);
    let out = model.flow.solve(&stack("mu"), &mask, &spks, &stack("cond")).unwrap();
    for (i, &t) in lens.iter().enumerate() {
        let row = out.get(i as i64).narrow(1, 0, t);
        close(&format!("item{i} Euler loop, padded batch vs alone"), &row, &alone[i], BATCH_VS_ALONE);
        close(&format!("item{i} Euler loop, padded batch vs reference"), &row, fx.item(i, "out"), AGAINST_REFERENCE);
    }
}

#[test]
fn the_causal_vocoder_matches_the_reference_stage_by_stage_alone_at_speed_and_in_a_padded_batch() {
    let fx = Fixture::load("hift");
    let model = load_model(Precision::Fp32);
    let hift = &model.hift;
    let _no_grad = tch::no_grad_guard();
    let mut alone = Vec::new();
    for i in 0..ITEMS {
        let mel = fx.item(i, "mel").unsqueeze(0);
        let frames = [mel.size()[2]];
        let samples = frames[0] * SAMPLES_PER_FRAME;
        // Stage by stage, each from the reference's own input.
        close(&format!("item{i} F0 (float64)"), &hift.f0(&mel, &frames).unwrap().get(0), fx.item(i, "f0"), AGAINST_REFERENCE);
        let source = hift.source(&fx.item(i, "f0").unsqueeze(0), samples).unwrap();
        close(&format!("item{i} source"), &source.get(0), fx.item(i, "source"), AGAINST_REFERENCE);
        let wav = hift.decode(&mel, &fx.item(i, "source").unsqueeze(0), &frames).unwrap();
        close(&format!("item{i} waveform (decoder)"), &wav.get(0), fx.item(i, "wav"), AGAINST_REFERENCE);
        let whole = hift.forward(&mel, &frames).unwrap().wav.get(0);
        close(&format!("item{i} waveform (mel to audio)"), &whole, fx.item(i, "wav"), AGAINST_REFERENCE);
        alone.push(whole);
    }
    // Speed: item 0's mel stretched as upstream's `speed` does, then vocoded.
    let speed = 1.25;
    let stretched = at_speed(fx.item(0, "mel").shallow_clone(), Some(speed)).unwrap();
    close("item0 mel at speed 1.25", &stretched, fx.get("speed.mel"), AGAINST_REFERENCE);
    let frames = [stretched.size()[1]];
    close("item0 waveform at speed 1.25", &hift.forward(&stretched.unsqueeze(0), &frames).unwrap().wav.get(0), fx.get("speed.wav"), AGAINST_REFERENCE);
    // A padded batch: each item's samples are its samples alone, to the last one (the reference's
    // own classes differ in a padded item's last ≤ 63: parity.json `hift_batch_vs_alone`).
    let mels: Vec<Tensor> = (0..ITEMS).map(|i| fx.item(i, "mel").shallow_clone()).collect();
    let (mel, frames) = pack_mels(&mels, tch::Device::Cpu).unwrap();
    close("the vocoder's batch as the reference pads it", &mel, fx.get("batch.mel"), 0.0);
    let out = hift.forward(&mel, &frames).unwrap();
    let t_max = *frames.iter().max().unwrap();
    for (i, &f) in frames.iter().enumerate() {
        let wav = out.wav.get(i as i64).narrow(0, 0, f * SAMPLES_PER_FRAME);
        close(&format!("item{i} waveform, padded batch vs alone"), &wav, &alone[i], BATCH_VS_ALONE);
        close(&format!("item{i} waveform, padded batch vs reference alone"), &wav, fx.item(i, "wav"), AGAINST_REFERENCE);
        let tail = out.wav.get(i as i64).narrow(0, f * SAMPLES_PER_FRAME, (t_max - f) * SAMPLES_PER_FRAME);
        assert_eq!(tail.abs().sum(Kind::Double).double_value(&[]), 0.0, "item{i}: audio past its end");
    }
}

#[test]
fn the_whole_token2wav_matches_the_reference_alone_and_in_a_padded_batch() {
    let fx = Fixture::load("token2wav");
    let mut model = load_model(Precision::Fp32);
    let inputs = inputs(&fx);
    let items = flow_items(&inputs);
    let mut alone = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let (mel, wav) = model.run_flow_items(std::slice::from_ref(item), &[None]).unwrap().remove(0);
        close(&format!("item{i} mel (flow)"), &mel, fx.item(i, "mel"), AGAINST_REFERENCE);
        let wav = Tensor::from_slice(&wav);
        close(&format!("item{i} waveform (token2wav)"), &wav, fx.item(i, "wav"), THROUGH_THE_PHASE);
        // The vocoder's part of it: from the flow's mel, the waveform is that mel's to the last bits.
        let frames = [mel.size()[1]];
        let from_mel = model.in_vocoder_precision(|h| h.forward(&mel.unsqueeze(0), &frames).map_err(ModelError::Inference)).unwrap().wav.get(0);
        close(&format!("item{i} waveform, token2wav vs the vocoder on its mel"), &wav, &from_mel, 0.0);
        alone.push((mel, wav));
    }
    let batched = model.run_flow_items(&items, &[None; ITEMS]).unwrap();
    for (i, (mel, wav)) in batched.into_iter().enumerate() {
        close(&format!("item{i} mel, padded batch vs alone"), &mel, &alone[i].0, BATCH_VS_ALONE);
        close(&format!("item{i} mel, padded batch vs reference"), &mel, fx.item(i, "mel"), AGAINST_REFERENCE);
        close(&format!("item{i} waveform, padded batch vs alone"), &Tensor::from_slice(&wav), &alone[i].1, THROUGH_THE_PHASE);
        close(&format!("item{i} waveform, padded batch vs reference"), &Tensor::from_slice(&wav), fx.item(i, "wav"), THROUGH_THE_PHASE);
    }
    let timing = model.last_timing.expect("timing recorded");
    assert!(timing.flow_steps > std::time::Duration::ZERO && timing.vocoder > std::time::Duration::ZERO);
}

#[test]
fn at_bf16_the_flow_and_vocoder_run_under_autocast_and_the_f0_predictor_stays_float64() {
    let (fp32, bf16) = (load_model(Precision::Fp32), load_model(Precision::Bf16));
    let fx = Fixture::load("hift");
    let mel = fx.item(2, "mel").unsqueeze(0);
    let frames = [mel.size()[2]];
    let _no_grad = tch::no_grad_guard();
    let inference = ModelError::Inference;
    // The vocoder follows the flow's precision (no `vocoder_precision` in model.toml)...
    let f0 = bf16.in_vocoder_precision(|h| h.f0(&mel, &frames).map_err(inference)).unwrap();
    let wav = bf16.in_vocoder_precision(|h| h.forward(&mel, &frames).map_err(inference)).unwrap().wav;
    let fp32_wav = fp32.hift.forward(&mel, &frames).unwrap().wav;
    let gap = relative_error(&wav, &fp32_wav);
    eprintln!("PRECISION bf16 vocoder vs fp32: {gap:.3e}");
    assert!(gap > 1e-4 && gap < 0.5, "the body runs under bf16 autocast: {gap:e}");
    // ...but its F0 predictor computes in float64, which autocast leaves alone: fp32's F0 exactly.
    assert!(f0.equal(&fp32.hift.f0(&mel, &frames).unwrap()), "F0 from float64 whatever the autocast");
    // The flow under bf16 autocast: the DiT's projections in bf16.
    let d = Fixture::load("dit");
    let g = |k: &str| d.item(0, k);
    let out = bf16.in_flow_precision(|f| f.dit.forward(g("x"), g("mask"), g("mu"), g("t"), g("spks"), g("cond")).map_err(inference)).unwrap();
    assert_eq!(out.kind(), Kind::BFloat16);
    let gap = relative_error(&out, g("out"));
    eprintln!("PRECISION bf16 DiT step vs the fp32 reference: {gap:.3e}");
    assert!(gap > 1e-4 && gap < 0.1, "{gap:e}");
}

#[test]
fn registered_voices_synthesize_at_each_speed_and_bad_input_is_refused() {
    let mut model = load_model(Precision::Fp32);
    assert_eq!(model.voices().len(), 2, "the tiny directory registers a plain and a zero-shot voice");
    assert_eq!(model.voices()[1].prompt_tokens.len(), 4);
    let mut slow = SynthItem::tokens((0..9).collect(), 0);
    slow.speed = Some(0.5);
    let items = vec![SynthItem::tokens(vec![1, 2, 3, 4, 5], 0), SynthItem::tokens((0..17).map(|t| t % 64).collect(), 1), slow];
    let audio = model.synthesize(&items).unwrap();
    assert_eq!(audio[0].len(), 5 * 2 * 480);
    assert_eq!(audio[1].len(), 17 * 2 * 480, "the prompt's frames are not in the output");
    assert_eq!(audio[2].len(), 36 * 480, "⌊18 frames / 0.5⌋");
    assert!(audio.iter().all(|a| a.iter().all(|x| x.is_finite() && x.abs() <= 0.99)));
    let stages = model.take_stages();
    assert_eq!((stages[0].items, stages[0].tokens), (3, 31));
    assert_eq!(voxbatch::model::kernels(&stages), Some("eager"), "no compiled packages: the eager port");
    let vocab = model.manifest().vocab_size();
    // 30 s of source noise: 750 tokens at speed 1, half as many at speed 0.5.
    let mut too_slow = SynthItem::tokens(vec![1; 400], 0);
    too_slow.speed = Some(0.5);
    for item in [SynthItem::tokens(vec![vocab], 0), SynthItem::tokens(vec![-1], 0), SynthItem::tokens(vec![], 0), SynthItem::tokens(vec![1], 7), SynthItem::tokens(vec![1; 751], 0), too_slow] {
        let e = model.synthesize(&[item]).unwrap_err();
        assert!(matches!(e, ModelError::BadInput(_)), "{e}");
    }
}

#[test]
fn missing_and_unexpected_tensors_are_listed_in_one_error() {
    let src = model_dir();
    let dir = tempfile::tempdir().unwrap();
    // The model's other files as they are (kind cosyvoice3: its LM, tokenizer and grammars too).
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "token2wav.safetensors" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let mut tensors = Tensor::read_safetensors(src.join("token2wav.safetensors")).unwrap();
    tensors.retain(|(name, _)| name != "hift.f0_predictor.condnet.0.weight" && name != "flow.decoder.estimator.rotary_embed.inv_freq");
    tensors.push(("flow.decoder.estimator.stray.weight".to_string(), Tensor::zeros([2], (Kind::Float, tch::Device::Cpu))));
    Tensor::write_safetensors(&tensors, dir.path().join("token2wav.safetensors")).unwrap();
    let manifest = Manifest::load(dir.path()).unwrap();
    let e = match Token2Wav::load(dir.path(), manifest, Device::Cpu, Precision::Fp32) {
        Ok(_) => panic!("a model with missing tensors loaded"),
        Err(e) => e.to_string(),
    };
    for expected in ["hift.f0_predictor.condnet.0.weight: missing", "flow.decoder.estimator.rotary_embed.inv_freq: missing", "flow.decoder.estimator.stray.weight: unexpected"] {
        assert!(e.contains(expected), "{e}");
    }
    assert!(e.contains("convert_cosyvoice.py"), "{e}");
}
