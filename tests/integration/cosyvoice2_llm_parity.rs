//! Parity of the CosyVoice2 speech-token LM (src/model/llm/) with the reference code:
//! `tools/make_llm_fixtures.py` runs `Qwen2LM` of the PyPI package `token2wav-cosyvoice` with a tiny
//! random Qwen2 (transformers 4.x) and stores its input layout, prefill hidden states and
//! teacher-forced per-step log-probabilities; bootstrap builds them into
//! `models/cosyvoice2-llm-parity/`. fp32 on the CPU (or `VOXBATCH_TEST_DEVICE`).

use std::collections::HashMap;
use std::path::PathBuf;

use tch::{Device, Tensor};
use voxbatch::model::cosyvoice2::layers::relative_error;
use voxbatch::model::llm::qwen2::Qwen2Dims;
use voxbatch::model::llm::batch::BatchDecoder;
use voxbatch::model::llm::sampler::{ras_sample, SamplingParams};
use voxbatch::model::llm::speech_lm::{LmFamily, LmRequest, SpeechLm};
use voxbatch::model::cosyvoice2::Weights;

/// Relative error the LM's stages keep to the reference in fp32 (CosyVoice3's tests too).
pub(crate) const TOLERANCE: f64 = 1e-4;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-llm-parity")
}

fn device() -> Device {
    match std::env::var("VOXBATCH_TEST_DEVICE").ok().as_deref() {
        Some("cuda:0") => Device::Cuda(0),
        _ => Device::Cpu,
    }
}

struct Fixtures {
    tensors: HashMap<String, Tensor>,
    items: usize,
    dims: Qwen2Dims,
    speech_tokens: i64,
    sampler_settings: Vec<SamplingParams>,
}

impl Fixtures {
    fn load() -> Fixtures {
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir().join("parity.json")).expect("fixtures (scripts/bootstrap.sh builds them)")).unwrap();
        let d = &json["dims"];
        let i = |k: &str| d[k].as_i64().unwrap();
        let dims = Qwen2Dims {
            layers: i("layers") as usize,
            hidden: i("hidden"),
            heads: i("heads"),
            kv_heads: i("kv_heads"),
            head_dim: i("hidden") / i("heads"),
            intermediate: i("intermediate"),
            vocab: i("vocab"),
            rope_theta: d["rope_theta"].as_f64().unwrap(),
            eps: d["eps"].as_f64().unwrap(),
        };
        let tensors = Tensor::read_safetensors(dir().join("parity.safetensors")).unwrap().into_iter().collect();
        let sampler_settings = json["sampler"]
            .as_array()
            .expect("sampler settings (re-run scripts/bootstrap.sh)")
            .iter()
            .map(|s| SamplingParams {
                top_p: s[0].as_f64().unwrap(),
                top_k: s[1].as_i64().unwrap(),
                win_size: s[2].as_u64().unwrap() as usize,
                tau_r: s[3].as_f64().unwrap(),
                full_excludes_nucleus: false,
            })
            .collect();
        Fixtures { tensors, items: json["items"].as_array().unwrap().len(), dims, speech_tokens: i("speech_tokens"), sampler_settings }
    }
    fn get(&self, item: usize, key: &str) -> Tensor {
        self.tensors[&format!("item{item}.{key}")].to_device(device())
    }
    fn ids(&self, item: usize, key: &str) -> Vec<i64> {
        Vec::<i64>::try_from(&self.tensors[&format!("item{item}.{key}")]).unwrap()
    }
    fn request(&self, item: usize) -> LmRequest {
        LmRequest { text: self.ids(item, "text"), prompt_text: self.ids(item, "prompt_text"), prompt_speech: self.ids(item, "prompt_speech"), seed: 0, forced_len: None }
    }
}

fn load(fx: &Fixtures) -> SpeechLm {
    let w = Weights::load(&dir().join("llm.safetensors"), device()).unwrap();
    let lm = SpeechLm::new(&w, fx.dims, fx.speech_tokens, LmFamily::Cosyvoice2).unwrap();
    w.finish().expect("every tensor of the reference's state dict is used, with its shape");
    lm
}

pub(crate) fn assert_close(what: &str, actual: &Tensor, reference: &Tensor) {
    assert_eq!(actual.size(), reference.size(), "{what}: shape");
    let err = relative_error(actual, reference);
    println!("PARITY {what}: {err:.3e}");
    assert!(err <= TOLERANCE, "{what}: relative error {err:.3e} over {TOLERANCE:e}");
}

