//! Compiled token2wav stages (issue 16) on the CPU: the tiny model's flow encoder, estimator and
//! vocoder body compiled by `tools/compile_token2wav.py` (AOTInductor; scripts/tiny-packages.sh builds
//! `models/cosyvoice2-tiny-compiled`) give the eager port's mel and audio, and every package that
//! cannot serve — absent for this machine's key, unreadable, or made from other weights — leaves
//! its stage on the eager port instead of failing the model. On a GPU (ignored here;
//! scripts/device/run.sh parity runs it): each compiled stage against the eager port at the same
//! precision, SNR ≥ 35 dB (41 dB for the estimator at bf16 on this CPU). GPU figures: docs/PERFORMANCE.md.

use crate::common;

use std::path::Path;

use common::{kernel_launches, repo_path, weight_casts};
use tch::Tensor;
use voxbatch::model::cosyvoice2::Token2Wav;
use voxbatch::model::{Device, Manifest, Precision, SynthItem};

const KEY: &str = "cpu-torch2.11.0-fp32";

fn load(dir: &Path) -> Token2Wav {
    Token2Wav::load(dir, Manifest::load(dir).unwrap(), Device::Cpu, Precision::Fp32).unwrap()
}

/// A copy of the compiled tiny model's directory (files linked) whose package and weights the
/// test may replace.
fn variant() -> tempfile::TempDir {
    let src = repo_path("models/cosyvoice2-tiny-compiled");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{} (run scripts/tiny-packages.sh): {e}", src.display())) {
        let entry = entry.unwrap();
        if entry.file_name() != "compiled" {
            std::os::unix::fs::symlink(std::fs::canonicalize(entry.path()).unwrap(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let package = dir.path().join("compiled").join(KEY);
    std::fs::create_dir_all(&package).unwrap();
    for stage in ["encoder.pt2", "estimator.pt2", "hift.pt2"] {
        std::fs::copy(src.join("compiled").join(KEY).join(stage), package.join(stage)).unwrap();
    }
    dir
}

fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    let diff = (a - b).abs().max().double_value(&[]);
    diff / b.abs().max().double_value(&[]).max(1e-12)
}

#[test]
fn compiled_stages_give_the_eager_ports_output_and_a_package_that_cannot_serve_falls_back_to_eager() {
    let items = vec![SynthItem::tokens((0..23).map(|t| t % 64).collect(), 1), SynthItem::tokens((5..16).collect(), 0)];
    let draws = voxbatch::model::cosyvoice2::hift::SourceDraws::random(2, 23 * 2 * 480, tch::Device::Cpu).unwrap();
    let run = |m: &mut Token2Wav| m.run(&items, Some(&draws)).unwrap();

    let mut eager = load(&repo_path("models/cosyvoice2-tiny"));
    assert!(!eager.flow.is_compiled() && eager.hift.compiled().is_none(), "a directory without packages runs eager");
    assert!(!eager.flow.encoder_is_compiled());
    let mut compiled = load(&repo_path("models/cosyvoice2-tiny-compiled"));
    assert!(compiled.flow.is_compiled(), "the estimator package of this machine's key is used");
    assert!(compiled.flow.encoder_is_compiled(), "the encoder package of this machine's key is used");
    // The vocoder's package is filed under its own precision (tf32, which on a CPU is fp32).
    assert!(compiled.hift.compiled().is_some(), "the vocoder package of this machine's key is used");
    // Which variant a package computes comes from its metadata (for the log): scripts/tiny-packages.sh compiles the defaults.
    let hift_variant = &compiled.hift.compiled().unwrap().variant;
    assert!(
        hift_variant.contains("layout=time-major-strided-copy") && hift_variant.contains("hift_channel_multiple=4") && hift_variant.contains("hift_dilation=phases"),
        "{hift_variant}"
    );
    let (out_e, out_c) = (run(&mut eager), run(&mut compiled));
    // Each batch says which kernels its steps ran on (the worker records it per batch).
    use voxbatch::model::{kernels, Synthesizer};
    assert_eq!(kernels(&compiled.take_stages()), Some("compiled"));
    assert_eq!(kernels(&eager.take_stages()), Some("eager"));
    for ((mel_e, wav_e), (mel_c, wav_c)) in out_e.iter().zip(out_c.iter()) {
        let (mel_err, wav_err) = (relative_error(mel_c, mel_e), relative_error(&Tensor::from_slice(wav_c), &Tensor::from_slice(wav_e)));
        assert!(mel_err < 1e-4 && wav_err < 1e-3, "compiled vs eager: mel {mel_err:e}, audio {wav_err:e}");
    }

    // The memory profile (calibration) of a compiled directory is its own: its peaks are not the
    // eager port's; nor are cuDNN benchmark mode's, on CUDA (on a CPU it changes nothing). (No
    // GPU here: the CUDA directory has no package of this machine's key, so it is not compiled.)
    use voxbatch::model::compiled::profile_precision;
    let manifest = |d: &Path| Manifest::load(d).unwrap();
    let (compiled_dir, plain_dir) = (manifest(&repo_path("models/cosyvoice2-tiny-compiled")), manifest(&repo_path("models/cosyvoice2-tiny")));
    assert_eq!(profile_precision(&compiled_dir, Device::Cpu, Precision::Fp32, false), "fp32+compiled");
    assert_eq!(profile_precision(&compiled_dir, Device::Cpu, Precision::Fp32, true), "fp32+compiled");
    assert_eq!(profile_precision(&plain_dir, Device::Cpu, Precision::Fp32, false), "fp32");
    assert_eq!(profile_precision(&plain_dir, Device::Cuda(0), Precision::Bf16, true), "bf16+cudnn-benchmark");
    assert_eq!(profile_precision(&plain_dir, Device::Cuda(0), Precision::Bf16, false), "bf16");

    // No package of this machine's key (another GPU, torch or precision): eager.
    let other_key = variant();
    std::fs::rename(other_key.path().join("compiled").join(KEY), other_key.path().join("compiled").join("sm90-torch2.11.0-bf16")).unwrap();
    let from_other_key = load(other_key.path());
    assert!(!from_other_key.flow.is_compiled() && !from_other_key.flow.encoder_is_compiled() && from_other_key.hift.compiled().is_none());
    // An unreadable package: that stage eager (a warning), not a failure; the other stays compiled.
    let broken = variant();
    std::fs::write(broken.path().join("compiled").join(KEY).join("estimator.pt2"), b"not a package").unwrap();
    let mut from_broken = load(broken.path());
    assert!(!from_broken.flow.is_compiled() && from_broken.flow.encoder_is_compiled() && from_broken.hift.compiled().is_some());
    let (from_broken_out, eager_out) = (run(&mut from_broken), run(&mut eager));
    assert_eq!(kernels(&from_broken.take_stages()), Some("mixed"), "eager estimator steps, compiled encoder and vocoder");
    assert!(relative_error(&Tensor::from_slice(&from_broken_out[0].1), &Tensor::from_slice(&eager_out[0].1)) < 1e-3);
    // A vocoder of another precision than its package's (a benchmark's setting): eager.
    compiled.set_vocoder_precision(Precision::Bf16);
    assert!(compiled.hift.compiled().is_none());
    // Weights other than those the package was made from (a model converted again): eager.
    let reconverted = variant();
    let weights = reconverted.path().join("token2wav.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    std::fs::remove_file(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // the last byte of the last tensor's data
    std::fs::write(&weights, bytes).unwrap();
    let from_reconverted = load(reconverted.path());
    assert!(
        !from_reconverted.flow.is_compiled() && !from_reconverted.flow.encoder_is_compiled() && from_reconverted.hift.compiled().is_none(),
        "a package is used only with the weights it was compiled from"
    );
}

#[test]
fn a_package_given_bf16_inputs_reads_them_as_the_fp32_it_was_traced_with() {
    // Under bf16 autocast the flow's speaker projection comes out bf16; the compiled kernels
    // index every input as fp32 and would read such a tensor past its end (issue 16's abort on
    // the H200). `run` converts, so bf16 inputs give what their fp32 values give.
    use tch::{Kind, Tensor};
    use voxbatch::model::compiled::CompiledPackage;
    let path = repo_path("models/cosyvoice2-tiny-compiled").join("compiled").join(KEY).join("estimator.pt2");
    let package = CompiledPackage::load(&path, Device::Cpu).expect("the tiny estimator package (scripts/tiny-packages.sh)");
    tch::manual_seed(3);
    let (b, frames) = (4, 40);
    let x = Tensor::randn([b, 80, frames], (Kind::Float, tch::Device::Cpu));
    let mask = Tensor::ones([b, 1, frames], (Kind::Float, tch::Device::Cpu));
    let mu = Tensor::randn([b, 80, frames], (Kind::Float, tch::Device::Cpu));
    let t = Tensor::rand([b], (Kind::Float, tch::Device::Cpu));
    let spks = Tensor::randn([b, 80], (Kind::Float, tch::Device::Cpu)).to_kind(Kind::BFloat16);
    let cond = Tensor::randn([b, 80, frames], (Kind::Float, tch::Device::Cpu));
    let as_bf16 = package.run(&[&x, &mask, &mu, &t, &spks, &cond]).unwrap().remove(0);
    let spks32 = spks.to_kind(Kind::Float);
    let as_fp32 = package.run(&[&x, &mask, &mu, &t, &spks32, &cond]).unwrap().remove(0);
    assert_eq!(as_bf16.size(), [b, 80, frames]);
    assert!(as_bf16.equal(&as_fp32), "bf16 inputs are read as their fp32 values");
}

/// Each way tools/compile_token2wav.py can lay out the stages it compiles (the time-major
/// estimator's convolution paths and Mish forms, its fused attention projections, the vocoder
/// body's padded STFT channels and phase-split dilated convolutions)
/// computes what the reference's own modules compute: its `--eager-check` on the tiny model in
/// fp32, no compile. A variant must agree before it is worth a GPU's time to measure; on the GPU
/// the compiled package is then checked against its eager module (`--check`).
#[test]
fn every_compile_variant_computes_the_reference_stages() {
    let variants: [&[&str]; 4] = [
        &["--layout", "time-major-strided", "--mish", "exp", "--hift-channel-multiple", "4", "--attention", "flash", "--qkv", "fused"],
        &["--layout", "time-major-shift", "--hift-channel-multiple", "8", "--hift-dilation", "phases"],
        &["--layout", "time-major-strided-copy"],
        // The defaults before 2026-12-05 (commit d1195c5) (the tool's defaults are the first line's, `--qkv auto`).
        &["--layout", "time-major", "--mish", "exact", "--hift-channel-multiple", "1", "--hift-dilation", "dilated"],
    ];
    for args in variants {
        let model = repo_path("models/cosyvoice2-tiny");
        let common_args = ["--model", model.to_str().unwrap(), "--device", "cpu", "--precision", "fp32", "--attention", "sdpa", "--stages", "estimator,hift", "--eager-check"];
        let reports = common::compile_tool_reports(&[&common_args[..], args].concat());
        assert_eq!(reports.len(), 2, "{args:?}: one report per stage: {reports:?}");
        for r in &reports {
            let worst = r["max_abs_difference_vs_reference_eager"].as_f64().unwrap();
            // fp32 on a CPU: the same sums in another order (the reference layout's own packages: 4e-6).
            assert!(worst < 1e-4, "{args:?}: {} differs from the reference by {worst}", r["stage"]);
        }
    }
}

/// `compile_token2wav.py --cuda-kernels` on the tiny model with `args`: one report per stage.
fn cuda_kernel_reports(args: &[&str]) -> Vec<serde_json::Value> {
    let model = repo_path("models/cosyvoice2-tiny");
    common::compile_tool_reports(&[&["--model", model.to_str().unwrap(), "--cuda-kernels", "--kernels-batch", "16", "--kernels-frames", "200"][..], args].concat())
}

/// The estimator's kernels as a CUDA compile generates them, listed on this machine without a GPU
/// (`compile_token2wav.py --cuda-kernels`, tools/compile/fake_cuda.py). Four listings (each a
/// Python process of its own, run side by side) show three things:
/// - **the strided window takes Mish out of the CUDA window kernel**: the time-major layout's window
///   kernel fuses the ResNet blocks' Mish into the `cat` of each convolution's three frames (the
///   H200 profile's slowest element-wise kernel, `…add_cat_constant_pad_nd_mish…`: Mish evaluated
///   once per window copy), and the strided layout has no such kernel — the window is read from
///   the padded frames, written once;
/// - **the strided-copy layout writes each window with a kernel of the package**: the strided
///   layout hands each causal convolution's window — an overlapping view of the padded frames — to
///   a batched matmul, which libtorch copies first with its generic strided copy (the H200
///   profile's bf16 `direct_copy_kernel_cuda`, 0.081 s of 1.298 per batch of 128, 2026-12-05);
///   `time-major-strided-copy` writes each window with one kernel of the package
///   (`…as_strided_clone…`) and multiplies it with a plain `addmm`;
/// - **the estimator's weights are folded into its package by default** (inductor's `freezing`,
///   one of the tool's default `--inductor-option`s, stage-prefixed): its kernels cast no fp32
///   weight to bf16 on each call, while the encoder, compiled in the same run, still does
///   (freezing failed in the encoder's CUDA compile on an H100: docs/PERFORMANCE.md, 2026-12-05,
///   commit 5163193); and `estimator:freezing=False` given after the default turns it off again.
#[test]
fn the_estimators_cuda_kernels_show_its_window_layouts_and_its_folded_weights() {
    // Mish as torch computes it (its kernels are named `mish`) and the weights not folded: the
    // layout alone differs between the first two.
    let unfolded = ["--mish", "exact", "--inductor-option", "estimator:freezing=False"];
    let configurations: [Vec<&str>; 4] = [
        [&["--stages", "estimator", "--layout", "time-major"][..], &unfolded].concat(),
        [&["--stages", "estimator", "--layout", "time-major-strided"][..], &unfolded].concat(),
        vec!["--stages", "encoder,estimator", "--layout", "time-major-strided"],
        vec!["--stages", "estimator", "--layout", "time-major-strided-copy"],
    ];
    let listings: Vec<Vec<serde_json::Value>> = std::thread::scope(|scope| {
        let running: Vec<_> = configurations.iter().map(|args| scope.spawn(move || cuda_kernel_reports(args))).collect();
        running.into_iter().map(|listing| listing.join().unwrap()).collect()
    });
    let (time_major, strided_unfolded, encoder_and_strided, strided_copy) = (&listings[0][0], &listings[1][0], &listings[2], &listings[3][0]);
    assert_eq!(encoder_and_strided.len(), 2, "{encoder_and_strided:?}");
    let (encoder, strided) = (&encoder_and_strided[0], &encoder_and_strided[1]);
    assert_eq!((encoder["stage"].as_str(), strided["stage"].as_str()), (Some("encoder"), Some("estimator")));
    for (report, layout) in [(time_major, "time-major"), (strided_unfolded, "time-major-strided"), (strided, "time-major-strided"), (strided_copy, "time-major-strided-copy")] {
        assert_eq!(report["voxbatch.layout"], layout);
    }
    for report in [time_major, strided_unfolded] {
        assert!(report["triton_launches"].as_u64().unwrap() > 50, "{report}");
    }

    // A window: the `cat` of shifted slices of the padded frames (the U-Net's skip `cat` has no pad
    // and computes each value once).
    let window_with_mish = |r: &serde_json::Value| kernel_launches(r, |k| k.contains("_cat_") && k.contains("constant_pad_nd") && k.contains("mish"));
    assert!(window_with_mish(time_major) > 0, "the diagnosed kernel is gone from the time-major layout: {time_major}");
    assert_eq!(window_with_mish(strided_unfolded), 0, "the strided layout still fuses Mish into a window: {strided_unfolded}");

    let window_copies = |r: &serde_json::Value| kernel_launches(r, |k| k.contains("as_strided_clone"));
    let bmm = |r: &serde_json::Value| r["extern"]["extern_kernels.bmm"].as_u64().unwrap_or(0);
    // The tiny estimator's causal convolutions of kernel 3: two in each of its four ResNet blocks,
    // the down- and up-sampling ones and the final block's.
    let convolutions = 11;
    assert_eq!(window_copies(strided), 0, "{strided}");
    assert!(bmm(strided) >= convolutions, "the strided windows go to batched matmuls: {strided}");
    assert_eq!(window_copies(strided_copy), convolutions, "one window copy per convolution: {strided_copy}");
    assert_eq!(bmm(strided) - bmm(strided_copy), convolutions, "the copied windows go to plain matmuls: {strided_copy}");

    assert!(weight_casts(encoder) > 10, "the encoder was frozen too: {encoder}");
    assert_eq!(weight_casts(strided), 0, "the estimator still casts its weights: {strided}");
    assert!(weight_casts(strided_unfolded) > 10, "estimator:freezing=False did not override the default: {strided_unfolded}");
}

/// Issue 16's check on a GPU: the compiled stages against the eager port at the same precision
/// (flow bf16, vocoder tf32), with the tiny model's packages compiled on that GPU —
/// `scripts/device/run.sh parity` writes them to models/cosyvoice2-tiny-compiled-gpu and runs this
/// with `VOXBATCH_TEST_DEVICE=cuda:0 --ignored`. One estimator call (CFG-doubled, padded items)
/// and one vocoder pass from the same mel, so that nothing amplifies the rounding: fused kernels
/// round in other places, and that is all that may differ — SNR ≥ [`GPU_STAGE_SNR_DB`] per stage.
const GPU_STAGE_SNR_DB: f64 = 35.0;

fn snr_db(actual: &Tensor, reference: &Tensor) -> f64 {
    let signal = reference.square().sum(tch::Kind::Double).double_value(&[]);
    let noise = (actual - reference).square().sum(tch::Kind::Double).double_value(&[]);
    10.0 * (signal / noise.max(1e-30)).log10()
}

#[test]
#[ignore = "needs a GPU and packages compiled there: scripts/device/run.sh parity"]
fn on_a_gpu_each_compiled_stage_gives_the_eager_ports_output_at_the_same_precision() {
    use tch::Kind;
    use voxbatch::model::cosyvoice2::hift::SourceDraws;
    use voxbatch::model::ModelError;
    let device: Device = std::env::var("VOXBATCH_TEST_DEVICE").expect("VOXBATCH_TEST_DEVICE=cuda:N").parse().unwrap();
    let dir = repo_path("models/cosyvoice2-tiny-compiled-gpu");
    let load = |d: &Path| Token2Wav::load(d, Manifest::load(d).unwrap(), device, Precision::Bf16).unwrap();
    let compiled = load(&dir);
    assert!(compiled.flow.is_compiled() && compiled.hift.compiled().is_some(), "packages of this GPU's key in {}", dir.display());
    assert!(compiled.flow.encoder_is_compiled(), "the encoder package of this GPU's key in {}", dir.display());
    let eager = load(&repo_path("models/cosyvoice2-tiny"));
    let dev = device.to_tch();
    tch::manual_seed(11);
    let _no_grad = tch::no_grad_guard();

    // The encoder stage: a voice's prompt and 23 tokens, and 9 tokens alone (padded); each item's
    // own frames compared.
    use voxbatch::model::cosyvoice2::flow::FlowItem;
    let voice = &compiled.voices()[0];
    let tokens: Vec<i64> = (0..23).map(|i| (i * 7) % 64).collect();
    let items = [
        FlowItem { tokens: &tokens, prompt_tokens: &voice.prompt_tokens, prompt_feat: &voice.prompt_feat, embedding: &voice.embedding },
        FlowItem { tokens: &tokens[..9], prompt_tokens: &[], prompt_feat: &voice.prompt_feat, embedding: &voice.embedding },
    ];
    let encode = |m: &Token2Wav| {
        let (mu, lens) = m.in_flow_precision(|flow| flow.encode(&items).map_err(ModelError::Inference)).unwrap();
        Tensor::cat(&lens.iter().enumerate().map(|(i, &l)| mu.get(i as i64).narrow(0, 0, l)).collect::<Vec<_>>(), 0).to_kind(Kind::Float)
    };
    let (enc_c, enc_e) = (encode(&compiled), encode(&eager));
    assert_eq!(compiled.flow.take_step_counts().0, 1, "the encoder ran its package");
    let enc_snr = snr_db(&enc_c, &enc_e);
    eprintln!("COMPILED encoder (bf16) vs eager: SNR {enc_snr:.1} dB");
    assert!(enc_snr >= GPU_STAGE_SNR_DB, "encoder {enc_snr:.1} dB: below {GPU_STAGE_SNR_DB} dB");

    // One estimator call: 3 items (6 rows with CFG), 96 frames, two of them padded.
    let (rows, frames) = (6, 96);
    let mask = Tensor::ones([rows, 1, frames], (Kind::Float, dev));
    for (row, valid) in [(1, 70), (4, 70), (2, 41), (5, 41)] {
        let _ = mask.get(row).narrow(1, valid, frames - valid).fill_(0.0);
    }
    let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, dev));
    let (x, mu, cond, spks) = (r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80, frames]), r(&[rows, 80]));
    let t = Tensor::rand([rows], (Kind::Float, dev));
    let call = |m: &Token2Wav| m.in_flow_precision(|flow| flow.estimate(&x, &mask, &mu, &t, &spks, &cond).map_err(ModelError::Inference)).unwrap() * &mask;
    let (est_c, est_e) = (call(&compiled), call(&eager));
    let (steps_compiled, _) = compiled.flow.take_step_counts();
    assert_eq!(steps_compiled, 1, "the call ran the package");
    let est_snr = snr_db(&est_c, &est_e);
    eprintln!("COMPILED estimator (bf16) vs eager: SNR {est_snr:.1} dB");

    // One vocoder pass from the same mel (tf32 both), two items of different lengths.
    let frames_of = [64i64, 40];
    let mel = r(&[2, 80, 64]) * 0.5;
    let _ = mel.get(1).narrow(1, 40, 24).fill_(0.0);
    let draws = SourceDraws::random(2, 64 * 480, tch::Device::Cpu).unwrap();
    let vocode = |m: &Token2Wav| m.in_vocoder_precision(|hift| hift.forward(&mel, &frames_of, &draws).map_err(ModelError::Inference)).unwrap().wav;
    let (wav_c, wav_e) = (vocode(&compiled), vocode(&eager));
    let (compiled_calls, _) = compiled.hift.take_call_counts();
    assert_eq!(compiled_calls, 1, "the pass ran the package");
    let wav_snr = snr_db(&wav_c, &wav_e);
    eprintln!("COMPILED vocoder body (tf32) vs eager: SNR {wav_snr:.1} dB");
    assert!(est_snr >= GPU_STAGE_SNR_DB && wav_snr >= GPU_STAGE_SNR_DB, "estimator {est_snr:.1} dB, vocoder {wav_snr:.1} dB: below {GPU_STAGE_SNR_DB} dB");
}

