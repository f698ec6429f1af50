//! CosyVoice3's compiled stages (issue 43) on the CPU: the tiny model's DiT and causal vocoder body
//! compiled by `tools/compile_token2wav.py --family cosyvoice3` (AOTInductor; scripts/tiny-packages.sh builds
//! `models/cosyvoice3-tiny-compiled`, links to `models/cosyvoice3-tiny`'s files and its packages)
//! give the eager port's mels and audio, alone and in a padded batch, and a package made from
//! other weights is not used. The inputs are the parity fixtures' (`tests/data/cosyvoice3`: three
//! items with and without prompts, the reference's x-vectors), fp32 on the CPU.
//!
//! Tolerances, on max |compiled − eager| / max(1, max |eager|) as `cosyvoice3_parity` measures:
//! the package computes the port's operations on the same inputs, but inductor fuses them and its
//! CPU kernels sum in another order (its matmuls, convolutions and layer norms are not libtorch's
//! eager ones), so values move in their last bits: measured (2026-12-06, this CPU) ≤ 3.3e-7 on the
//! mel after ten Euler steps with guidance, 1.5e-7 on the vocoder from one mel — both held to
//! `cosyvoice3_parity`'s `BATCH_VS_ALONE`, 2e-6 ([`MEL`], [`VOCODER_FROM_ONE_MEL`]), which also
//! bounds the compiled padded batch against its items alone. A waveform from each path's own mel
//! carries the mel's last bits through the F0 predictor into thousands of radians of the source's
//! phase, ~100 times larger (`cosyvoice3_parity`'s `THROUGH_THE_PHASE`, 2e-5, the same bound
//! here): measured ≤ 5.6e-6 ([`WAVEFORM`]). A wrong package is wrong by far more: the DiT compiled
//! without one block's attention-output bias moved the mel by 1.7e-2, the vocoder body without one
//! convolution's bias the waveform by 8.7e-3 (both made the first test fail).

use std::collections::HashMap;
use std::path::Path;

use crate::common::{self, repo_path, weight_casts};
use tch::{Kind, Tensor};
use voxbatch::model::cosyvoice3::Token2Wav;
use voxbatch::model::token2wav::{pack_mels, FlowItem};
use voxbatch::model::vocoder::SAMPLES_PER_FRAME;
use voxbatch::model::{kernels, Device, Manifest, ModelError, Precision, Synthesizer};

const KEY: &str = "cpu-torch2.11.0-fp32";
/// The flow's mel, compiled against eager (see the module's doc).
const MEL: f64 = 2e-6;
/// The vocoder (its body compiled) against the eager vocoder, from the same mel.
const VOCODER_FROM_ONE_MEL: f64 = 2e-6;
/// Whole token2wav waveforms, each from its own path's mel (through the phase).
const WAVEFORM: f64 = 2e-5;
/// A padded batch against each item alone, both compiled: the mel as `cosyvoice3_parity`'s
/// `BATCH_VS_ALONE`; the waveform through the phase ([`WAVEFORM`]).
const BATCH_VS_ALONE_MEL: f64 = 2e-6;

fn load(dir: &Path) -> Token2Wav {
    let manifest = Manifest::load(dir).unwrap_or_else(|e| panic!("{e}; run scripts/tiny-packages.sh (it compiles models/cosyvoice3-tiny-compiled)"));
    Token2Wav::load(dir, manifest, Device::Cpu, Precision::Fp32).unwrap()
}

fn distance(what: &str, ours: &Tensor, reference: &Tensor, tolerance: f64) {
    assert_eq!(ours.size(), reference.size(), "{what}: shapes differ");
    let abs = ours.to_kind(Kind::Double).f_sub(&reference.to_kind(Kind::Double)).unwrap().abs().max().double_value(&[]);
    let err = abs / reference.to_kind(Kind::Double).abs().max().double_value(&[]).max(1.0);
    eprintln!("COMPILED {what}: {err:.3e}");
    assert!(err <= tolerance, "{what}: {err:.3e} > {tolerance:e}");
}

/// The whole-token2wav fixture's three items: tokens, prompt tokens, prompt mel, x-vector.
struct Item {
    tokens: Vec<i64>,
    prompt: Vec<i64>,
    prompt_feat: Tensor,
    embedding: Tensor,
}

