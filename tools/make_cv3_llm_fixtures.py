#!/usr/bin/env python3
"""Parity fixtures for voxbatch's CosyVoice3 speech-token LM (issue 44): Fun-CosyVoice3-0.5B's
`CosyVoice3LM` and `CosyVoice3Tokenizer`, built with the reference classes around the tiny Qwen2 of
tools/make_llm_fixtures.py (random weights, fixed seed), beside the token2wav set that
tools/make_cv3_fixtures.py writes (run that first: this reads its official/cosyvoice3.yaml).

The reference is the public repository FunAudioLLM/CosyVoice (as for make_cv3_fixtures.py: give its
checkout as --snapshot; nothing of it is committed) with transformers 4.51.3, the version CosyVoice
pins, apart from the project venv:

  pip install --target .run/llm-site --no-deps transformers==4.51.3 huggingface_hub==0.36.0 tokenizers==0.21.4
  PYTHONPATH=.run/llm-site .venv/bin/python tools/make_cv3_llm_fixtures.py \\
      --snapshot .run/cv3-ref/CosyVoice --out tests/data/cosyvoice3

The committed set was made from CosyVoice ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 (2026-03-16).

Written:
  OUT/official/llm.pt     CosyVoice3LM's state dict as the released llm.pt holds it (`llm.model.*`
                          Qwen2ForCausalLM with its unused lm_head, `speech_embedding.weight` and
                          `llm_decoder.weight`, speech tokens + 200 rows each, no decoder bias);
  OUT/official/CosyVoice-BlankEN/  config.json (the tiny Qwen2's) and make_llm_fixtures.py's stand-in
                          Qwen2 tokenizer (vocab.json, merges.txt, tokenizer_config.json);
  OUT/parity-llm.safetensors  the tensors below (metadata `about`: the reference commit, this list);
  OUT/parity-llm.json     dimensions, the stand-in's <|endofprompt|> id, the items (texts, lengths,
                          min/max length), the sampler settings, the silent-token filter cases;
  OUT/tokenizer_parity.json  CosyVoice3Tokenizer's ids for tests/data/tokenizer_cases.txt and
                          CV3_TOKENIZER_CASES (its special tokens), and the id of every special token.

The stand-in's <|endofprompt|> is not 151646 (the released vocabulary's id, which the reference's
inference asserts is in the text): parity-llm.json and the converted model.toml (`end_of_prompt`)
say which id it is. To run the reference's own `inference` on it, the assert's `151646 in text` is
answered with the stand-in's id (torch.Tensor.__contains__ wrapped during the call); nothing else of
the reference is changed.

`--full` (no --snapshot needed): official/llm.pt at Fun-CosyVoice3-0.5B's dimensions (Hugging Face's
random init, seeded) and the stand-in tokenizer beside its config.json, no fixtures — what the device
targets bench (scripts/device/targets/cv3-token2wav.sh TEXT=1, then text-e2e.sh FAMILY=cosyvoice3).
Random weights: nothing speaks.

The tiny model's weights are make_llm_fixtures.py's scaled random ones, then the output layer's rows
rescaled: with random weights 200 of its 264 outputs would end speech at nearly every step (about
one step in two), so the rows of the speech tokens and of eos are made larger (SPEECH_ROW_SCALE) and
those of the other 199 non-speech ids smaller (STOP_ROW_SCALE): the tiny model then ends mostly on
eos, after tens of tokens (parity-llm.json: `stop_probability_per_step`).

Items (ITEMS: the frontend's three prompt layouts, texts tokenized by the reference tokenizer):
zero-shot (prompt text "You are a helpful assistant.<|endofprompt|>" + its transcript, prompt speech
tokens), instruct (prompt text "You are a helpful assistant. <instruction><|endofprompt|>", no prompt
speech: frontend_instruct2 drops it), cross-lingual (the prefix in the text, no prompt). Each runs as
the reference runs one: CosyVoice3LM.inference, batch 1, fp32, CPU, its KV cache (Qwen2Encoder.
forward_one_step), its sampler replaced by teacher forcing with random speech tokens `fed`, then eos.

parity-llm.safetensors
  item{i}.text         [N] i64       text token ids (the reference tokenizer's)
  item{i}.prompt_text  [P] i64       prompt text token ids (may be empty)
  item{i}.prompt_speech [Q] i64      the LLM's prompt speech tokens (may be empty)
  item{i}.fed          [K] i64       the tokens fed back after each step (teacher forcing)
  item{i}.lm_input     [1+P+N+1+Q, H]  the reference's prefill input: speech_embedding[sos], the Qwen2
                                     embeddings of prompt text then text, speech_embedding[task_id],
                                     speech_embedding of the prompt speech tokens
  item{i}.hidden       [1+P+N+1+Q, H]  the Qwen2's last hidden states (after its final norm) at prefill
  item{i}.logp         [K+1, S+200]  log_softmax(llm_decoder(last hidden)) at prefill and after each fed
                                     token: what the reference's sampler is given, except that it sets
                                     column S (sos) to -inf while the step is below min_len
  sampler{s}.logp      [C, S+200]    sampler cases (make_llm_fixtures.sampler_cases): log-probabilities
                                     (rows of the above, every second one with the non-speech ids made
                                     likelier so that stops are picked too),
  sampler{s}.history   [C, 16] i64   the decoded tokens before (padded with -1), .history_len [C] i64,
  sampler{s}.uniforms  [C, 2] f64    the draws of the nucleus and of the full-distribution multinomial,
  sampler{s}.ignore_eos [C] i64      1 where the case is below min_len (CosyVoice3LM.sampling_ids masks
                                     column S, sos, then), 0 otherwise
  sampler{s}.pick      [C] i64       the reference's sampling_ids: any pick >= S ends decoding
  silent.tokens        [M] i64       a decoded sequence with runs of silent tokens,
  silent.kept          [M'] i64      what CosyVoice3Model.llm_job keeps of it
"""
import argparse
import json
import os
import sys
import types
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_cosyvoice  # noqa: E402
import make_cv3_fixtures  # noqa: E402
import make_llm_fixtures  # noqa: E402

