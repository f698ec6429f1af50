//! Parity of CosyVoice3's speech-token LM (`SpeechLm` with `LmFamily::Cosyvoice3`, issue 44) with
//! the reference `CosyVoice3LM` (FunAudioLLM/CosyVoice `ace7c47`): `tools/make_cv3_llm_fixtures.py`
//! ran it on a tiny random Qwen2 and stored in `tests/data/cosyvoice3/parity-llm.*` its input
//! layout, prefill hidden states, teacher-forced log-probabilities, sampler picks (with the
//! `ignore_eos` mask before `min_len`) and the silent-token filter; bootstrap converts the tiny
//! official directory (with its `llm.pt`) into `models/cosyvoice3-tiny` (kind `cosyvoice3`). The
//! tokenizer with CosyVoice3's added tokens is checked against the reference tokenizer's ids.
//! fp32 on the CPU (or `VOXBATCH_TEST_DEVICE`).

use std::collections::HashMap;
use std::path::PathBuf;

use tch::{Device, Tensor};
use crate::cosyvoice2_llm_parity::assert_close;
use voxbatch::frontend::tokenizer::TextTokenizer;
use voxbatch::model::llm::batch::BatchDecoder;
use voxbatch::model::llm::sampler::{ras_sample, SamplingParams};
use voxbatch::model::llm::speech_lm::{without_column, LengthRatios, LmError, LmFamily, LmRequest, SpeechLm};
use voxbatch::model::{LlmDims, Manifest, ModelKind};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model_dir() -> PathBuf {
    root().join("models/cosyvoice3-tiny")
}

fn device() -> Device {
    match std::env::var("VOXBATCH_TEST_DEVICE").ok().as_deref() {
        Some("cuda:0") => Device::Cuda(0),
        _ => Device::Cpu,
    }
}

struct Fixtures {
    json: serde_json::Value,
    tensors: HashMap<String, Tensor>,
}

impl Fixtures {
    fn load() -> Fixtures {
        let data = root().join("tests/data/cosyvoice3");
        let json = serde_json::from_slice(&std::fs::read(data.join("parity-llm.json")).unwrap()).unwrap();
        let tensors = Tensor::read_safetensors(data.join("parity-llm.safetensors")).unwrap().into_iter().collect();
        Fixtures { json, tensors }
    }
    fn items(&self) -> usize {
        self.json["items"].as_array().unwrap().len()
    }
    fn get(&self, key: &str) -> Tensor {
        self.tensors[key].to_device(device())
    }
    fn ids(&self, key: &str) -> Vec<i64> {
        Vec::<i64>::try_from(&self.tensors[key]).unwrap()
    }
    fn request(&self, item: usize) -> LmRequest {
        let ids = |k: &str| self.ids(&format!("item{item}.{k}"));
        LmRequest { text: ids("text"), prompt_text: ids("prompt_text"), prompt_speech: ids("prompt_speech"), seed: item as u64, forced_len: None }
    }
}

/// The converted model's `[cosyvoice3.llm]`.
fn dims() -> LlmDims {
    let manifest = Manifest::load(&model_dir()).expect("models/cosyvoice3-tiny (scripts/bootstrap.sh test converts it)");
    let (family, dims) = manifest.llm().expect("[cosyvoice3.llm] in model.toml");
    assert_eq!(family, LmFamily::Cosyvoice3);
    dims.clone()
}

fn load() -> SpeechLm {
    let (lm, _, _) = SpeechLm::load_as(&model_dir(), LmFamily::Cosyvoice3, &dims(), device(), tch::Kind::Float).unwrap();
    lm
}