fn fixture_items() -> Vec<Item> {
    let path = repo_path("tests/data/cosyvoice3/parity-token2wav.safetensors");
    let fx: HashMap<String, Tensor> = Tensor::read_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).into_iter().collect();
    let get = |i: usize, name: &str| fx.get(&format!("item{i}.{name}")).unwrap_or_else(|| panic!("fixture item{i}.{name}")).shallow_clone();
    (0..3)
        .map(|i| Item {
            tokens: Vec::<i64>::try_from(get(i, "token")).unwrap(),
            prompt: Vec::<i64>::try_from(get(i, "prompt_token")).unwrap(),
            prompt_feat: get(i, "prompt_feat"),
            embedding: get(i, "embedding"),
        })
        .collect()
}

fn flow_items(items: &[Item]) -> Vec<FlowItem<'_>> {
    items.iter().map(|i| FlowItem { tokens: &i.tokens, prompt_tokens: &i.prompt, prompt_feat: &i.prompt_feat, embedding: &i.embedding }).collect()
}

#[test]
fn cosyvoice3_compiled_stages_give_the_eager_ports_mel_and_audio_alone_and_in_a_padded_batch() {
    let mut eager = load(&repo_path("models/cosyvoice3-tiny"));
    assert!(!eager.flow.is_compiled() && eager.hift.compiled().is_none(), "a directory without packages runs eager");
    let mut compiled = load(&repo_path("models/cosyvoice3-tiny-compiled"));
    assert!(compiled.flow.is_compiled(), "the DiT package of this machine's key is used");
    assert!(compiled.hift.compiled().is_some(), "the vocoder body's package of this machine's key is used");
    // Bootstrap compiles the tool's defaults: the body channels-last, its STFT channels padded, its dilations phase-split.
    let hift_variant = &compiled.hift.compiled().unwrap().variant;
    assert!(
        hift_variant.contains("layout=time-major") && hift_variant.contains("hift_channel_multiple=4") && hift_variant.contains("hift_dilation=phases"),
        "{hift_variant}"
    );
    let fixture = fixture_items();
    let items = flow_items(&fixture);

    // Each item alone, then the three as one padded batch, through both.
    let mut alone = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let (mel_e, wav_e) = eager.run_flow_items(std::slice::from_ref(item), &[None]).unwrap().remove(0);
        let (mel_c, wav_c) = compiled.run_flow_items(std::slice::from_ref(item), &[None]).unwrap().remove(0);
        distance(&format!("item{i} mel alone"), &mel_c, &mel_e, MEL);
        distance(&format!("item{i} waveform alone"), &Tensor::from_slice(&wav_c), &Tensor::from_slice(&wav_e), WAVEFORM);
        alone.push((mel_c, Tensor::from_slice(&wav_c)));
    }
    // Every step and body of those batches ran on its package, and the eager model's on none.
    assert_eq!(kernels(&compiled.take_stages()), Some("compiled"));
    assert_eq!(kernels(&eager.take_stages()), Some("eager"));
    let batch_e = eager.run_flow_items(&items, &[None; 3]).unwrap();
    let batch_c = compiled.run_flow_items(&items, &[None; 3]).unwrap();
    assert_eq!(kernels(&compiled.take_stages()), Some("compiled"));
    for (i, ((mel_e, wav_e), (mel_c, wav_c))) in batch_e.iter().zip(&batch_c).enumerate() {
        let (wav_e, wav_c) = (Tensor::from_slice(wav_e), Tensor::from_slice(wav_c));
        distance(&format!("item{i} mel, padded batch"), mel_c, mel_e, MEL);
        distance(&format!("item{i} waveform, padded batch"), &wav_c, &wav_e, WAVEFORM);
        distance(&format!("item{i} mel compiled, padded batch vs alone"), mel_c, &alone[i].0, BATCH_VS_ALONE_MEL);
        distance(&format!("item{i} waveform compiled, padded batch vs alone"), &wav_c, &alone[i].1, WAVEFORM);
    }

    // The vocoder from one padded batch of mels (the eager flow's): the compiled body against the eager one.
    let mels: Vec<Tensor> = batch_e.iter().map(|(mel, _)| mel.shallow_clone()).collect();
    let (mel, frames) = pack_mels(&mels, tch::Device::Cpu).unwrap();
    let vocode = |m: &Token2Wav| m.in_vocoder_precision(|h| h.forward(&mel, &frames).map_err(ModelError::Inference)).unwrap().wav;
    let (wav_e, wav_c) = (vocode(&eager), vocode(&compiled));
    distance("the vocoder from one padded batch of mels", &wav_c, &wav_e, VOCODER_FROM_ONE_MEL);
    let t_max = *frames.iter().max().unwrap();
    for (i, &f) in frames.iter().enumerate() {
        let tail = wav_c.get(i as i64).narrow(0, f * SAMPLES_PER_FRAME, (t_max - f) * SAMPLES_PER_FRAME);
        assert_eq!(tail.abs().sum(Kind::Double).double_value(&[]), 0.0, "item{i}: compiled audio past its end");
    }
    assert_eq!(kernels(&compiled.take_stages()), None, "stage checks are not batches");

    // One DiT step alone (`Flow::estimate`): 3 items' doubled rows, 40 frames, two items padded;
    // each item's frames compared.
    tch::manual_seed(5);
    let (rows, frames) = (6, 40);
    let mask = Tensor::ones([rows, 1, frames], (Kind::Float, tch::Device::Cpu));
    for (row, valid) in [(1, 30), (4, 30), (2, 17), (5, 17)] {
        let _ = mask.get(row).narrow(1, valid, frames - valid).fill_(0.0);
    }
    let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu));
    let (x, mu, cond, spks, t) = (r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80]), Tensor::rand([rows], (Kind::Float, tch::Device::Cpu)));
    let step = |m: &Token2Wav| m.flow.estimate(&x, &mask, &mu, &t, &spks, &cond).unwrap() * &mask;
    let (step_c, step_e) = (step(&compiled), step(&eager));
    assert_eq!((compiled.flow.take_step_counts(), eager.flow.take_step_counts()), ((1, 0), (0, 1)), "one step each, on the package and on the port");
    distance("one DiT step, a padded doubled batch", &step_c, &step_e, MEL);

    // The directory's memory profile is the compiled one's (calibration files it apart).
    use voxbatch::model::compiled::profile_precision;
    let manifest = |d: &str| Manifest::load(&repo_path(d)).unwrap();
    assert_eq!(profile_precision(&manifest("models/cosyvoice3-tiny-compiled"), Device::Cpu, Precision::Fp32, false), "fp32+compiled");
    assert_eq!(profile_precision(&manifest("models/cosyvoice3-tiny"), Device::Cpu, Precision::Fp32, false), "fp32");
}