# The tiny Qwen2 of make_llm_fixtures.py, its vocabulary raised to cover CosyVoice3's 280 special tokens.
DIMS = dict(make_llm_fixtures.DIMS, vocab=768)
PREFIX = "You are a helpful assistant."
# (mode, prompt text, text, prompt speech tokens, teacher-forced steps)
ITEMS = [
    ("zero_shot", PREFIX + "<|endofprompt|>希望你以后能够做的比我还好呦。", "Hello there, this is a test.", 7, 14),
    ("instruct", PREFIX + " 请用广东话表达。<|endofprompt|>", "今天天气很好。", 0, 10),
    ("cross_lingual", "", PREFIX + "<|endofprompt|>[breath]Good morning.", 0, 9),
]
# Lines with CosyVoice3's special tokens, beside tests/data/tokenizer_cases.txt.
CV3_TOKENIZER_CASES = [
    "You are a helpful assistant.<|endofprompt|>希望你以后能够做的比我还好呦。",
    "You are a helpful assistant. 请用广东话表达。<|endofprompt|>",
    "<|endofsystem|>[breath]因为他们那一辈人[breath]在乡里面住的要习惯一点。",
    "高管也通过电话、短信、微信等方式对报道[j][ǐ]予好评。",
    "[HH][AH0][L][OW1] world, [AA1][AA][ZH] and [ǜ][iǎng][er].",
    "<strong>Loud</strong> [laughter] <|im_start|>x<|im_end|> [quick_breath][lipsmack]",
]
SPEECH_ROW_SCALE, STOP_ROW_SCALE = 2.5, 0.1
STOP_BUMP = 8.0  # added to the non-speech log-probabilities of every second sampler row
SILENT_CASE = [5, 1, 2, 1, 28, 29, 55, 248, 1, 7, 2, 2, 2, 2, 2, 2, 2, 494, 9, 2241, 2242, 2322, 2323, 1, 2, 28, 3]


