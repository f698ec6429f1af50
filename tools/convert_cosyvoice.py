#!/usr/bin/env python3
"""Converts an official CosyVoice2 or CosyVoice3 model directory into a voxbatch model. The family
is the directory's config: `cosyvoice3.yaml` → CosyVoice3 (below), else CosyVoice2: kind
`cosyvoice2` (text jobs: LLM + token2wav + tokenizer + grammars) when the directory has llm.pt and
CosyVoice-BlankEN/, else `cosyvoice2-token2wav` (jobs carry speech tokens).

Input (as CosyVoice2 ships it): flow.pt, hift.pt, spk2info.pt, cosyvoice2.yaml, and optionally
llm.pt with CosyVoice-BlankEN/config.json (the speech-token LM -> llm.safetensors).
Output directory:
  model.toml              the manifest (kind, dimensions, voices);
  token2wav.safetensors   `flow.*` and `hift.*` tensors in fp32, weight norm folded into plain weights,
                          plus `flow.rand_noise`, the fixed noise CosyVoice2's flow draws (seed 0);
  voices.safetensors      per registered voice: `<name>.embedding` (192-d x-vector) and, for
                          zero-shot voices, `<name>.prompt_token` and `<name>.prompt_feat` (frames x 80),
                          `<name>.llm_prompt_token` and, where spk2info.pt has it, `<name>.prompt_text`
                          (token ids). spk2info.pt's own key names and third-party ones (`embedding`,
                          `speech_token`, `speech_feat`) are read; an empty one registers no voice;
  llm.safetensors         the speech-token LM, when llm.pt is there ([cosyvoice2.llm] in model.toml);
  tokenizer.json          CosyVoice-BlankEN's Qwen2 tokenizer with CosyVoice2's special tokens, when the
                          checkpoint has one (written as plain JSON, as transformers 4.51.3 would save
                          it: no transformers needed);
  fsts/                   with the tokenizer: WeTextProcessing's zh/en TN grammars from the `wetext`
                          package (the text frontend's normalisation);
  speech_tokenizer_v2.onnx, campplus.onnx
                          copied as they are, when the checkpoint has them: `voxbatch voice add` runs
                          them (onnxruntime) to make voices from recordings.

CosyVoice3 (Fun-CosyVoice3-0.5B: cosyvoice3.yaml, flow.pt, hift.pt, spk2info.pt if present,
campplus.onnx and speech_tokenizer_v3.onnx if present, llm.pt with CosyVoice-BlankEN/) → kind
`cosyvoice3` (text jobs) when llm.pt, the tokenizer and the grammars are there, else
`cosyvoice3-token2wav` (jobs carry speech tokens):
  model.toml              kind, [cosyvoice3] dimensions (from cosyvoice3.yaml's flow and hift
                          sections, checked against the weights), voices; for kind cosyvoice3,
                          [cosyvoice3.llm]: the keys of [cosyvoice2.llm] (Qwen2 dimensions from
                          CosyVoice-BlankEN/config.json, ras_sampling's settings from the yaml's
                          `llm.sampling`, speech_tokens = the yaml's speech_token_size, checked
                          against the weights) plus end_of_prompt (tokenizer.json's id of
                          <|endofprompt|>), silent_tokens and max_silent_tokens (CosyVoice3Model's);
  llm.safetensors         CosyVoice3LM's weights (llm.pt, or the file --llm names: llm.rl.pt is
                          the RL-tuned LM Fun-CosyVoice3-0.5B ships beside it) in fp32 under llm.pt's names: `llm.model.model.*`
                          (Qwen2), `speech_embedding.weight` and `llm_decoder.weight` [speech_tokens
                          + 200, hidden] (no decoder bias, no llm_embedding: sos and task_id are
                          speech_embedding rows); lm_head dropped; one error lists every missing,
                          misshapen and unexpected tensor (`cosyvoice3_llm_expected`);
  tokenizer.json          as for CosyVoice2, with CosyVoice3Tokenizer's special tokens
                          (COSYVOICE3_SPECIAL_TOKENS: CosyVoice2's, <|endofsystem|>, CMU phones,
                          pinyin); fsts/ as for CosyVoice2;
  token2wav.safetensors   fp32, named as the official state dicts name them (`flow.` + flow.pt's
                          names, `hift.` + hift.pt's with any `generator.` prefix dropped), weight
                          norm folded into plain `.weight`s, plus the two fixed noise buffers the
                          reference draws in its constructors (the same values, not an equivalent):
                            flow.rand_noise                      [1, 80, 15000]  the CFM's starting
                              noise (seed 0; each item's z = its first T columns);
                            hift.m_source.l_sin_gen.sine_waves   [1, 24000·S, 9] the causal source's
                              noise (uniform [0, 1)), S = --noise-seconds (upstream 300); each item
                              uses its first 480·T rows;
                          the tensors expected are listed by `cosyvoice3_expected` (one error lists
                          every missing, misshapen and unexpected one);
  voices.safetensors      as for CosyVoice2 (CosyVoice3's spk2info.pt has the same keys);
  speech_tokenizer_v3.onnx, campplus.onnx  copied as they are, when the checkpoint has them.
The fixed source noise comes from torch's CPU generator in the order upstream's constructors draw
(`cosyvoice3_noise`); tools/make_cv3_fixtures.py checks it against the reference classes' buffers.

Needs torch, safetensors and PyYAML (and the `wetext` package for the grammars).

Usage: convert_cosyvoice.py MODEL_DIR OUT_DIR [--name NAME] [--noise-seconds S]
"""
import argparse
import json
import os
import re
import sys

import torch


def fold_weight_norm(sd):
    """Replaces (g, v) weight-norm pairs by w = g * v / ||v|| (norm over all dims but the first)."""
    out, pairs = {}, {}
    for k, v in sd.items():
        m = re.match(r"(.*)\.parametrizations\.weight\.original([01])$", k) or re.match(r"(.*)\.weight_([gv])$", k)
        if m:
            slot = {"0": "g", "1": "v"}.get(m.group(2), m.group(2))
            pairs.setdefault(m.group(1), {})[slot] = v
        else:
            out[k] = v
    for base, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            sys.exit(f"weight norm of {base} is incomplete: has {sorted(gv)}")
        g, v = gv["g"].float(), gv["v"].float()
        norm = v.reshape(v.shape[0], -1).norm(dim=1).reshape([-1] + [1] * (v.dim() - 1))
        out[base + ".weight"] = v * (g / norm)
    return out