#[test]
fn the_converted_directory_is_kind_cosyvoice3_with_the_reference_lms_dimensions() {
    let manifest = Manifest::load(&model_dir()).unwrap();
    assert_eq!(manifest.kind, ModelKind::Cosyvoice3);
    let fx = Fixtures::load();
    let d = dims();
    let want = &fx.json["dims"];
    let i = |k: &str| want[k].as_i64().unwrap();
    assert_eq!((d.layers as i64, d.hidden, d.heads, d.kv_heads, d.vocab, d.speech_tokens), (i("layers"), i("hidden"), i("heads"), i("kv_heads"), i("vocab"), i("speech_tokens")));
    assert_eq!(d.end_of_prompt, fx.json["end_of_prompt"].as_i64(), "<|endofprompt|>'s id as the tokenizer has it");
    assert_eq!((d.top_p, d.top_k, d.win_size, d.min_token_text_ratio, d.max_token_text_ratio), (0.8, 25, 10, 2.0, 20.0));
    let silent: Vec<i64> = fx.json["silent"]["tokens"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect();
    assert_eq!((d.silent_tokens.clone(), d.max_silent_tokens as i64), (silent, fx.json["silent"]["max_run"].as_i64().unwrap()));
}

#[test]
fn input_layout_prefill_and_every_teacher_forced_step_match_the_reference() {
    let fx = Fixtures::load();
    let lm = load();
    tch::no_grad(|| {
        for i in 0..fx.items() {
            let r = fx.request(i);
            assert_close(&format!("item{i} lm_input"), &lm.input(&r).unwrap(), &fx.get(&format!("item{i}.lm_input")));
            let fed = fx.ids(&format!("item{i}.fed"));
            let (hidden, logp) = lm.teacher_forced(&[(&r, &fed)], 256).unwrap().remove(0);
            assert_close(&format!("item{i} prefill hidden states"), &hidden, &fx.get(&format!("item{i}.hidden")));
            assert_eq!(logp.size()[1], dims().speech_tokens + 200, "speech tokens + 200 outputs");
            assert_close(&format!("item{i} log-probabilities, every step"), &logp, &fx.get(&format!("item{i}.logp")));
        }
    });
}

#[test]
fn a_batch_of_sequences_of_different_lengths_equals_each_alone() {
    let fx = Fixtures::load();
    let lm = load();
    tch::no_grad(|| {
        let requests: Vec<LmRequest> = (0..fx.items()).map(|i| fx.request(i)).collect();
        let feds: Vec<Vec<i64>> = (0..fx.items()).map(|i| fx.ids(&format!("item{i}.fed"))).collect();
        let items: Vec<(&LmRequest, &[i64])> = requests.iter().zip(&feds).map(|(r, f)| (r, f.as_slice())).collect();
        let batched = lm.teacher_forced(&items, 256).unwrap();
        for (i, item) in items.iter().enumerate() {
            let (_, alone) = lm.teacher_forced(std::slice::from_ref(item), 256).unwrap().remove(0);
            assert_close(&format!("item{i} log-probabilities, batched vs alone"), &batched[i].1, &alone);
        }
    });
}

#[test]
fn the_sampler_picks_what_the_reference_picks_with_its_mask_before_min_len() {
    // The reference's `sampling_ids`: before min_len it sets column speech_tokens (CosyVoice3's
    // sos) to −∞ and samples once; its other stop ids stay drawable. The port masks the same way.
    let fx = Fixtures::load();
    let s = dims().speech_tokens;
    let settings = fx.json["sampler"]["settings"].as_array().unwrap();
    let (mut masked_cases, mut stops) = (0, 0);
    for (k, setting) in settings.iter().enumerate() {
        let params = SamplingParams {
            top_p: setting[0].as_f64().unwrap(),
            top_k: setting[1].as_i64().unwrap(),
            win_size: setting[2].as_u64().unwrap() as usize,
            tau_r: setting[3].as_f64().unwrap(),
            // The reference's ras_sampling of ace7c47 leaves the repeated pick out of the full draw.
            full_excludes_nucleus: true,
        };
        let t = |name: &str| &fx.tensors[&format!("sampler{k}.{name}")];
        let lens = Vec::<i64>::try_from(t("history_len")).unwrap();
        let hist = Vec::<i64>::try_from(t("history").flatten(0, -1)).unwrap();
        let width = hist.len() / lens.len();
        let u = Vec::<f64>::try_from(t("uniforms").flatten(0, -1)).unwrap();
        let ignore_eos = Vec::<i64>::try_from(t("ignore_eos")).unwrap();
        let expected = Vec::<i64>::try_from(t("pick")).unwrap();
        let logp = t("logp").to_device(device());
        for c in 0..lens.len() {
            let row = logp.narrow(0, c as i64, 1);
            let row = if ignore_eos[c] == 1 { without_column(&row, s).unwrap() } else { row };
            let history = &hist[c * width..c * width + lens[c] as usize];
            let pick = tch::no_grad(|| ras_sample(&row, &[history], &[(u[2 * c], u[2 * c + 1])], &params)).unwrap()[0];
            assert_eq!(pick, expected[c], "setting {k} case {c} (ignore_eos {})", ignore_eos[c]);
            masked_cases += ignore_eos[c] as usize;
            stops += usize::from(pick >= s);
            if ignore_eos[c] == 1 {
                assert_ne!(pick, s, "the masked column is never drawn");
            }
        }
    }
    assert!(masked_cases > 0 && stops > 0, "the cases cover the mask ({masked_cases}) and stop ids ({stops})");
}

#[test]
fn the_output_keeps_at_most_five_silent_tokens_in_a_row_as_the_reference() {
    let fx = Fixtures::load();
    let lm = load();
    assert_eq!(lm.kept(fx.ids("silent.tokens")), fx.ids("silent.kept"));
}

#[test]
fn decoding_stops_at_any_stop_id_gives_each_sequence_its_tokens_batched_or_alone_and_refuses_input_without_end_of_prompt() {
    let fx = Fixtures::load();
    let lm = load();
    let d = dims();
    let (_, params, ratios): (SpeechLm, SamplingParams, LengthRatios) = SpeechLm::load_as(&model_dir(), LmFamily::Cosyvoice3, &d, device(), tch::Kind::Float).unwrap();
    let mut requests: Vec<LmRequest> = (0..fx.items()).map(|i| fx.request(i)).collect();
    // The reference asserts that <|endofprompt|> is in the text: a request without it fails alone.
    let eop = d.end_of_prompt.unwrap();
    let mut bare = fx.request(2);
    bare.prompt_text.retain(|&t| t != eop);
    bare.text.retain(|&t| t != eop);
    requests.push(bare);
    tch::no_grad(|| {
        let mut dec = BatchDecoder::new(&lm, 4, 2048, params, false).unwrap();
        let batched = lm.generate(&mut dec, &requests, ratios).unwrap();
        assert!(matches!(batched[3], Err(LmError::NoEndOfPrompt)), "{:?}", batched[3]);
        for (i, r) in requests.iter().enumerate().take(3) {
            let out = batched[i].as_ref().unwrap_or_else(|e| panic!("item{i}: {e}"));
            assert!(out.tokens.iter().all(|&t| t < d.speech_tokens), "item{i}: only speech tokens are emitted");
            assert!(out.hit_max_len || out.tokens.len() < (r.text.len() as f64 * ratios.max) as usize);
            let mut one = BatchDecoder::new(&lm, 1, 2048, params, false).unwrap();
            let alone = lm.generate(&mut one, std::slice::from_ref(r), ratios).unwrap().remove(0).unwrap();
            assert_eq!(alone.tokens, out.tokens, "item{i}: the same tokens batched and alone");
        }
    });
}

#[test]
fn the_tokenizer_with_cosyvoice3s_added_tokens_gives_the_reference_ids() {
    let fx: serde_json::Value = serde_json::from_slice(&std::fs::read(root().join("tests/data/cosyvoice3/tokenizer_parity.json")).unwrap()).unwrap();
    let tok = TextTokenizer::load(&model_dir().join("tokenizer.json")).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|i| i.as_i64().unwrap()).collect();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }
    for (token, id) in fx["special_tokens"].as_object().unwrap() {
        assert_eq!(tok.encode(token).unwrap(), vec![id.as_i64().unwrap()], "{token} is one token");
    }
    assert_eq!(tok.encode("<|endofprompt|>").unwrap(), vec![fx["end_of_prompt"].as_i64().unwrap()]);
    println!("PARITY tokenizer: {} cases, {} special tokens", cases.len(), fx["special_tokens"].as_object().unwrap().len());
}

#[test]
fn a_forced_length_refuses_every_stop_id_until_it_is_reached() {
    // Benchmarks with random weights force each sequence's length ([llm] force_lengths): for
    // CosyVoice3, whose 200 stop ids the reference leaves drawable before min_len, all are refused.
    let fx = Fixtures::load();
    let lm = load();
    let d = dims();
    let (_, params, ratios) = SpeechLm::load_as(&model_dir(), LmFamily::Cosyvoice3, &d, device(), tch::Kind::Float).unwrap();
    let requests: Vec<LmRequest> = (0..fx.items()).map(|i| LmRequest { forced_len: Some(60 + 20 * i), ..fx.request(i) }).collect();
    tch::no_grad(|| {
        let mut dec = BatchDecoder::new(&lm, 4, 2048, params, false).unwrap();
        for (i, out) in lm.generate(&mut dec, &requests, ratios).unwrap().into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("item{i}: {e}"));
            assert!(out.hit_max_len, "item{i} ran to its forced length");
            // (Silent tokens past five in a row leave the output: at most the forced length.)
            assert!(out.tokens.len() <= 60 + 20 * i && out.tokens.iter().all(|&t| t < d.speech_tokens), "item{i}: {:?}", out.tokens);
        }
    });
}