def import_reference(snapshot):
    """cosyvoice.llm.llm and the tokenizer of the checkout (whisper/tiktoken, which only CosyVoice1's
    tokenizer uses, stubbed), with transformers 4.51.3."""
    make_cv3_fixtures.use_snapshot(snapshot, None, {"whisper", "whisper.tokenizer", "tiktoken"})
    # Before make_llm_fixtures.import_reference, which puts a stub in place of cosyvoice.utils.file_utils.
    from cosyvoice.cli.model import CosyVoice3Model
    llm, Qwen2Config, Qwen2ForCausalLM = make_llm_fixtures.import_reference()
    if not os.path.abspath(llm.__file__).startswith(os.path.abspath(snapshot)):
        sys.exit(f"cosyvoice.llm.llm came from {llm.__file__}, not from {snapshot}")
    from cosyvoice.tokenizer.tokenizer import CosyVoice3Tokenizer
    from cosyvoice.utils import common
    return types.SimpleNamespace(llm=llm, Qwen2Config=Qwen2Config, Qwen2ForCausalLM=Qwen2ForCausalLM,
                                 CosyVoice3Tokenizer=CosyVoice3Tokenizer, CosyVoice3Model=CosyVoice3Model, common=common)


def build(ref, seed, yaml_llm, dims=DIMS, scale=True):
    torch.manual_seed(seed)
    encoder = make_llm_fixtures.tiny_qwen2(ref.llm, ref.Qwen2Config, ref.Qwen2ForCausalLM, dims)
    lm = ref.llm.CosyVoice3LM(llm_input_size=int(yaml_llm["llm_input_size"]), llm_output_size=int(yaml_llm["llm_output_size"]),
                              speech_token_size=int(yaml_llm["speech_token_size"]), llm=encoder, sampling=None,
                              mix_ratio=yaml_llm.get("mix_ratio", [5, 15]))
    if not scale:
        return lm.eval()
    make_llm_fixtures.scale_weights(lm)
    with torch.no_grad():
        scale = torch.full((lm.llm_decoder.weight.shape[0], 1), STOP_ROW_SCALE)
        scale[:lm.speech_token_size] = scale[lm.eos_token] = SPEECH_ROW_SCALE
        lm.llm_decoder.weight.mul_(scale)
    return lm.eval()


def run_item(lm, eop, text, prompt_text, prompt_speech, fed):
    """CosyVoice3LM.inference on one item, its sampler teacher-forced: returns (lm_input, prefill
    hidden, per-step log-probabilities, what the sampler was given, min_len, max_len, tokens out)."""
    calls, seen = [], []
    original_step = lm.llm.forward_one_step

    def step(xs, masks, cache=None):
        y, cache = original_step(xs, masks=masks, cache=cache)
        calls.append((xs[0].clone(), y[0].clone(), lm.llm_decoder(y[:, -1]).log_softmax(dim=-1)[0].clone()))
        return y, cache

    def forced(weighted_scores, decoded_tokens, sampling):
        seen.append(weighted_scores.clone())
        return fed[len(decoded_tokens)] if len(decoded_tokens) < len(fed) else lm.eos_token

    contains = torch.Tensor.__contains__
    lm.llm.forward_one_step, lm.sampling = step, forced
    torch.Tensor.__contains__ = lambda self, x: contains(self, eop if isinstance(x, int) and x == 151646 else x)
    try:
        t = torch.tensor([text]), torch.tensor([prompt_text], dtype=torch.int64).reshape(1, -1)
        out = list(lm.inference(text=t[0], text_len=torch.tensor([len(text)], dtype=torch.int32), prompt_text=t[1],
                                prompt_text_len=torch.tensor([len(prompt_text)], dtype=torch.int32),
                                prompt_speech_token=torch.tensor([prompt_speech], dtype=torch.int64).reshape(1, -1),
                                prompt_speech_token_len=torch.tensor([len(prompt_speech)], dtype=torch.int32),
                                embedding=torch.zeros(0, 192)))
    finally:
        torch.Tensor.__contains__ = contains
        del lm.llm.forward_one_step
        lm.sampling = None
    assert out == fed and len(calls) == len(fed) + 1, (out, fed, len(calls))
    min_len, max_len = 2 * len(text), 20 * len(text)
    S = lm.speech_token_size
    for i, (scores, (_, _, logp)) in enumerate(zip(seen, calls)):
        expected = logp.clone()
        if i < min_len:
            expected[S] = -float("inf")
        assert torch.equal(scores, expected), f"step {i}: the sampler was not given log_softmax with sos masked below min_len"
    return calls[0][0], calls[0][1], torch.stack([c[2] for c in calls]), min_len, max_len


