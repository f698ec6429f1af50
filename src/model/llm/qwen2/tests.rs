//! `qwen2`'s unit tests.

use super::*;

fn tiny() -> Qwen2Dims {
    Qwen2Dims { layers: 2, hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 96, vocab: 50, rope_theta: 1e6, eps: 1e-6 }
}

/// A random decoder (fixed seed) written to safetensors and loaded as the converter's output would be.
fn random_model(dir: &std::path::Path) -> Qwen2 {
    let d = tiny();
    tch::manual_seed(11);
    let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)) * 0.2;
    let path = dir.join("llm.safetensors");
    Tensor::write_safetensors(&random_tensors("m", &d, &r), &path).unwrap();
    let w = Weights::load(&path, tch::Device::Cpu).unwrap();
    let model = Qwen2::new(&w, "m", d).unwrap();
    w.finish().unwrap();
    model
}

/// Greedy steps with tied embeddings: each step's hidden state and the token it picks.
fn step_token(model: &Qwen2, hidden: &Tensor) -> i64 {
    hidden.matmul(&model.embed_tokens.tr()).argmax(-1, false).int64_value(&[])
}

fn solo(model: &Qwen2, prompt: &[i64], steps: usize) -> Vec<Tensor> {
    let mut cache = model.cache(1, 64, Kind::Float).unwrap();
    let h = model.prefill(&mut cache, 0, &model.embed(prompt).unwrap()).unwrap();
    let mut last = h.get(h.size()[0] - 1);
    let mut out = vec![last.shallow_clone()];
    for _ in 0..steps {
        let next = step_token(model, &last);
        last = model.decode(&mut cache, &[0], &model.embed(&[next]).unwrap()).unwrap().get(0);
        out.push(last.shallow_clone());
    }
    out
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn slots_refilled_mid_decode_give_every_sequence_its_solo_result() {
    let dir = tempfile::tempdir().unwrap();
    let model = tch::no_grad(|| random_model(dir.path()));
    let prompts: [&[i64]; 3] = [&[3, 7, 1, 9, 4], &[2, 2, 8, 5, 6, 1, 0, 3, 7], &[11, 12, 13]];
    let steps = [3usize, 7, 5];
    let alone: Vec<Vec<Tensor>> = tch::no_grad(|| prompts.iter().zip(steps).map(|(p, s)| solo(&model, p, s)).collect());

    // Two slots: A and B decode together; when A finishes, C is prefilled into A's slot and
    // decodes beside B. Each sequence at each step must equal its solo run.
    tch::no_grad(|| {
        let mut cache = model.cache(2, 64, Kind::Float).unwrap();
        let mut got: Vec<Vec<Tensor>> = (0..3).map(|_| Vec::new()).collect();
        let mut last: Vec<Option<Tensor>> = vec![None, None, None];
        let mut slot_of = [Some(0usize), Some(1), None];
        let mut left = steps;
        for seq in 0..2 {
            let h = model.prefill(&mut cache, seq, &model.embed(prompts[seq]).unwrap()).unwrap();
            let l = h.get(h.size()[0] - 1);
            got[seq].push(l.shallow_clone());
            last[seq] = Some(l);
        }
        while left.iter().any(|&s| s > 0) {
            let active: Vec<usize> = (0..3).filter(|&s| slot_of[s].is_some() && left[s] > 0).collect();
            let slots: Vec<usize> = active.iter().map(|&s| slot_of[s].unwrap()).collect();
            let next: Vec<i64> = active.iter().map(|&s| step_token(&model, last[s].as_ref().unwrap())).collect();
            let h = model.decode(&mut cache, &slots, &model.embed(&next).unwrap()).unwrap();
            for (row, &s) in active.iter().enumerate() {
                let l = h.get(row as i64);
                got[s].push(l.shallow_clone());
                last[s] = Some(l);
                left[s] -= 1;
            }
            // A finished: free its slot and refill it with C at once.
            if left[0] == 0 && slot_of[0].is_some() {
                let slot = slot_of[0].take().unwrap();
                cache.free(slot);
                let h = model.prefill(&mut cache, slot, &model.embed(prompts[2]).unwrap()).unwrap();
                let l = h.get(h.size()[0] - 1);
                got[2].push(l.shallow_clone());
                last[2] = Some(l);
                slot_of[2] = Some(slot);
            }
        }
        for seq in 0..3 {
            assert_eq!(got[seq].len(), alone[seq].len(), "sequence {seq}");
            for (step, (a, b)) in got[seq].iter().zip(&alone[seq]).enumerate() {
                let diff = max_diff(a, b);
                assert!(diff <= 1e-5, "sequence {seq} step {step}: {diff}");
            }
        }
    });
}

#[test]
fn a_prompt_longer_than_its_slot_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path());
    let mut cache = model.cache(1, 4, Kind::Float).unwrap();
    let e = tch::no_grad(|| model.prefill(&mut cache, 0, &model.embed(&[1, 2, 3, 4, 5]).unwrap())).unwrap_err();
    assert!(e.to_string().contains("exceed"), "{e}");
    assert_eq!(SlotCache::bytes_per_token(24, 2, 64, Kind::BFloat16), 12 * 1024, "12 KiB per token for CosyVoice2-0.5B in bf16");
}