#[test]
fn a_cosyvoice3_package_made_from_other_weights_or_for_another_key_is_not_used() {
    // A copy of the compiled directory (files linked) whose weights or package folder the test changes.
    let copy = || {
        let src = repo_path("models/cosyvoice3-tiny-compiled");
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{} (run scripts/tiny-packages.sh): {e}", src.display())) {
            let entry = entry.unwrap();
            std::os::unix::fs::symlink(std::fs::canonicalize(entry.path()).unwrap(), dir.path().join(entry.file_name())).unwrap();
        }
        dir
    };
    // Weights other than those the packages were made from (a model converted again): eager.
    let reconverted = copy();
    let weights = reconverted.path().join("token2wav.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    std::fs::remove_file(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // the last byte of the last tensor's data
    std::fs::write(&weights, bytes).unwrap();
    let from_reconverted = load(reconverted.path());
    assert!(!from_reconverted.flow.is_compiled() && from_reconverted.hift.compiled().is_none(), "a package is used only with its weights");
    // Packages of another machine's key only: eager.
    let elsewhere = copy();
    std::fs::remove_file(elsewhere.path().join("compiled")).unwrap();
    let other = elsewhere.path().join("compiled").join("sm90-torch2.11.0-bf16");
    std::fs::create_dir_all(&other).unwrap();
    let ours = repo_path("models/cosyvoice3-tiny-compiled").join("compiled").join(KEY);
    for stage in ["estimator.pt2", "hift.pt2"] {
        std::fs::copy(ours.join(stage), other.join(stage)).unwrap();
    }
    let from_elsewhere = load(elsewhere.path());
    assert!(!from_elsewhere.flow.is_compiled() && from_elsewhere.hift.compiled().is_none());
    // A vocoder run at another precision than its package's (a benchmark's setting): eager.
    let mut compiled = load(&repo_path("models/cosyvoice3-tiny-compiled"));
    compiled.set_vocoder_precision(Precision::Bf16);
    assert!(compiled.hift.compiled().is_none() && compiled.flow.is_compiled());
}

/// `compile_token2wav.py --family cosyvoice3` on the tiny model with `args`: one JSON report per stage.
fn compile_tool_reports(args: &[&str]) -> Vec<serde_json::Value> {
    let model = repo_path("models/cosyvoice3-tiny");
    common::compile_tool_reports(&[&["--family", "cosyvoice3", "--model", model.to_str().unwrap()][..], args].concat())
}