def yaml_int(text, key, default):
    m = re.search(rf"^\s*{key}:\s*(\d+)\s*$", text, re.M)
    return int(m.group(1)) if m else default


def count(sd, prefix):
    idx = {int(m.group(1)) for k in sd for m in [re.match(re.escape(prefix) + r"(\d+)\.", k)] if m}
    return max(idx) + 1 if idx else 0


def qwen2_dims(src):
    """CosyVoice-BlankEN/config.json's Qwen2 dimensions under the manifest's names (the first keys of
    `[cosyvoice2.llm]` and `[cosyvoice3.llm]`)."""
    config_path = os.path.join(src, "CosyVoice-BlankEN", "config.json")
    if not os.path.exists(config_path):
        sys.exit(f"{src} has llm.pt but no CosyVoice-BlankEN/config.json (the Qwen2 config the LLM needs)")
    with open(config_path) as f:
        cfg = json.load(f)
    heads = cfg["num_attention_heads"]
    return dict(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
                kv_heads=cfg.get("num_key_value_heads", heads), head_dim=cfg["hidden_size"] // heads,
                intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                rope_theta=float(cfg.get("rope_theta", 10000.0)), eps=float(cfg.get("rms_norm_eps", 1e-6)))


def convert_llm(src, out_dir):
    """llm.pt + CosyVoice-BlankEN/config.json -> llm.safetensors; returns the [cosyvoice2.llm]
    keys, or None when the directory has no llm.pt."""
    path = os.path.join(src, "llm.pt")
    if not os.path.exists(path):
        return None
    dims = qwen2_dims(src)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    # lm_head is unused (llm_decoder maps to speech tokens); training-only modules are dropped too.
    sd = {k: v.float().contiguous() for k, v in sd.items()
          if k.startswith(("llm.model.model.", "llm_embedding.", "speech_embedding.", "llm_decoder."))}
    for required in ("llm_embedding.weight", "speech_embedding.weight", "llm_decoder.weight", "llm.model.model.embed_tokens.weight"):
        if required not in sd:
            sys.exit(f"{path} has no {required}: not a CosyVoice2 Qwen2LM state dict")
    from safetensors.torch import save_file
    save_file(sd, os.path.join(out_dir, "llm.safetensors"))
    return dict(dims, speech_tokens=sd["speech_embedding.weight"].shape[0] - 3,
                top_p=0.8, top_k=25, win_size=10, tau_r=0.1, min_token_text_ratio=2.0, max_token_text_ratio=20.0)


# CosyVoice2's added special tokens (cosyvoice/tokenizer/tokenizer.py, QwenTokenizer): ids after
# the Qwen2 vocabulary, matched whole in the text.
SPECIAL_TOKENS = {
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]",
        "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>",
        "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]", "[mn]",
    ],
}


# CosyVoice3's (CosyVoice3Tokenizer): CosyVoice2's, then <|endofsystem|>, the CMU phones (ARPAbet, the
# vowels bare and with stress 0-2, in this order) and the toned pinyin initials and finals, each in
# brackets. tools/make_cv3_llm_fixtures.py checks the list against the reference class's.
_CMU_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_CMU_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
_PINYIN = """a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng
    iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo uà uài
    uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn
    àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē
    ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ""".split()
COSYVOICE3_SPECIAL_TOKENS = dict(SPECIAL_TOKENS, additional_special_tokens=(
    SPECIAL_TOKENS["additional_special_tokens"] + ["<|endofsystem|>"]
    + [f"[{p}{s}]" for p in sorted(_CMU_VOWELS + _CMU_CONSONANTS) for s in (["", "0", "1", "2"] if p in _CMU_VOWELS else [""])]
    + [f"[{p}]" for p in _PINYIN]))

# Qwen2's pre-tokenizer pattern and the pieces around its byte-level BPE, as transformers' Qwen2Converter
# builds the fast tokenizer from vocab.json + merges.txt (transformers 4.51.3, tokenizers 0.21).
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _byte_level(add_prefix_space, trim_offsets, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets, "use_regex": use_regex}