/// A compiled package that runs out of CUDA memory says so — "CUDA out of memory", which the model
/// sorts into `ModelError::OutOfMemory` (`torchscript::classify`), so the worker splits the batch
/// and calibration ends its sweep — where AOTInductor itself reports only that a call failed (an
/// H100's calibration stopped on that on 2026-12-05); and once memory is free the package runs
/// again and gives what it gave before. Needs the tiny model's packages compiled on that GPU
/// (scripts/device/run.sh parity runs it).
#[test]
#[ignore = "needs a GPU and packages compiled there: scripts/device/run.sh parity"]
fn on_a_gpu_a_package_that_runs_out_of_memory_says_so_and_runs_again_once_memory_is_free() {
    use tch::Kind;
    let device: Device = std::env::var("VOXBATCH_TEST_DEVICE").expect("VOXBATCH_TEST_DEVICE=cuda:N").parse().unwrap();
    let dir = repo_path("models/cosyvoice2-tiny-compiled-gpu");
    let model = Token2Wav::load(&dir, Manifest::load(&dir).unwrap(), device, Precision::Bf16).unwrap();
    let stage = model.hift.compiled().unwrap_or_else(|| panic!("the vocoder body's package of this GPU's key in {}", dir.display()));
    let dev = device.to_tch();
    let _no_grad = tch::no_grad_guard();
    // The package's largest batch: its first buffer (the STFT padded to 20 channels) is ≈ 60 MB.
    let (b, t) = (stage.max_batch, stage.max_frames);
    let mel = Tensor::randn([b, 80, t], (Kind::Float, dev)) * 0.5;
    let s_stft = Tensor::randn([b, 18, 120 * t + 1], (Kind::Float, dev));
    let lengths = Tensor::full([b], t, (Kind::Int64, dev));
    let inputs = [&mel, &s_stft, &lengths];
    let first = stage.package.run(&inputs).unwrap().remove(0);
    // Every free byte taken, in 1 GiB pieces and then 8 MiB ones (under 20 MiB stays free).
    let mut hoard = Vec::new();
    for elements in [1i64 << 28, 1 << 21] {
        while let Ok(piece) = Tensor::f_empty([elements], (Kind::Float, dev)) {
            hoard.push(piece);
        }
    }
    let gib = hoard.iter().map(|p| p.numel() as f64 * 4.0).sum::<f64>() / (1u64 << 30) as f64;
    let error = stage.package.run(&inputs).err().unwrap_or_else(|| panic!("{gib:.1} GiB taken: the package still ran"));
    let message = tch::TchError::from(error).to_string();
    eprintln!("COMPILED out of memory ({gib:.1} GiB taken): {}", message.chars().take(160).collect::<String>());
    assert!(message.contains("CUDA out of memory"), "{message}");
    drop(hoard);
    let again = stage.package.run(&inputs).unwrap().remove(0);
    let snr = snr_db(&again, &first);
    assert!(snr >= GRAPH_SNR_DB, "the package's output after the failure: {snr:.1} dB against before");
}