/// Each form the tool may compute the causal vocoder body in on a GPU (channels-last, its STFT
/// channels padded, its dilated causal convolutions split into phases, and the three together, the
/// default) computes the channel-major body, the eager port's: `--eager-check`, fp32, no compile.
/// The CPU packages above are compiled in the default form; these are the others.
#[test]
fn every_cosyvoice3_vocoder_form_computes_the_channel_major_body() {
    let forms: [&[&str]; 3] = [
        &[],
        &["--hift-channel-multiple", "1", "--hift-dilation", "dilated"],
        &["--hift-channel-multiple", "8", "--hift-dilation", "phases"],
    ];
    for form in forms {
        let reports = compile_tool_reports(&[&["--device", "cpu", "--precision", "fp32", "--stages", "hift", "--eager-check"], form].concat());
        assert_eq!(reports.len(), 1, "{form:?}: {reports:?}");
        let worst = reports[0]["max_abs_difference_vs_reference_eager"].as_f64().unwrap_or_else(|| panic!("{form:?}: {}", reports[0]));
        // fp32 on a CPU: the same products summed in another order (measured 1.9e-6 on outputs of ~1e2).
        assert!(worst < 1e-4, "{form:?}: the body differs from the channel-major one by {worst}");
    }
}

/// What the GPU host's compile of the DiT builds, generated on this machine without a GPU
/// (`--cuda-kernels`, tools/compile/fake_cuda.py): the export holds no tensor off the CUDA device (a
/// CPU constant in a CUDA package crashed an H100 bench: `checks.require_on_device` refuses it, and
/// the listing runs it), and its weights are folded into the package at bf16 by default (inductor's
/// freezing, `estimator:freezing=True`): no kernel casts a weight on each call.
#[test]
fn the_dits_cuda_compile_holds_nothing_off_the_device_and_folds_its_weights() {
    let args = ["--cuda-kernels", "--precision", "bf16", "--stages", "estimator", "--kernels-batch", "8", "--kernels-frames", "104"];
    let folded = compile_tool_reports(&args);
    assert_eq!(folded.len(), 1, "{folded:?}");
    assert!(folded[0]["triton_launches"].as_u64().unwrap() > 10, "{}", folded[0]);
    assert_eq!(weight_casts(&folded[0]), 0, "the DiT casts its weights on each call: {}", folded[0]);
    let unfrozen = compile_tool_reports(&[&args[..], &["--inductor-option", "estimator:freezing=False"]].concat());
    assert!(weight_casts(&unfrozen[0]) > 10, "without freezing its weights are cast per call (what the check would miss): {}", unfrozen[0]);
}

/// The GPU check, as CosyVoice2's (`compiled::on_a_gpu_each_compiled_stage_gives_the_eager_ports_output_at_the_same_precision`):
/// the tiny model's packages compiled on that GPU at bf16 into `models/cosyvoice3-tiny-compiled-gpu`
/// (a directory linking `models/cosyvoice3-tiny`'s files, then `tools/compile_token2wav.py --family
/// cosyvoice3 --model models/cosyvoice3-tiny-compiled-gpu --device cuda:0 --precision bf16
/// --max-frames 600 --max-batch 64`), run with `VOXBATCH_TEST_DEVICE=cuda:0 --ignored`. One DiT call
/// (CFG-doubled, padded items) and one vocoder pass from the same mel, each package against the eager
/// port at the same precision: SNR ≥ [`GPU_STAGE_SNR_DB`], CosyVoice2's bound (fused kernels round
/// in other places — the eager DiT rounds its residual stream to bf16 after every operation, the
/// package within fused kernels does not; nothing else may differ). The same packages compiled for
/// this CPU at bf16 (2026-12-06, `VOXBATCH_TEST_DEVICE=cpu`, where only the graphs' part cannot
/// run): DiT 37.0 dB, vocoder 53.5 dB. Then small batches' flow steps replayed as CUDA graphs give
/// the package's mel called step by step (SNR ≥ [`GRAPH_SNR_DB`]), every step replayed.
const GPU_STAGE_SNR_DB: f64 = 35.0;
/// As CosyVoice2's: the same kernels on the same shapes, a library's other algorithm under capture at most.
const GRAPH_SNR_DB: f64 = 60.0;

fn snr_db(actual: &Tensor, reference: &Tensor) -> f64 {
    let signal = reference.to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[]);
    let noise = (actual.to_kind(Kind::Double) - reference.to_kind(Kind::Double)).square().sum(Kind::Double).double_value(&[]);
    10.0 * (signal / noise.max(1e-30)).log10()
}