def qwen2_tokenizer_json(blank_en):
    """CosyVoice-BlankEN's Qwen2 tokenizer as a `tokenizers` JSON object: its tokenizer.json when it
    ships one, else built from vocab.json, merges.txt and tokenizer_config.json's added tokens the
    way transformers' Qwen2Converter builds it (tools/make_cv3_llm_fixtures.py checks the result
    equals transformers' own, object for object)."""
    path = os.path.join(blank_en, "tokenizer.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(blank_en, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    merges = []
    with open(os.path.join(blank_en, "merges.txt"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.strip()
            if (i == 0 and line.startswith("#version:")) or not line:
                continue
            merges.append(line.split())
    config_path = os.path.join(blank_en, "tokenizer_config.json")
    config = {}
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    added = [dict(id=int(i), content=t["content"], single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                  rstrip=t.get("rstrip", False), normalized=t.get("normalized", False), special=t.get("special", True))
             for i, t in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0]))]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            _byte_level(False, True, False)]},
        "post_processor": _byte_level(True, False, True),
        "decoder": _byte_level(True, True, True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def add_special_tokens(tokenizer, special_tokens):
    """The reference's `tokenizer.add_special_tokens(special_tokens)` on a tokenizer JSON object: each
    token not yet added gets the next id (its vocabulary id if the BPE has it), in the order
    eos, pad, additional_special_tokens; every one is matched whole and never normalised."""
    added = {t["content"]: t for t in tokenizer["added_tokens"]}
    vocab = tokenizer["model"]["vocab"]
    next_id = max(list(vocab.values()) + [t["id"] for t in added.values()]) + 1
    for token in [special_tokens["eos_token"], special_tokens["pad_token"]] + special_tokens["additional_special_tokens"]:
        if token in added:
            continue
        if token in vocab:
            token_id = vocab[token]
        else:
            token_id, next_id = next_id, next_id + 1
        added[token] = dict(id=token_id, content=token, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    tokenizer["added_tokens"] = sorted(added.values(), key=lambda t: t["id"])
    return tokenizer


def convert_tokenizer(src, out_dir, special_tokens=SPECIAL_TOKENS):
    """CosyVoice-BlankEN's Qwen2 tokenizer (vocab.json + merges.txt, or tokenizer.json) plus the
    family's special tokens (CosyVoice2's, or COSYVOICE3_SPECIAL_TOKENS) -> OUT/tokenizer.json, one
    file the Rust `tokenizers` crate reads, with the ids the reference tokenizer gives (plain JSON:
    no transformers needed). Returns (the file name, {special token: id}), or (None, {}) when the
    checkpoint has no tokenizer."""
    blank_en = os.path.join(src, "CosyVoice-BlankEN")
    if not any(os.path.isfile(os.path.join(blank_en, f)) for f in ("vocab.json", "tokenizer.json")):
        return None, {}
    tokenizer = add_special_tokens(qwen2_tokenizer_json(blank_en), special_tokens)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    return "tokenizer.json", {t["content"]: t["id"] for t in tokenizer["added_tokens"]}


# WeTextProcessing's compiled grammars the frontend runs (src/frontend/normalize.rs), from the
# `wetext` package (pip install --no-deps wetext==0.1.8): Chinese and English text normalisation.
GRAMMARS = ("zh/tn/tagger.fst", "zh/tn/verbalizer.fst", "en/tn/tagger.fst", "en/tn/verbalizer.fst")


PROMPT_MODELS = ["speech_tokenizer_v2.onnx", "campplus.onnx"]


def copy_prompt_models(src, out_dir, names=PROMPT_MODELS):
    """The speech tokenizer and speaker model (ONNX) `voice add` runs, copied unchanged; a note
    when the checkpoint lacks them (voices then come only from spk2info.pt)."""
    import shutil
    found = [f for f in names if os.path.isfile(os.path.join(src, f))]
    for f in found:
        shutil.copyfile(os.path.join(src, f), os.path.join(out_dir, f))
    if len(found) < len(names):
        missing = ", ".join(f for f in names if f not in found)
        print(f"{src} has no {missing}: `voxbatch voice add` will refuse this model (its spk2info.pt voices still work)", file=sys.stderr)
    return found


def copy_grammars(out_dir):
    """The text normalisation grammars into OUT/fsts/ (nothing is downloaded at run time).
    Returns the directory name, or None (with a warning) when `wetext` is not installed."""
    import importlib.util
    import shutil
    spec = importlib.util.find_spec("wetext")
    if spec is None or not spec.submodule_search_locations:
        print("the `wetext` package is not installed: no text normalisation grammars copied "
              "(pip install --no-deps wetext==0.1.8, then convert again)", file=sys.stderr)
        return None
    src = os.path.join(list(spec.submodule_search_locations)[0], "fsts")
    for rel in GRAMMARS:
        os.makedirs(os.path.dirname(os.path.join(out_dir, "fsts", rel)), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), os.path.join(out_dir, "fsts", rel))
    return "fsts"


# Key names of a voice's entries: CosyVoice2's own (`frontend_zero_shot`, `add_zero_shot_spk`) first,
# then what CosyVoice-300M-SFT-style and third-party spk2info.pt files use.
EMBEDDING_KEYS = ("flow_embedding", "embedding", "spk_embedding")
FLOW_TOKEN_KEYS = ("flow_prompt_speech_token", "speech_token", "prompt_speech_token")
FEAT_KEYS = ("prompt_speech_feat", "speech_feat")
LLM_TOKEN_KEYS = ("llm_prompt_speech_token", "speech_token", "prompt_speech_token")


def first(info, keys):
    for k in keys:
        if k in info and info[k] is not None:
            return info[k]
    return None


def convert_voices(spk2info):
    """spk2info.pt's voices -> (voices.safetensors tensors, names, prompt lengths). Per voice:
    `<name>.embedding` (192-d x-vector), and for zero-shot voices `<name>.prompt_token` +
    `<name>.prompt_feat` (flow prompt, 2 mel frames per token), `<name>.llm_prompt_token` (the LLM's
    prompt speech tokens) and `<name>.prompt_text` (the prompt's text token ids) where present.
    Exits with a clear message on an entry it cannot read."""
    if not isinstance(spk2info, dict):
        sys.exit(f"spk2info.pt holds a {type(spk2info).__name__}, not a dict of voices")
    voices, names, prompt_lens = {}, [], []
    for name, info in spk2info.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-\u0080-\uffff]+", name):
            print(f"skipping voice {name!r}: names are letters, digits, '_' and '-'", file=sys.stderr)
            continue
        if not isinstance(info, dict):
            sys.exit(f"spk2info.pt: voice {name!r} is a {type(info).__name__}, not a dict of tensors")
        emb = first(info, EMBEDDING_KEYS)
        if emb is None:
            sys.exit(f"spk2info.pt: voice {name!r} has no x-vector (one of {', '.join(EMBEDDING_KEYS)}); "
                     f"its keys are {', '.join(map(str, info))}")
        emb = torch.as_tensor(emb).reshape(-1).float()
        if emb.numel() != 192:
            sys.exit(f"spk2info.pt: voice {name!r}'s x-vector has {emb.numel()} values, CosyVoice2's have 192")
        voices[f"{name}.embedding"] = emb.clone().contiguous()
        tok, feat = first(info, FLOW_TOKEN_KEYS), first(info, FEAT_KEYS)
        if (tok is None) != (feat is None):
            have = "speech tokens" if feat is None else "prompt mel"
            sys.exit(f"spk2info.pt: voice {name!r} has {have} but not the other; a zero-shot prompt needs both")
        if tok is not None:
            tok = torch.as_tensor(tok).reshape(-1).long()
            feat = torch.as_tensor(feat).reshape(-1, 80).float()
            n = min(tok.shape[0], feat.shape[0] // 2)  # CosyVoice2 trims the prompt to 2 frames per token
            voices[f"{name}.prompt_token"] = tok[:n].clone().contiguous()
            voices[f"{name}.prompt_feat"] = feat[: 2 * n].clone().contiguous()
            prompt_lens.append(n)
            # Without LLM prompt tokens of its own, the LLM gets the flow's.
            llm_tok = first(info, LLM_TOKEN_KEYS)
            llm_tok = tok[:n] if llm_tok is None else torch.as_tensor(llm_tok).reshape(-1).long()
            voices[f"{name}.llm_prompt_token"] = llm_tok.clone().contiguous()
        else:
            prompt_lens.append(0)
        text = info.get("prompt_text")
        if text is not None:
            if isinstance(text, str):
                sys.exit(f"spk2info.pt: voice {name!r}'s prompt_text is a string; CosyVoice2 stores its token ids")
            voices[f"{name}.prompt_text"] = torch.as_tensor(text).reshape(-1).long().contiguous()
        names.append(name)
    return voices, names, prompt_lens


# ---------------------------------------------------------------- CosyVoice3 (Fun-CosyVoice3-0.5B)

class _Ref(str):
    """A hyperpyyaml `!ref` expression, resolved after loading."""


def _arithmetic(expr):
    """The value of a `!ref` expression after substitution: a literal, or + - * / // over numbers."""
    import ast
    import operator
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv}

    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        return ast.literal_eval(node)
    return value(ast.parse(expr.strip(), mode="eval").body)