/// Small batches' flow steps replayed as CUDA graphs (`[model] flow_graphs`) on a GPU: the mel of
/// each batch as the package gives it called step by step, a shape met again replays the graph it
/// captured, and past the graphs allowed the least recently used goes. Needs the tiny model's
/// packages compiled on that GPU (scripts/device/run.sh parity runs it).
#[test]
#[ignore = "needs a GPU and packages compiled there: scripts/device/run.sh parity"]
fn on_a_gpu_small_batches_flow_steps_replay_as_graphs_and_give_the_packages_mel() {
    use voxbatch::model::cosyvoice2::flow_graphs::FlowGraphSettings;
    use voxbatch::model::cosyvoice2::hift::SourceDraws;
    let device: Device = std::env::var("VOXBATCH_TEST_DEVICE").expect("VOXBATCH_TEST_DEVICE=cuda:N").parse().unwrap();
    let dir = repo_path("models/cosyvoice2-tiny-compiled-gpu");
    let load = || Token2Wav::load(&dir, Manifest::load(&dir).unwrap(), device, Precision::Bf16).unwrap();
    let mut plain = load();
    let mut graphed = load();
    assert!(graphed.flow.is_compiled(), "the estimator package of this GPU's key in {}", dir.display());
    graphed.flow.set_graphs(FlowGraphSettings { graphs: 2, max_frames: 1 << 20 }, device);
    let tokens = |n: i64, k: i64| (0..n).map(|t| (t * k) % 64).collect::<Vec<i64>>();
    let a = vec![SynthItem::tokens(tokens(23, 1), 1), SynthItem::tokens(tokens(11, 3), 0)];
    let b = vec![SynthItem::tokens(tokens(40, 7), 0)];
    let c = vec![SynthItem::tokens(tokens(9, 5), 1), SynthItem::tokens(tokens(30, 2), 0), SynthItem::tokens(tokens(17, 11), 1)];
    let mut replays_per_batch = None;
    // (batch, graphs captured after it, evicted after it)
    for (name, items, captured, evicted) in [("a", &a, 1, 0), ("b", &b, 2, 0), ("a again", &a, 2, 0), ("c", &c, 3, 1)] {
        let draws = SourceDraws::random(items.len() as i64, 46 * 2 * 480, tch::Device::Cpu).unwrap();
        let before = graphed.flow.graph_stats();
        let (out_p, out_g) = (plain.run(items, Some(&draws)).unwrap(), graphed.run(items, Some(&draws)).unwrap());
        let after = graphed.flow.graph_stats();
        assert_eq!((after.captured, after.evicted), (captured, evicted), "batch {name}: {after:?}");
        let replays = after.replays - before.replays;
        assert_eq!(*replays_per_batch.get_or_insert(replays), replays, "batch {name}: every step replayed");
        assert!(replays > 0);
        for ((mel_p, _), (mel_g, _)) in out_p.iter().zip(&out_g) {
            let snr = snr_db(mel_g, mel_p);
            eprintln!("COMPILED flow step graphs, batch {name}: mel SNR {snr:.1} dB against the package called step by step");
            assert!(snr >= GRAPH_SNR_DB, "batch {name}: {snr:.1} dB");
        }
    }
}

/// The same kernels on the same shapes: a replay may differ from the calls it captured only where
/// a library picks another algorithm under capture.
const GRAPH_SNR_DB: f64 = 60.0;