def silent_filter(ref_model_cls, tokens):
    """CosyVoice3Model.llm_job's filter on `tokens`, run by the reference method over a stub LM."""
    model = ref_model_cls.__new__(ref_model_cls)  # its __init__ wants flow and hift; llm_job reads only these
    model.silent_tokens = convert_cosyvoice.COSYVOICE3_SILENT_TOKENS
    model.llm_context, model.fp16, model.device = nullcontext(), False, torch.device("cpu")
    model.llm = types.SimpleNamespace(inference=lambda **kw: iter(tokens))
    model.tts_speech_token_dict, model.llm_end_dict = {"u": []}, {}
    model.llm_job(torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 0, dtype=torch.int64),
                  torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 192), "u")
    return model.tts_speech_token_dict["u"]


def write_full(official, yaml_path, yaml_llm, seed):
    """`--full`: OFFICIAL/llm.pt holding what CosyVoice3LM.state_dict() holds (the tiny reference-built
    llm.pt's names: `llm.model.*` a Qwen2ForCausalLM, `speech_embedding.weight` and `llm_decoder.weight`
    of speech tokens + 200 rows, no decoder bias) at Fun-CosyVoice3-0.5B's dimensions, Hugging Face's
    random init under `seed`, and the stand-in tokenizer with the Qwen2 config.json beside it. Needs
    transformers (4.51.3, as CosyVoice pins), not the reference repository: the layout is plain."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    full = make_llm_fixtures.FULL
    hidden, speech = int(yaml_llm["llm_input_size"]), int(yaml_llm["speech_token_size"])
    if (hidden, speech) != (full["hidden"], full["speech_tokens"]):
        sys.exit(f"{yaml_path}'s llm section is not the full one: run make_cv3_fixtures.py --config full first")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=full["vocab"], hidden_size=hidden, intermediate_size=full["intermediate"],
                         num_hidden_layers=full["layers"], num_attention_heads=full["heads"], num_key_value_heads=full["kv_heads"],
                         rope_theta=full["rope_theta"], rms_norm_eps=full["eps"], max_position_embeddings=32768,
                         tie_word_embeddings=False, use_sliding_window=False, sliding_window=None, torch_dtype="float32")
    state = {f"llm.model.{k}": v for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    state["speech_embedding.weight"] = torch.nn.Embedding(speech + 200, hidden).weight.detach()
    state["llm_decoder.weight"] = torch.nn.Linear(hidden, speech + 200, bias=False).weight.detach()
    # The names the reference's CosyVoice3LM gives (the committed tiny llm.pt was built with it).
    tiny = torch.load(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "cosyvoice3", "official", "llm.pt"),
                      map_location="cpu", weights_only=True)
    generic = lambda keys: {k.split(".layers.")[0] + ".layers.N." + k.split(".layers.")[1].split(".", 1)[1] if ".layers." in k else k for k in keys}
    if generic(state) != generic(tiny):
        sys.exit(f"the full llm.pt's names differ from the reference-built tiny one's: {sorted(generic(state) ^ generic(tiny))[:6]}")
    blank_en = os.path.join(official, "CosyVoice-BlankEN")
    make_llm_fixtures.write_standin_tokenizer(blank_en)
    config.to_json_file(os.path.join(blank_en, "config.json"))
    torch.save(state, os.path.join(official, "llm.pt"))
    print(f"wrote {official}/llm.pt: a Fun-CosyVoice3-0.5B-shaped LM ({sum(v.numel() for v in state.values()) / 1e6:.0f} M parameters), "
          "random weights, and the stand-in tokenizer")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshot", help="a FunAudioLLM/CosyVoice checkout (not needed with --full)")
    ap.add_argument("--out", required=True, help="the directory make_cv3_fixtures.py wrote (its official/cosyvoice3.yaml is read)")
    ap.add_argument("--seed", type=int, default=4343)
    ap.add_argument("--full", action="store_true",
                    help="Fun-CosyVoice3-0.5B's dimensions (Hugging Face's random init) beside the stand-in tokenizer, "
                         "official files only (llm.pt, CosyVoice-BlankEN/): for benchmarks; OUT's cosyvoice3.yaml is "
                         "make_cv3_fixtures.py --config full's")
    args = ap.parse_args()
    from safetensors.torch import save_file

    official = os.path.join(args.out, "official")
    yaml_path = os.path.join(official, "cosyvoice3.yaml")
    if not os.path.isfile(yaml_path):
        sys.exit(f"{yaml_path} is missing: run tools/make_cv3_fixtures.py --out {args.out} first")
    yaml_llm = convert_cosyvoice.read_tagged_yaml(yaml_path)["llm"]
    if not args.full and not args.snapshot:
        sys.exit("--snapshot is needed for the fixtures")
    if args.full:
        write_full(official, yaml_path, yaml_llm, args.seed)
        return
    if int(yaml_llm["llm_input_size"]) != DIMS["hidden"] or int(yaml_llm["speech_token_size"]) != DIMS["speech_tokens"]:
        sys.exit(f"{yaml_path}'s llm section is not the tiny one (hidden {DIMS['hidden']}, {DIMS['speech_tokens']} speech tokens)")
    ref = import_reference(args.snapshot)
    commit = make_cv3_fixtures.git_head(os.path.abspath(args.snapshot))
    torch.set_num_threads(1)

    # The tokenizer: the stand-in, then the reference class over it; the converter's list of special
    # tokens must be the class's.
    blank_en = os.path.join(official, "CosyVoice-BlankEN")
    make_llm_fixtures.write_standin_tokenizer(blank_en)
    tokenizer = ref.CosyVoice3Tokenizer(blank_en, skip_special_tokens=True)
    if tokenizer.special_tokens != convert_cosyvoice.COSYVOICE3_SPECIAL_TOKENS:
        sys.exit("convert_cosyvoice.COSYVOICE3_SPECIAL_TOKENS differs from the reference's CosyVoice3Tokenizer: update it")
    special = {t: tokenizer.tokenizer.convert_tokens_to_ids(t) for t in tokenizer.special_tokens["additional_special_tokens"]}
    eop = special["<|endofprompt|>"]
    make_llm_fixtures.write_tokenizer_parity(tokenizer, make_llm_fixtures.tokenizer_cases() + CV3_TOKENIZER_CASES, DIMS["vocab"],
                                             os.path.join(args.out, "tokenizer_parity.json"), end_of_prompt=eop, special_tokens=special)
    # The converter's tokenizer.json (plain JSON) must be transformers' own.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        convert_cosyvoice.convert_tokenizer(official, tmp, convert_cosyvoice.COSYVOICE3_SPECIAL_TOKENS)
        tokenizer.tokenizer.backend_tokenizer.save(os.path.join(tmp, "reference.json"))
        with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as a, open(os.path.join(tmp, "reference.json"), encoding="utf-8") as b:
            if json.load(a) != json.load(b):
                sys.exit("convert_cosyvoice.convert_tokenizer's tokenizer.json differs from transformers' for the reference tokenizer")

    lm = build(ref, args.seed, yaml_llm)
    torch.save(lm.state_dict(), os.path.join(official, "llm.pt"))
    lm.llm.model.config.to_json_file(os.path.join(blank_en, "config.json"))

    S = lm.speech_token_size
    g = torch.Generator().manual_seed(args.seed + 1)
    fx, items = {}, []
    with torch.no_grad():
        for i, (mode, prompt_text, text, n_speech, steps) in enumerate(ITEMS):
            t_ids, p_ids = tokenizer.encode(text), tokenizer.encode(prompt_text) if prompt_text else []
            speech = torch.randint(0, S, (n_speech,), generator=g).tolist()
            fed = torch.randint(0, S, (steps,), generator=g).tolist()
            lm_input, hidden, logp, min_len, max_len = run_item(lm, eop, t_ids, p_ids, speech, fed)
            for k, v in dict(text=torch.tensor(t_ids), prompt_text=torch.tensor(p_ids, dtype=torch.int64),
                             prompt_speech=torch.tensor(speech, dtype=torch.int64), fed=torch.tensor(fed),
                             lm_input=lm_input, hidden=hidden, logp=logp).items():
                fx[f"item{i}.{k}"] = v.contiguous()
            items.append(dict(mode=mode, prompt_text=prompt_text, text=text, text_tokens=len(t_ids), prompt_text_tokens=len(p_ids),
                              prompt_speech_tokens=n_speech, steps=steps, lm_input_rows=lm_input.shape[0], min_len=min_len, max_len=max_len,
                              stop_probability_per_step=[float(r[S:].exp().sum()) for r in logp]))

    # Sampler cases: CosyVoice3LM.sampling_ids (ras_sampling after masking sos below min_len).
    rows = torch.cat([fx[f"item{i}.logp"] for i in range(len(ITEMS))])
    stop_heavy = rows.clone()
    stop_heavy[:, S:] += STOP_BUMP
    rows = torch.stack([r for pair in zip(rows, stop_heavy.log_softmax(dim=-1)) for r in pair])
    settings = make_llm_fixtures.SAMPLER_SETTINGS
    sampling = yaml_llm["sampling"]
    if (sampling["top_p"], sampling["top_k"], sampling["win_size"], sampling["tau_r"]) != settings[0]:
        sys.exit(f"cosyvoice3.yaml's ras_sampling settings {sampling} are not CosyVoice2's {settings[0]}: update the cases")

    def pick(row, history, setting, case):
        top_p, top_k, win, tau = setting
        lm.sampling = lambda scores, decoded, _: ref.common.ras_sampling(scores, decoded, None, top_p=top_p, top_k=top_k,
                                                                          win_size=win, tau_r=tau)
        return lm.sampling_ids(row, history, None, ignore_eos=case % 2 == 0)

    fx.update(make_llm_fixtures.sampler_cases(rows, g, pick, settings))
    for s in range(len(settings)):
        fx[f"sampler{s}.ignore_eos"] = torch.tensor([int(c % 2 == 0) for c in range(make_llm_fixtures.SAMPLER_CASES)])
    lm.sampling = None

    # The silent-token filter, by the reference's CosyVoice3Model.llm_job.
    kept = silent_filter(ref.CosyVoice3Model, SILENT_CASE)
    fx["silent.tokens"], fx["silent.kept"] = torch.tensor(SILENT_CASE), torch.tensor(kept)

    doc = __doc__.split("\nparity-llm.safetensors\n", 1)[1].strip()
    about = {"stage": "llm", "seed": args.seed, "reference": f"FunAudioLLM/CosyVoice {commit}",
             "regenerate": f"tools/make_cv3_llm_fixtures.py --snapshot <CosyVoice checkout> --seed {args.seed} --out <dir>",
             "tensors": doc}
    save_file(fx, os.path.join(args.out, "parity-llm.safetensors"),
              metadata={"about": json.dumps(about, indent=1, sort_keys=True, ensure_ascii=False)})
    meta = {"dims": DIMS, "seed": args.seed, "reference": commit, "end_of_prompt": eop,
            "end_of_prompt_released": 151646, "sos": lm.sos, "eos": lm.eos_token, "task_id": lm.task_id, "fill": lm.fill_token,
            "stop_ids": [S, S + 199], "outputs": S + 200, "items": items,
            "sampler": {"settings": settings, "cases": make_llm_fixtures.SAMPLER_CASES,
                        "rows": f"rows of the items' log-probabilities, every second one with its non-speech ids raised by {STOP_BUMP} (log-softmaxed again)"},
            "silent": {"tokens": convert_cosyvoice.COSYVOICE3_SILENT_TOKENS, "max_run": convert_cosyvoice.COSYVOICE3_MAX_SILENT_TOKENS}}
    with open(os.path.join(args.out, "parity-llm.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    print(json.dumps({"end_of_prompt": eop, "items": [(it["mode"], it["lm_input_rows"], it["steps"]) for it in items],
                      "kept": len(kept)}))


if __name__ == "__main__":
    main()