#[test]
fn input_layout_prefill_and_every_teacher_forced_step_match_the_reference() {
    let fx = Fixtures::load();
    let lm = load(&fx);
    tch::no_grad(|| {
        for i in 0..fx.items {
            let r = fx.request(i);
            assert_close(&format!("item{i} lm_input"), &lm.input(&r).unwrap(), &fx.get(i, "lm_input"));
            let fed = fx.ids(i, "fed");
            let (hidden, logp) = lm.teacher_forced(&[(&r, &fed)], 128).unwrap().remove(0);
            assert_close(&format!("item{i} prefill hidden states"), &hidden, &fx.get(i, "hidden"));
            let reference = fx.get(i, "logp");
            for step in 0..=fed.len() as i64 {
                assert_close(&format!("item{i} step {step} log-probabilities"), &logp.get(step), &reference.get(step));
            }
        }
    });
}

#[test]
fn a_batch_of_sequences_of_different_lengths_equals_each_alone() {
    let fx = Fixtures::load();
    let lm = load(&fx);
    tch::no_grad(|| {
        let requests: Vec<LmRequest> = (0..fx.items).map(|i| fx.request(i)).collect();
        let feds: Vec<Vec<i64>> = (0..fx.items).map(|i| fx.ids(i, "fed")).collect();
        let items: Vec<(&LmRequest, &[i64])> = requests.iter().zip(&feds).map(|(r, f)| (r, f.as_slice())).collect();
        let batched = lm.teacher_forced(&items, 128).unwrap();
        for (i, item) in items.iter().enumerate() {
            let (_, alone) = lm.teacher_forced(std::slice::from_ref(item), 128).unwrap().remove(0);
            assert_close(&format!("item{i} log-probabilities, batched vs alone"), &batched[i].1, &alone);
            assert_close(&format!("item{i} log-probabilities, batched vs reference"), &batched[i].1, &fx.get(i, "logp"));
        }
    });
}

#[test]
fn the_converted_model_carries_the_llm_and_decodes_like_the_reference() {
    // bootstrap copies the fixture's llm.pt + CosyVoice-BlankEN/config.json into the tiny official
    // directory; tools/convert_cosyvoice.py writes llm.safetensors and [cosyvoice2.llm].
    let model_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-tiny");
    let manifest = voxbatch::model::Manifest::load(&model_dir).unwrap();
    let dims = manifest.cosyvoice2.and_then(|c| c.llm).expect("[cosyvoice2.llm] in model.toml");
    let fx = Fixtures::load();
    assert_eq!((dims.layers, dims.hidden, dims.heads, dims.kv_heads, dims.speech_tokens), (fx.dims.layers, fx.dims.hidden, fx.dims.heads, fx.dims.kv_heads, fx.speech_tokens));
    assert_eq!((dims.top_p, dims.top_k, dims.win_size, dims.min_token_text_ratio, dims.max_token_text_ratio), (0.8, 25, 10, 2.0, 20.0));
    // fp32 on any device: this checks the conversion (bf16 is checked below).
    let (lm, _, _) = SpeechLm::load_as(&model_dir, LmFamily::Cosyvoice2, &dims, device(), tch::Kind::Float).unwrap();
    tch::no_grad(|| {
        let r = fx.request(1);
        let fed = fx.ids(1, "fed");
        let (_, logp) = lm.teacher_forced(&[(&r, &fed)], 128).unwrap().remove(0);
        assert_close("converted model, item1 log-probabilities", &logp, &fx.get(1, "logp"));
    });
}

#[test]
fn bf16_weights_stay_close_to_the_fp32_reference() {
    // CUDA runs the LM in bf16; the CPU can too, which this checks without a GPU.
    let model_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-tiny");
    let dims = voxbatch::model::Manifest::load(&model_dir).unwrap().cosyvoice2.and_then(|c| c.llm).unwrap();
    let (lm, _, _) = SpeechLm::load_as(&model_dir, LmFamily::Cosyvoice2, &dims, device(), tch::Kind::BFloat16).unwrap();
    let fx = Fixtures::load();
    tch::no_grad(|| {
        for i in 0..fx.items {
            let r = fx.request(i);
            let fed = fx.ids(i, "fed");
            let (_, logp) = lm.teacher_forced(&[(&r, &fed)], 128).unwrap().remove(0);
            assert_eq!(logp.kind(), tch::Kind::Float, "log-probabilities in fp32");
            let err = relative_error(&logp, &fx.get(i, "logp"));
            println!("PARITY bf16 item{i} log-probabilities: {err:.3e}");
            assert!(err.is_finite() && err <= 0.05, "item{i}: bf16 relative error {err:.3e}");
        }
    });
}