def read_tagged_yaml(path):
    """cosyvoice3.yaml as plain data: hyperpyyaml's tags (`!new:…`, `!name:…`) are dropped and their
    nodes read as the mappings, lists and strings they hold, so nothing is imported; `!ref <key>`
    (and arithmetic over such references) takes the top-level key's value."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def untagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        text = loader.construct_scalar(node)
        return _Ref(text) if suffix == "ref" else text

    Loader.add_multi_constructor("!", untagged)
    with open(path) as f:
        data = yaml.load(f, Loader=Loader)

    def resolve(v, depth=0):
        if depth > 20:
            sys.exit(f"{path}: !ref references loop")
        if isinstance(v, dict):
            return {k: resolve(x, depth) for k, x in v.items()}
        if isinstance(v, list):
            return [resolve(x, depth) for x in v]
        if isinstance(v, _Ref):
            parts = re.split(r"<([^>]+)>", v)
            if len(parts) == 3 and not parts[0].strip() and not parts[2].strip():
                return resolve(data.get(parts[1]), depth + 1)  # a plain reference keeps the value's type
            expr = "".join(repr(resolve(data.get(p), depth + 1)) if i % 2 else p for i, p in enumerate(parts))
            try:
                return _arithmetic(expr)
            except (ValueError, SyntaxError, TypeError):
                return expr
        return v
    return resolve(data)


def cosyvoice3_config(yaml_path):
    """The flow's and vocoder's hyperparameters from cosyvoice3.yaml (its `flow:` and `hift:`
    sections, upstream's defaults where a key is absent), with a clear exit when the file is not
    a CosyVoice3 config."""
    cfg = read_tagged_yaml(yaml_path)
    try:
        flow, hift = cfg["flow"], cfg["hift"]
        pre, dec = flow["pre_lookahead_layer"], flow["decoder"]
        est, cfm = dec["estimator"], dec["cfm_params"]
    except (KeyError, TypeError) as e:
        sys.exit(f"{yaml_path} is not a CosyVoice3 config: no flow/hift section {e} "
                 f"(expected flow: CausalMaskedDiffWithDiT with pre_lookahead_layer and decoder.estimator: DiT)")
    cfm = cfm.get("content", cfm)
    f0 = hift.get("f0_predictor", {})
    istft = hift.get("istft_params", {"n_fft": 16, "hop_len": 4})
    c = dict(
        vocab_size=int(flow.get("vocab_size", 6561)), input_size=int(flow.get("input_size", 80)),
        output_size=int(flow.get("output_size", 80)), spk_embed_dim=int(flow.get("spk_embed_dim", 192)),
        token_mel_ratio=int(flow.get("token_mel_ratio", 2)),
        pre_lookahead_len=int(pre.get("pre_lookahead_len", 3)), pre_lookahead_channels=int(pre["channels"]),
        dit_dim=int(est["dim"]), dit_depth=int(est.get("depth", 8)), dit_heads=int(est.get("heads", 8)),
        dit_head_dim=int(est.get("dim_head", 64)), dit_ff_mult=float(est.get("ff_mult", 4)),
        mel_dim=int(est.get("mel_dim", 80)), mu_dim=int(est.get("mu_dim") or est.get("mel_dim", 80)),
        spk_dim=int(est.get("spk_dim") or 0), long_skip=bool(est.get("long_skip_connection", False)),
        t_scheduler=str(cfm.get("t_scheduler", "cosine")), cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)),
        hift_in=int(hift.get("in_channels", 80)), hift_channels=int(hift.get("base_channels", 512)),
        nb_harmonics=int(hift.get("nb_harmonics", 8)), sampling_rate=int(hift.get("sampling_rate", 24000)),
        upsample_rates=[int(u) for u in hift.get("upsample_rates", [8, 5, 3])],
        upsample_kernel_sizes=[int(k) for k in hift.get("upsample_kernel_sizes", [16, 11, 7])],
        resblock_kernel_sizes=[int(k) for k in hift.get("resblock_kernel_sizes", [3, 7, 11])],
        resblock_dilation_sizes=[[int(d) for d in ds] for ds in hift.get("resblock_dilation_sizes", [[1, 3, 5]] * 3)],
        source_resblock_kernel_sizes=[int(k) for k in hift.get("source_resblock_kernel_sizes", [7, 7, 11])],
        source_resblock_dilation_sizes=[[int(d) for d in ds] for ds in hift.get("source_resblock_dilation_sizes", [[1, 3, 5]] * 3)],
        n_fft=int(istft["n_fft"]), hop_len=int(istft["hop_len"]),
        conv_pre_look_right=int(hift.get("conv_pre_look_right", 4)),
        f0_channels=int(f0.get("cond_channels", 512)), f0_in=int(f0.get("in_channels", 80)),
        f0_classes=int(f0.get("num_class", 1)),
    )
    if c["dit_ff_mult"] != int(c["dit_ff_mult"]):
        sys.exit(f"{yaml_path}: ff_mult {c['dit_ff_mult']} is not a whole number")
    c["dit_ff_mult"] = int(c["dit_ff_mult"])
    if c["t_scheduler"] != "cosine" or c["long_skip"]:
        sys.exit(f"{yaml_path}: t_scheduler {c['t_scheduler']!r}, long_skip_connection {c['long_skip']}: "
                 "voxbatch runs CosyVoice3's cosine schedule without the long skip")
    return c


def cosyvoice3_expected(c):
    """{name: shape} of every tensor a CosyVoice3 token2wav needs, as the official state dicts name
    them (`flow.` + flow.pt's names; `hift.` + hift.pt's with weight norm folded), from the config
    alone: the layout the Rust port reads (docs in /work/notes/cv3-port.md's tensor tables)."""
    e = {}
    d, inner, cpos = c["dit_dim"], c["dit_heads"] * c["dit_head_dim"], 31
    e["flow.input_embedding.weight"] = [c["vocab_size"], c["input_size"]]
    e["flow.spk_embed_affine_layer.weight"] = [c["output_size"], c["spk_embed_dim"]]
    e["flow.spk_embed_affine_layer.bias"] = [c["output_size"]]
    p, ch = "flow.pre_lookahead_layer.", c["pre_lookahead_channels"]
    e[p + "conv1.weight"], e[p + "conv1.bias"] = [ch, c["input_size"], c["pre_lookahead_len"] + 1], [ch]
    e[p + "conv2.weight"], e[p + "conv2.bias"] = [c["input_size"], ch, 3], [c["input_size"]]

    def linear(name, out, inp):
        e[name + ".weight"], e[name + ".bias"] = [out, inp], [out]

    p = "flow.decoder.estimator."
    linear(p + "time_embed.time_mlp.0", d, 256)
    linear(p + "time_embed.time_mlp.2", d, d)
    linear(p + "input_embed.proj", d, 2 * c["mel_dim"] + c["mu_dim"] + c["spk_dim"])
    for conv in ("conv1", "conv2"):
        e[f"{p}input_embed.conv_pos_embed.{conv}.0.weight"] = [d, d // 16, cpos]
        e[f"{p}input_embed.conv_pos_embed.{conv}.0.bias"] = [d]
    e[p + "rotary_embed.inv_freq"] = [c["dit_head_dim"] // 2]
    for b in range(c["dit_depth"]):
        q = f"{p}transformer_blocks.{b}."
        linear(q + "attn_norm.linear", 6 * d, d)
        for proj in ("to_q", "to_k", "to_v"):
            linear(q + "attn." + proj, inner, d)
        linear(q + "attn.to_out.0", d, inner)
        linear(q + "ff.ff.0.0", d * c["dit_ff_mult"], d)
        linear(q + "ff.ff.2", d, d * c["dit_ff_mult"])
    linear(p + "norm_out.linear", 2 * d, d)
    linear(p + "proj_out", c["mel_dim"], d)

    def conv(name, out, inp, k):
        e[name + ".weight"], e[name + ".bias"] = [out, inp, k], [out]

    def resblock(name, ch, k, dilations):
        for j in range(len(dilations)):
            conv(f"{name}.convs1.{j}", ch, ch, k)
            conv(f"{name}.convs2.{j}", ch, ch, k)
            e[f"{name}.activations1.{j}.alpha"] = [ch]
            e[f"{name}.activations2.{j}.alpha"] = [ch]

    base, spec = c["hift_channels"], c["n_fft"] + 2
    linear("hift.m_source.l_linear", 1, c["nb_harmonics"] + 1)
    conv("hift.conv_pre", base, c["hift_in"], c["conv_pre_look_right"] + 1)
    for i, k in enumerate(c["upsample_kernel_sizes"]):
        conv(f"hift.ups.{i}", base // 2 ** (i + 1), base // 2 ** i, k)
    rates = c["upsample_rates"]
    cum = [1]
    for u in ([1] + rates[::-1][:-1])[1:]:
        cum.append(cum[-1] * u)
    for i, (u, k, ds) in enumerate(zip(cum[::-1], c["source_resblock_kernel_sizes"], c["source_resblock_dilation_sizes"])):
        ch = base // 2 ** (i + 1)
        conv(f"hift.source_downs.{i}", ch, spec, 1 if u == 1 else 2 * u)
        resblock(f"hift.source_resblocks.{i}", ch, k, ds)
    for i in range(len(rates)):
        ch = base // 2 ** (i + 1)
        for j, (k, ds) in enumerate(zip(c["resblock_kernel_sizes"], c["resblock_dilation_sizes"])):
            resblock(f"hift.resblocks.{i * len(c['resblock_kernel_sizes']) + j}", ch, k, ds)
    conv("hift.conv_post", spec, base // 2 ** len(rates), 7)
    f = c["f0_channels"]
    conv("hift.f0_predictor.condnet.0", f, c["f0_in"], 4)
    for i in (2, 4, 6, 8):
        conv(f"hift.f0_predictor.condnet.{i}", f, f, 3)
    linear("hift.f0_predictor.classifier", c["f0_classes"], f)
    return e


def check_tensors(tensors, expected):
    """Every missing, misshapen and unexpected tensor, one line each (empty when all match)."""
    problems = [f"{k}: missing, expected {v}" for k, v in expected.items() if k not in tensors]
    problems += [f"{k}: shape {list(tensors[k].shape)}, expected {v}" for k, v in expected.items()
                 if k in tensors and list(tensors[k].shape) != v]
    problems += [f"{k}: unexpected" for k in sorted(tensors) if k not in expected]
    return problems


def cosyvoice3_noise(c, seconds):
    """The two fixed noise buffers CosyVoice3's constructors draw, replayed from torch's CPU
    generator in upstream's order (cosyvoice3.yaml built top-down by hyperpyyaml, each object's
    arguments first): `CausalConditionalCFM.__init__` seeds 0 and draws `rand_noise`; then
    `CausalMaskedDiffWithDiT.__init__` initialises input_embedding (normal) and
    spk_embed_affine_layer (uniform); then the vocoder's `CausalConvRNNF0Predictor` (five convs and
    the classifier, uniform); then `CausalHiFTGenerator.__init__` builds `SineGen2(causal=True)`,
    which draws `rand_ini` [1, 9] and `sine_waves` [1, 300·24000, 9] (uniform). Returns
    (rand_noise [1, 80, 15000], sine_waves [1, 24000·seconds, 9]); `rand_ini` has no effect on the
    output (its row is never read by the source's interpolation) and is not kept."""
    import torch.nn as nn
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        rand_noise = torch.randn([1, 80, 50 * 300])
        nn.Embedding(c["vocab_size"], c["input_size"])
        nn.Linear(c["spk_embed_dim"], c["output_size"])
        f = c["f0_channels"]
        nn.Conv1d(c["f0_in"], f, 4)
        for _ in range(4):
            nn.Conv1d(f, f, 3)
        nn.Linear(f, c["f0_classes"])
        torch.rand(1, c["nb_harmonics"] + 1)  # rand_ini
        n = c["sampling_rate"] * 300
        keep = min(n, c["sampling_rate"] * seconds)
        sine_waves = torch.rand(1, n, c["nb_harmonics"] + 1)[:, :keep].clone()
    finally:
        torch.random.set_rng_state(state)
    return rand_noise, sine_waves


def f0_predictor_weights_f64(hift):
    """The F0 predictor's weight-normed convolutions folded as upstream evaluates them: the vocoder's
    `inference` moves the predictor to float64 (`self.f0_predictor.to(torch.float64)`), so its
    parametrization computes `torch._weight_norm(v, g, 0)` in float64 on every call. The same call
    here, kept float64 in the safetensors file (voxbatch's weights loader leaves float64 tensors as
    they are), gives the Rust port the reference's weights bit for bit; folded in fp32 they differ by
    ~1e-7, which the source's phase integration turns into ~1e-5 of the waveform. Returns
    {`f0_predictor.condnet.{i}.weight`: float64 tensor} (empty for a predictor without weight norm)."""
    out = {}
    for k, v in hift.items():
        m = re.match(r"(f0_predictor\..*)\.parametrizations\.weight\.original1$", k) or re.match(r"(f0_predictor\..*)\.weight_v$", k)
        if m:
            base = m.group(1)
            g = hift.get(base + ".parametrizations.weight.original0", hift.get(base + ".weight_g"))
            if g is None:
                sys.exit(f"weight norm of {base} is incomplete: no g")
            out[base + ".weight"] = torch._weight_norm(v.double(), g.double(), 0)
    return out


# FSQ tokens CosyVoice3Model treats as silence or breath (cosyvoice/cli/model.py, `silent_tokens`): its
# llm_job keeps at most MAX_SILENT_TOKENS of them in a row in the output (the LM still sees them all).
COSYVOICE3_SILENT_TOKENS = [1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323]
COSYVOICE3_MAX_SILENT_TOKENS = 5
# Output rows of CosyVoice3LM past the speech tokens: sos, eos, task_id, fill, then unused; every one
# of them ends decoding (its stop_token_ids).
COSYVOICE3_EXTRA_ROWS = 200


def cosyvoice3_llm_expected(dims, speech_tokens):
    """{name: shape} of every tensor CosyVoice3LM's llm.safetensors holds: the Qwen2 body under
    llm.pt's names (`llm.model.model.*`), `speech_embedding.weight` (speech tokens + 200 rows: the
    sos and task_id inputs are rows of it) and `llm_decoder.weight` (no bias). No `llm_embedding`."""
    h, kv = dims["hidden"], dims["kv_heads"] * dims["head_dim"]
    rows = speech_tokens + COSYVOICE3_EXTRA_ROWS
    e = {"llm.model.model.embed_tokens.weight": [dims["vocab"], h], "llm.model.model.norm.weight": [h],
         "speech_embedding.weight": [rows, h], "llm_decoder.weight": [rows, h]}
    for i in range(dims["layers"]):
        p = f"llm.model.model.layers.{i}."
        for proj, out in (("q_proj", dims["heads"] * dims["head_dim"]), ("k_proj", kv), ("v_proj", kv)):
            e[p + f"self_attn.{proj}.weight"], e[p + f"self_attn.{proj}.bias"] = [out, h], [out]
        e[p + "self_attn.o_proj.weight"] = [h, dims["heads"] * dims["head_dim"]]
        e[p + "mlp.gate_proj.weight"] = e[p + "mlp.up_proj.weight"] = [dims["intermediate"], h]
        e[p + "mlp.down_proj.weight"] = [h, dims["intermediate"]]
        e[p + "input_layernorm.weight"] = e[p + "post_attention_layernorm.weight"] = [h]
    return e


def convert_cosyvoice3_llm(src, out_dir, yaml_path, llm_file="llm.pt"):
    """llm.pt (or `llm_file`: Fun-CosyVoice3-0.5B also ships llm.rl.pt, its RL-tuned LM) +
    CosyVoice-BlankEN/config.json (+ cosyvoice3.yaml's `llm:` section) -> llm.safetensors; returns the
    [cosyvoice3.llm] keys but for end_of_prompt, or None when the directory has no such file."""
    path = os.path.join(src, llm_file)
    if not os.path.exists(path):
        if llm_file != "llm.pt":
            sys.exit(f"{src} has no {llm_file} (--llm names the LM checkpoint to convert)")
        return None
    dims = qwen2_dims(src)
    llm = read_tagged_yaml(yaml_path).get("llm") or {}
    sampling = llm.get("sampling") or {}
    sd = torch.load(path, map_location="cpu", weights_only=True)
    # lm_head (Qwen2's own output layer) is unused: llm_decoder maps to speech tokens.
    sd = {k: v for k, v in sd.items() if not k.startswith("llm.model.lm_head.")}
    rows = sd.get("speech_embedding.weight", torch.zeros(0)).shape[0]
    speech_tokens = int(llm.get("speech_token_size", rows - COSYVOICE3_EXTRA_ROWS))
    problems = check_tensors(sd, cosyvoice3_llm_expected(dims, speech_tokens))
    if problems:
        sys.exit(f"{path}: not CosyVoice3LM's weights for CosyVoice-BlankEN/config.json and cosyvoice3.yaml "
                 f"(speech_token_size {speech_tokens}; {len(problems)} problem(s)):\n  " + "\n  ".join(problems))
    if int(llm.get("llm_input_size", dims["hidden"])) != dims["hidden"]:
        sys.exit(f"{yaml_path}: llm_input_size {llm['llm_input_size']}, but CosyVoice-BlankEN/config.json's hidden_size is {dims['hidden']}")
    from safetensors.torch import save_file
    save_file({k: v.float().contiguous() for k, v in sd.items()}, os.path.join(out_dir, "llm.safetensors"))
    # ras_sampling's settings from the yaml; the length ratios are CosyVoice3LM.inference's defaults.
    return dict(dims, speech_tokens=speech_tokens, top_p=float(sampling.get("top_p", 0.8)), top_k=int(sampling.get("top_k", 25)),
                win_size=int(sampling.get("win_size", 10)), tau_r=float(sampling.get("tau_r", 0.1)),
                min_token_text_ratio=2.0, max_token_text_ratio=20.0)


def convert_cosyvoice3(args):
    from safetensors.torch import save_file

    src = args.model_dir
    for f in ("flow.pt", "hift.pt"):
        if not os.path.isfile(os.path.join(src, f)):
            sys.exit(f"{src} has no {f}: expected an official CosyVoice3 directory (cosyvoice3.yaml, flow.pt, hift.pt)")
    if not 1 <= args.noise_seconds <= 300:
        sys.exit(f"--noise-seconds {args.noise_seconds}: upstream's buffer holds 1 to 300 seconds")
    c = cosyvoice3_config(os.path.join(src, "cosyvoice3.yaml"))
    flow = torch.load(os.path.join(src, "flow.pt"), map_location="cpu", weights_only=True)
    hift = torch.load(os.path.join(src, "hift.pt"), map_location="cpu", weights_only=True)
    hift = {k.replace("generator.", "", 1) if k.startswith("generator.") else k: v for k, v in hift.items()}
    f0_weights = f0_predictor_weights_f64(hift)
    flow, hift = fold_weight_norm(flow), fold_weight_norm(hift)
    tensors = {f"flow.{k}": v for k, v in flow.items()}
    tensors.update({f"hift.{k}": v for k, v in hift.items()})
    problems = check_tensors(tensors, cosyvoice3_expected(c))
    if problems:
        sys.exit(f"{src}: the weights do not match cosyvoice3.yaml ({len(problems)} problem(s)):\n  " + "\n  ".join(problems))
    tensors = {k: v.float().contiguous() for k, v in tensors.items()}
    tensors.update({f"hift.{k}": v.contiguous() for k, v in f0_weights.items()})
    rand_noise, sine_waves = cosyvoice3_noise(c, args.noise_seconds)
    tensors["flow.rand_noise"] = rand_noise.contiguous()
    tensors["hift.m_source.l_sin_gen.sine_waves"] = sine_waves.contiguous()

    spk_path = os.path.join(src, "spk2info.pt")
    spk2info = torch.load(spk_path, map_location="cpu", weights_only=False) if os.path.isfile(spk_path) else {}
    voices, names, prompt_lens = convert_voices(spk2info)
    if not names:
        print(f"no voices in {spk_path}: none registered (jobs are refused until a voice is added)", file=sys.stderr)
    os.makedirs(args.out_dir, exist_ok=True)
    llm_dims = convert_cosyvoice3_llm(src, args.out_dir, os.path.join(src, "cosyvoice3.yaml"), args.llm)
    tokenizer, token_ids = convert_tokenizer(src, args.out_dir, COSYVOICE3_SPECIAL_TOKENS) if llm_dims else (None, {})
    grammars = copy_grammars(args.out_dir) if tokenizer else None
    whole = bool(llm_dims and tokenizer and grammars)
    if llm_dims and not whole:
        print(f"{src}/{args.llm} converted, but without {'a tokenizer (CosyVoice-BlankEN/vocab.json)' if not tokenizer else 'grammars'} "
              "the model takes speech tokens only (kind cosyvoice3-token2wav)", file=sys.stderr)
    for stale in ([] if llm_dims else ["llm.safetensors"]) + ([] if tokenizer else ["tokenizer.json"]):
        if os.path.exists(os.path.join(args.out_dir, stale)):
            os.remove(os.path.join(args.out_dir, stale))
    prompt_models = copy_prompt_models(src, args.out_dir, ["speech_tokenizer_v3.onnx", "campplus.onnx"])
    save_file(tensors, os.path.join(args.out_dir, "token2wav.safetensors"))
    save_file(voices, os.path.join(args.out_dir, "voices.safetensors"))
    name = args.name or os.path.basename(os.path.abspath(args.out_dir))
    kind = "cosyvoice3" if whole else "cosyvoice3-token2wav"
    description = ("CosyVoice3 text to speech (LLM + DiT flow matching + causal HiFT), converted" if whole
                   else "CosyVoice3 token2wav (DiT flow matching + causal HiFT), converted")
    dims = {k: c[k] for k in ("vocab_size", "pre_lookahead_len", "pre_lookahead_channels", "dit_dim", "dit_depth",
                              "dit_heads", "dit_head_dim", "dit_ff_mult", "hift_channels", "f0_channels",
                              "conv_pre_look_right")}
    dims.update(flow_steps=10, cfg_rate=c["cfg_rate"], noise_samples=sine_waves.shape[1])
    with open(os.path.join(args.out_dir, "model.toml"), "w") as f:
        f.write(f'''# Written by tools/convert_cosyvoice.py from {os.path.abspath(src)}.
name = {json.dumps(name)}
kind = "{kind}"
description = "{description}"
sample_rate = 24000
# 25 Hz speech tokens, 50 Hz mel frames, 480 samples per frame.
frames_per_token = 2
samples_per_frame = 480
voices = {json.dumps(names)}
# Tokens each voice's prompt adds to a job (the batch policy counts them).
voice_prompt_tokens = {json.dumps(prompt_lens)}

[tokenizer]
kind = "speech_tokens"
vocab_size = {c["vocab_size"]}

[signature]
inputs = ["speech_tokens:int64[B,T]"]
outputs = ["audio:float32[B,S]"]

# From cosyvoice3.yaml (checked against the weights). noise_samples: rows of the causal source's
# fixed noise (hift.m_source.l_sin_gen.sine_waves), so the longest item is noise_samples / 480 frames.
[cosyvoice3]
''')
        for k, v in dims.items():
            f.write(f"{k} = {json.dumps(v)}\n")
        if whole:
            end_of_prompt = token_ids.get("<|endofprompt|>")
            llm_dims.update(end_of_prompt=end_of_prompt, silent_tokens=COSYVOICE3_SILENT_TOKENS,
                            max_silent_tokens=COSYVOICE3_MAX_SILENT_TOKENS)
            f.write("\n# CosyVoice3LM (llm.safetensors): Qwen2 dimensions from CosyVoice-BlankEN/config.json, ras_sampling's\n"
                    "# settings from cosyvoice3.yaml, the reference's length ratios. Outputs: speech_tokens + 200 rows, every\n"
                    "# id from speech_tokens on ends decoding. end_of_prompt: tokenizer.json's id of <|endofprompt|>, which\n"
                    "# the text must hold (151646 in the released model). silent_tokens: at most max_silent_tokens of\n"
                    "# them in a row are kept in the output (CosyVoice3Model.llm_job).\n[cosyvoice3.llm]\n")
            for k, v in llm_dims.items():
                f.write(f"{k} = {json.dumps(v)}\n")
    print(json.dumps({"out": args.out_dir, "kind": kind, "tensors": len(tensors), "voices": names, "tokenizer": tokenizer,
                      "grammars": grammars, "prompt_models": prompt_models, **dims}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--name", default=None, help="model name in the manifest (default: the output folder's name)")
    ap.add_argument("--llm", default="llm.pt",
                    help="CosyVoice3: the LM checkpoint of the directory to convert (llm.pt; Fun-CosyVoice3-0.5B's "
                         "RL-tuned one is llm.rl.pt)")
    ap.add_argument("--noise-seconds", type=int, default=300,
                    help="CosyVoice3: seconds of the causal source's fixed noise kept (upstream's buffer: 300); "
                         "the longest item the model can vocode")
    args = ap.parse_args()
    if os.path.isfile(os.path.join(args.model_dir, "cosyvoice3.yaml")):
        return convert_cosyvoice3(args)
    from safetensors.torch import save_file

    src = args.model_dir
    for f in ("flow.pt", "hift.pt"):
        if not os.path.isfile(os.path.join(src, f)):
            sys.exit(f"{src} has no {f}: expected an official CosyVoice2 directory (flow.pt, hift.pt, spk2info.pt, cosyvoice2.yaml)")
    flow = torch.load(os.path.join(src, "flow.pt"), map_location="cpu", weights_only=True)
    hift = torch.load(os.path.join(src, "hift.pt"), map_location="cpu", weights_only=True)
    hift = {k.replace("generator.", "", 1) if k.startswith("generator.") else k: v for k, v in hift.items()}
    flow, hift = fold_weight_norm(flow), fold_weight_norm(hift)
    yaml_path = os.path.join(src, "cosyvoice2.yaml")
    yaml = open(yaml_path).read() if os.path.isfile(yaml_path) else ""

    try:
        dims = {
            "vocab_size": flow["input_embedding.weight"].shape[0],
            "encoder_heads": flow["encoder.encoders.0.self_attn.pos_bias_u"].shape[0],
            "encoder_units": flow["encoder.encoders.0.feed_forward.w_1.weight"].shape[0],
            "encoder_blocks": count(flow, "encoder.encoders."),
            "encoder_up_blocks": count(flow, "encoder.up_encoders."),
            "decoder_channels": flow["decoder.estimator.down_blocks.0.0.block1.block.0.weight"].shape[0],
            "decoder_blocks": count(flow, "decoder.estimator.down_blocks.0.1."),
            "decoder_mid_blocks": count(flow, "decoder.estimator.mid_blocks."),
            # Heads and head width are not recoverable from the weights alone.
            "decoder_heads": yaml_int(yaml, "num_heads", 8),
            "decoder_head_dim": yaml_int(yaml, "attention_head_dim", 64),
            "hift_channels": hift["conv_pre.weight"].shape[0],
            "f0_channels": hift["f0_predictor.condnet.0.weight"].shape[0],
        }
    except KeyError as e:
        sys.exit(f"not a CosyVoice2 flow/hift: tensor {e} is missing")
    inner = flow["decoder.estimator.down_blocks.0.1.0.attn1.to_q.weight"].shape[0]
    if dims["decoder_heads"] * dims["decoder_head_dim"] != inner:
        sys.exit(f"cosyvoice2.yaml says {dims['decoder_heads']} heads x {dims['decoder_head_dim']}, but the "
                 f"estimator's attention is {inner} wide")

    tensors = {f"flow.{k}": v.float().contiguous() for k, v in flow.items() if v.is_floating_point()}
    tensors.update({f"hift.{k}": v.float().contiguous() for k, v in hift.items() if v.is_floating_point()})
    # CausalConditionalCFM draws its noise once, seeded 0, in its constructor.
    torch.manual_seed(0)
    tensors["flow.rand_noise"] = torch.randn([1, 80, 50 * 300]).contiguous()

    spk_path = os.path.join(src, "spk2info.pt")
    spk2info = torch.load(spk_path, map_location="cpu", weights_only=False) if os.path.isfile(spk_path) else {}
    voices, names, prompt_lens = convert_voices(spk2info)
    if not names:
        # No silent zero-vector voice: a model without voices refuses jobs until one is added.
        print(f"no voices in {spk_path}: none registered (jobs are refused until a voice is added)", file=sys.stderr)

    os.makedirs(args.out_dir, exist_ok=True)
    llm_dims = convert_llm(src, args.out_dir)
    tokenizer, _ = convert_tokenizer(src, args.out_dir)
    grammars = copy_grammars(args.out_dir) if tokenizer else None
    prompt_models = copy_prompt_models(src, args.out_dir)
    save_file(tensors, os.path.join(args.out_dir, "token2wav.safetensors"))
    save_file(voices, os.path.join(args.out_dir, "voices.safetensors"))
    name = args.name or os.path.basename(os.path.abspath(args.out_dir))
    whole = bool(llm_dims and tokenizer and grammars)
    kind = "cosyvoice2" if whole else "cosyvoice2-token2wav"
    description = ("CosyVoice2 text to speech (LLM + flow matching + HiFT), converted" if whole
                   else "CosyVoice2 token2wav (flow matching + HiFT), converted")
    with open(os.path.join(args.out_dir, "model.toml"), "w") as f:
        f.write(f'''# Written by tools/convert_cosyvoice.py from {os.path.abspath(src)}.
name = {json.dumps(name)}
kind = "{kind}"
description = "{description}"
sample_rate = 24000
# 25 Hz speech tokens, 50 Hz mel frames, 480 samples per frame.
frames_per_token = 2
samples_per_frame = 480
voices = {json.dumps(names)}
# Tokens each voice's prompt adds to a job (the batch policy counts them).
voice_prompt_tokens = {json.dumps(prompt_lens)}

[tokenizer]
kind = "speech_tokens"
vocab_size = {dims["vocab_size"]}

[signature]
inputs = ["speech_tokens:int64[B,T]"]
outputs = ["audio:float32[B,S]"]

[cosyvoice2]
''')
        for k, v in dims.items():
            f.write(f"{k} = {v}\n")
        f.write("flow_steps = 10\ncfg_rate = 0.7\n")
        f.write("# The HiFT vocoder's precision whatever --precision: tf32 is how the official code runs it (outside\n"
                "# autocast, cuDNN convolutions in TF32; fp32 on a CPU); fp32 (TF32 off), bf16, fp16. STFT/iSTFT are fp32.\n"
                'vocoder_precision = "tf32"\n')
        if llm_dims:
            f.write("\n# The speech-token LM (llm.safetensors): Qwen2 dimensions from CosyVoice-BlankEN/config.json,\n"
                    "# sampling as cosyvoice2.yaml (ras_sampling) and the reference's length ratios.\n[cosyvoice2.llm]\n")
            for k, v in llm_dims.items():
                f.write(f"{k} = {json.dumps(v)}\n")
    print(json.dumps({"out": args.out_dir, "kind": kind, "tensors": len(tensors), "voices": names, "tokenizer": tokenizer, "grammars": grammars,
                      "prompt_models": prompt_models, **dims}))


if __name__ == "__main__":
    main()
