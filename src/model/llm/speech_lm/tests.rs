//! `speech_lm`'s unit tests.

use super::*;

const SPEECH: i64 = 20;

fn dims() -> Qwen2Dims {
    Qwen2Dims { layers: 2, hidden: 32, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48, vocab: 40, rope_theta: 1e6, eps: 1e-6 }
}

/// A random LM (fixed seed) with its weights under the names `llm.pt` converts to.
fn random_lm(dir: &std::path::Path) -> SpeechLm {
    let d = dims();
    tch::manual_seed(5);
    let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)) * 0.3;
    let h = d.hidden;
    let mut t = super::super::qwen2::random_tensors("llm.model.model", &d, &r);
    t.extend([
        ("llm_embedding.weight".to_string(), r(&[2, h])),
        ("speech_embedding.weight".to_string(), r(&[SPEECH + 3, h])),
        ("llm_decoder.weight".to_string(), r(&[SPEECH + 3, h])),
        ("llm_decoder.bias".to_string(), r(&[SPEECH + 3])),
    ]);
    let path = dir.join("llm.safetensors");
    Tensor::write_safetensors(&t, &path).unwrap();
    let w = Weights::load(&path, tch::Device::Cpu).unwrap();
    let lm = SpeechLm::new(&w, d, SPEECH, LmFamily::Cosyvoice2).unwrap();
    w.finish().unwrap();
    lm
}

fn requests() -> Vec<LmRequest> {
    let req = |text: Vec<i64>, prompt_text: Vec<i64>, prompt_speech: Vec<i64>, seed| LmRequest { text, prompt_text, prompt_speech, seed, forced_len: None };
    vec![
        req(vec![3, 4, 5], vec![], vec![], 1),
        req(vec![7, 8, 9, 10, 11, 12], vec![1, 2], vec![4, 4, 9, 0, 13], 2),
        req(vec![20, 21], vec![5], vec![1, 2, 3], 3),
        req(vec![30, 31, 32, 33], vec![], vec![7, 7], 4),
        req(vec![], vec![], vec![], 5),
    ]
}

#[test]
fn every_sequence_decodes_the_same_tokens_batched_with_refill_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let lm = random_lm(dir.path());
    let reqs = requests();
    let p = SamplingParams::default();
    let ratios = LengthRatios::default();
    let mut dec = BatchDecoder::new(&lm, 2, 256, p, false).unwrap();
    let batched = tch::no_grad(|| lm.generate(&mut dec, &reqs, ratios)).unwrap();
    assert!(dec.stats().refills >= 2, "slots were refilled while the other decoded: {:?}", dec.stats());
    let again = tch::no_grad(|| lm.generate(&mut dec, &reqs, ratios)).unwrap();
    assert_eq!(format!("{batched:?}"), format!("{again:?}"), "a reused decoder starts clean");
    for (i, r) in reqs.iter().enumerate() {
        let mut solo = BatchDecoder::new(&lm, 1, 256, p, false).unwrap();
        let alone = tch::no_grad(|| lm.generate(&mut solo, std::slice::from_ref(r), ratios)).unwrap().remove(0);
        match (&batched[i], &alone) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "request {i}");
                // (Fewer than min_len tokens is possible: skipped ids count as steps.)
                assert!(!a.tokens.is_empty() && a.tokens.len() <= 20 * r.text.len(), "request {i}: {} tokens", a.tokens.len());
                assert!(a.tokens.iter().all(|&t| (0..SPEECH).contains(&t)));
            }
            (Err(LmError::EmptyText), Err(LmError::EmptyText)) => assert!(r.text.is_empty()),
            (a, b) => panic!("request {i}: {a:?} vs {b:?}"),
        }
    }
    assert!(batched.iter().filter(|r| r.is_ok()).count() == 4);
}

#[test]
fn the_longest_requests_are_admitted_first_and_the_batch_ends_sooner() {
    let dir = tempfile::tempdir().unwrap();
    let lm = random_lm(dir.path());
    // Forced lengths 2, 9, 3, 8 on two slots (the prefill draws each sequence's first token,
    // a decode step each next one). In arrival order 2 and 9 start, then 3, then 8 (admitted
    // after step 3, done after step 10); longest first 9 and 8 start, 3 and 2 fill in behind
    // them and everything is done after step 9.
    let forced = [2usize, 9, 3, 8];
    let reqs: Vec<LmRequest> = forced
        .iter()
        .enumerate()
        .map(|(i, &n)| LmRequest { text: vec![3, 4, 5, 6], prompt_text: vec![], prompt_speech: vec![], seed: i as u64, forced_len: Some(n) })
        .collect();
    let mut dec = BatchDecoder::new(&lm, 2, 256, SamplingParams::default(), false).unwrap();
    let mut finished = Vec::new();
    tch::no_grad(|| {
        lm.generate_with(&mut dec, &reqs, LengthRatios::default(), |i, out| -> Result<(), TchError> {
            // Its forced steps (a drawn skip id is a step that emits nothing).
            assert!(out.as_ref().is_ok_and(|o| o.tokens.len() <= forced[i] && !o.tokens.is_empty()), "request {i}: {out:?}");
            finished.push(i);
            Ok(())
        })
    })
    .unwrap();
    assert_eq!(&finished[..2], &[3, 1], "the two longest ran first: {finished:?}");
    assert_eq!(dec.stats().steps, 9, "{:?}", dec.stats());
}

#[test]
fn a_request_too_long_for_its_slot_is_refused_alone() {
    let dir = tempfile::tempdir().unwrap();
    let lm = random_lm(dir.path());
    let reqs = requests();
    let mut dec = BatchDecoder::new(&lm, 2, 70, SamplingParams::default(), false).unwrap();
    let out = tch::no_grad(|| lm.generate(&mut dec, &reqs, LengthRatios::default())).unwrap();
    // Request 1 needs sos + 2 + 6 text tokens + task + 5 prompt tokens + 20 × 6 steps.
    assert!(matches!(out[1], Err(LmError::TooLong { needed: 135, limit: 70 })), "{:?}", out[1]);
    assert!(matches!(out[3], Err(LmError::TooLong { needed: 88, limit: 70 })), "{:?}", out[3]);
    assert!(out[0].is_ok() && out[2].is_ok(), "the others are decoded");
}