#[test]
fn the_sampler_picks_what_the_reference_picks_from_the_same_uniform_draws() {
    // The fixtures ran the reference's ras_sampling with multinomial drawing by inverse CDF from
    // two given uniforms (nucleus, then full distribution); the port gets the same uniforms.
    let fx = Fixtures::load();
    let mut resampled = 0;
    for (s, params) in fx.sampler_settings.iter().enumerate() {
        let t = |k: &str| &fx.tensors[&format!("sampler{s}.{k}")];
        let logp = t("logp").to_device(device());
        let lens = Vec::<i64>::try_from(t("history_len")).unwrap();
        let hist = Vec::<i64>::try_from(t("history").flatten(0, -1)).unwrap();
        let width = hist.len() / lens.len();
        let histories: Vec<&[i64]> = lens.iter().enumerate().map(|(c, &n)| &hist[c * width..c * width + n as usize]).collect();
        let u = Vec::<f64>::try_from(t("uniforms").flatten(0, -1)).unwrap();
        let uniforms: Vec<(f64, f64)> = u.chunks(2).map(|p| (p[0], p[1])).collect();
        let expected = Vec::<i64>::try_from(t("pick")).unwrap();
        let picks = tch::no_grad(|| ras_sample(&logp, &histories, &uniforms, params)).unwrap();
        for (c, (got, want)) in picks.iter().zip(&expected).enumerate() {
            assert_eq!(got, want, "setting {s} case {c}: history {:?}, uniforms {:?}", histories[c], uniforms[c]);
        }
        // The cases exercise the repetition rule (the pick occurs in the window) as well.
        resampled += histories.iter().zip(&expected).filter(|(h, p)| h[h.len().saturating_sub(params.win_size)..].contains(p)).count();
        println!("PARITY sampler setting {s}: {} picks equal", picks.len());
    }
    assert!(resampled < fx.sampler_settings.len() * 48, "some picks come from the nucleus");
}

/// Run on the GPU machine (scripts/device/run.sh llm: VOXBATCH_TEST_DEVICE=cuda:0, --run-ignored).
#[test]
#[ignore = "needs a CUDA device (VOXBATCH_TEST_DEVICE=cuda:0)"]
fn cuda_graph_decoding_gives_the_tokens_of_eager_decoding() {
    assert!(device().is_cuda(), "set VOXBATCH_TEST_DEVICE=cuda:0");
    let model_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-tiny");
    let dims = voxbatch::model::Manifest::load(&model_dir).unwrap().cosyvoice2.and_then(|c| c.llm).unwrap();
    let (lm, params, ratios) = SpeechLm::load(&model_dir, LmFamily::Cosyvoice2, &dims, device()).unwrap();
    let fx = Fixtures::load();
    let requests: Vec<LmRequest> = (0..24).map(|k| LmRequest { seed: k as u64, ..fx.request(k % fx.items) }).collect();
    let run = |graphs: bool| {
        let mut dec = BatchDecoder::new(&lm, 5, 512, params, graphs).unwrap();
        let out = tch::no_grad(|| lm.generate(&mut dec, &requests, ratios)).unwrap();
        (out, dec.stats().clone())
    };
    let (eager, eager_stats) = run(false);
    let (graphed, stats) = run(true);
    println!("graphs: {stats:?}; eager: {eager_stats:?}");
    assert!(stats.graph_replays > 0 && stats.eager_reason.is_none(), "graphs were used: {stats:?}");
    assert_eq!(format!("{eager:?}"), format!("{graphed:?}"));
}

#[test]
#[ignore = "needs a CUDA device (VOXBATCH_TEST_DEVICE=cuda:0)"]
fn a_replayed_cuda_graph_recomputes_from_its_refilled_inputs() {
    use voxbatch::model::cuda_graph::CudaGraph;
    let mut input = Tensor::zeros([4, 8], (tch::Kind::Float, Device::Cuda(0)));
    let (graph, out) = CudaGraph::capture(0, None, 1, || input.f_mul_scalar(2.0)?.f_add_scalar(1.0)).expect("capture");
    for v in [1.0, 3.0] {
        let _ = input.fill_(v);
        graph.replay().expect("replay");
        assert_eq!(f64::try_from(out.mean(tch::Kind::Float)).unwrap(), 2.0 * v + 1.0);
    }
}