#[test]
#[ignore = "needs a GPU and the tiny CosyVoice3's packages compiled there (models/cosyvoice3-tiny-compiled-gpu)"]
fn on_a_gpu_cosyvoice3s_compiled_stages_give_the_eager_ports_output_and_small_steps_replay_as_graphs() {
    use voxbatch::model::flow_graphs::FlowGraphSettings;
    let device: Device = std::env::var("VOXBATCH_TEST_DEVICE").expect("VOXBATCH_TEST_DEVICE=cuda:N").parse().unwrap();
    let dir = repo_path("models/cosyvoice3-tiny-compiled-gpu");
    let load = |d: &Path| Token2Wav::load(d, Manifest::load(d).unwrap_or_else(|e| panic!("{e}: see this test's doc")), device, Precision::Bf16).unwrap();
    let compiled = load(&dir);
    assert!(compiled.flow.is_compiled() && compiled.hift.compiled().is_some(), "packages of this GPU's key in {}", dir.display());
    let eager = load(&repo_path("models/cosyvoice3-tiny"));
    let dev = device.to_tch();
    tch::manual_seed(11);
    let _no_grad = tch::no_grad_guard();

    // One DiT call on 3 items' doubled rows, 96 frames, two items padded; each item's frames compared.
    let (rows, frames) = (6, 96);
    let mask = Tensor::ones([rows, 1, frames], (Kind::Float, dev));
    for (row, valid) in [(1, 70), (4, 70), (2, 41), (5, 41)] {
        let _ = mask.get(row).narrow(1, valid, frames - valid).fill_(0.0);
    }
    let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, dev));
    let (x, mu, cond, spks) = (r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80]));
    let t = Tensor::rand([rows], (Kind::Float, dev));
    // As the flow passes them: typed as its speaker projection's output under autocast (bf16).
    let bf16 = |y: &Tensor| y.to_kind(Kind::BFloat16);
    let call = |m: &Token2Wav| {
        m.in_flow_precision(|f| f.estimate(&bf16(&x), &bf16(&mask), &bf16(&mu), &bf16(&t), &bf16(&spks), &bf16(&cond)).map_err(ModelError::Inference))
            .unwrap()
            .to_kind(Kind::Float)
            * &mask
    };
    let (compiled_call, eager_call) = (call(&compiled), call(&eager));
    assert_eq!(compiled.flow.take_step_counts(), (1, 0), "the call ran the package");
    assert_eq!(eager.flow.take_step_counts(), (0, 1));
    let dit_snr = snr_db(&compiled_call, &eager_call);
    eprintln!("COMPILED DiT (bf16) vs eager: SNR {dit_snr:.1} dB");

    // One vocoder pass from the same mel, two items of different lengths.
    let frames_of = [64i64, 40];
    let mel = r(&[2, 80, 64]) * 0.5;
    let _ = mel.get(1).narrow(1, 40, 24).fill_(0.0);
    let vocode = |m: &Token2Wav| m.in_vocoder_precision(|h| h.forward(&mel, &frames_of).map_err(ModelError::Inference)).unwrap().wav;
    let (wav_c, wav_e) = (vocode(&compiled), vocode(&eager));
    assert_eq!(compiled.hift.take_call_counts().0, 1, "the pass ran the package");
    let wav_snr = snr_db(&wav_c, &wav_e);
    eprintln!("COMPILED vocoder body (bf16) vs eager: SNR {wav_snr:.1} dB");
    assert!(dit_snr >= GPU_STAGE_SNR_DB && wav_snr >= GPU_STAGE_SNR_DB, "DiT {dit_snr:.1} dB, vocoder {wav_snr:.1} dB: below {GPU_STAGE_SNR_DB} dB");

    // Small batches' steps as graphs: the package's mel called step by step, every step replayed.
    let mut plain = load(&dir);
    let mut graphed = load(&dir);
    graphed.flow.set_graphs(FlowGraphSettings { graphs: 2, max_frames: 1 << 20 }, device);
    let fixture = fixture_items();
    let items = flow_items(&fixture);
    for (name, batch) in [("three", &items[..]), ("one", &items[..1]), ("three again", &items[..])] {
        let speeds = vec![None; batch.len()];
        let (out_p, out_g) = (plain.run_flow_items(batch, &speeds).unwrap(), graphed.run_flow_items(batch, &speeds).unwrap());
        for ((mel_p, _), (mel_g, _)) in out_p.iter().zip(&out_g) {
            let snr = snr_db(mel_g, mel_p);
            eprintln!("COMPILED flow step graphs, batch {name}: mel SNR {snr:.1} dB against the package called step by step");
            assert!(snr >= GRAPH_SNR_DB, "batch {name}: {snr:.1} dB");
        }
    }
    let stats = graphed.flow.graph_stats();
    assert_eq!(stats.captured, 2, "one graph per step shape: {stats:?}");
    assert_eq!(stats.replays, 30, "every step of the three batches replayed: {stats:?}");
}
