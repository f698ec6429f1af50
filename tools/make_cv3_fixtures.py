#!/usr/bin/env python3
"""Parity fixtures for voxbatch's CosyVoice3 token2wav port (issue 43): the DiT flow and the causal
HiFT of Fun-CosyVoice3-0.5B, built with the reference classes, random weights from a fixed seed.

The reference is the public repository FunAudioLLM/CosyVoice with its Matcha-TTS submodule at the
commit it pins (no PyPI package ships CosyVoice3). Nothing of it is committed: give its checkout
as --snapshot. Regenerate the committed tiny set with

  git clone <FunAudioLLM/CosyVoice> .run/cv3-ref/CosyVoice   # Matcha-TTS at third_party/Matcha-TTS,
                                                              # the commit `git ls-tree HEAD third_party` names
  pip install --target .run/cv3-site --no-deps x-transformers==2.11.24 loguru einx frozendict \\
      HyperPyYAML==1.2.3 ruamel.yaml==0.17.40
  .venv/bin/python tools/make_cv3_fixtures.py --snapshot .run/cv3-ref/CosyVoice --config tiny \\
      --out tests/data/cosyvoice3

(the project venv has torch, einops, omegaconf, diffusers, conformer, scipy, onnxruntime,
torchaudio; what the export path does not need — the LLM, the CLI, the dataset processors, the
tokenizer, the GAN losses, lightning/hydra behind matcha's package init — is stubbed out of
sys.modules). The fixtures of the committed set were made from CosyVoice
ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 (2026-03-16) and Matcha-TTS
dd9105b34bf2be2230f4aa1e4769fb586a3c824e; each file's metadata names the commits it came from.

Written (each safetensors file's metadata key `about` holds a JSON object: the stage, the
reference commits, the command that regenerates it, and its paragraph below as `tensors`):
  OUT/official/           an official-shaped model directory: cosyvoice3.yaml (the snapshot's
                          examples/libritts/cosyvoice3/conf/cosyvoice3.yaml, dimensions replaced
                          for --config tiny, the LLM's too: its llm.pt and CosyVoice-BlankEN/ are
                          tools/make_cv3_llm_fixtures.py's, run after this), flow.pt and hift.pt (state dicts as the reference
                          modules hold them: weight norm as parametrizations, fp32), spk2info.pt
                          (voice0: an x-vector only; voice1: a zero-shot prompt);
  OUT/parity-<stage>.safetensors   per stage, inputs and reference outputs (below), fp32 / int64;
  OUT/parity.json         items, lengths, the config, the commits, measured batch-vs-alone gaps.

The model is built exactly as upstream's CosyVoice3 builds it — load_hyperpyyaml over the yaml
(its `llm:` overridden to None) — so the fixed noise buffers its constructors draw are upstream's;
the tool checks that tools/convert_cosyvoice.py's `cosyvoice3_noise` replays them bit for bit.
Every item runs the way the official code runs one (batch 1, fp32, CPU, `streaming=False`,
`finalize=True`: the non-streaming, padding-only mask). Upstream's reduced-precision run
(`CosyVoice3(fp16=True)`) puts `flow.inference` AND `hift.inference` under
`torch.cuda.amp.autocast(fp16)` (CosyVoice3Model.token2wav, unlike CosyVoice2 whose HiFT runs
outside autocast); the F0 predictor is moved to float64 there and fed float64, which autocast
leaves alone. These fixtures are fp32.

Items (speech tokens, prompt tokens): ITEMS below, different lengths, one without a prompt. Names:
`item{i}.` per item alone (as the reference runs it), `batch.` the reference classes on a right-
padded batch of those items where they accept one. Tensors (T = mel frames of an item with its
prompt = 2·(prompt + tokens), Tp = 2·prompt, Tg = T − Tp, L = 480·Tg samples):

parity-prelookahead.safetensors  (input_embedding → PreLookaheadLayer → repeat ×2)
  item{i}.token        [P+N] i64   prompt tokens then speech tokens (the flow's concatenation)
  item{i}.embedded     [P+N, 80]   input_embedding(token) (× the all-ones length mask)
  item{i}.pre          [P+N, 80]   PreLookaheadLayer output (conv1 k=4 looking 3 ahead, leaky ReLU,
                                   conv2 k=3 causal, + input)
  item{i}.mu           [80, T]     pre repeated ×2 along time, channels first: the CFM's `mu`
  batch.embedded       [B, Nmax, 80]   items right-padded with zero rows
  batch.pre            [B, Nmax, 80]   PreLookaheadLayer on it (rows past an item's end: padding)
parity-dit.safetensors  (one estimator call, the DiT, at Euler step DIT_STEP)
  item{i}.x, .mu, .cond   [2, 80, T]  row 0 conditioned, row 1 the CFG row (mu, spks, cond zero)
  item{i}.mask         [2, 1, T]   ones
  item{i}.t            [2]         the step's time (both rows)
  item{i}.spks         [2, 80]     row 0 the projected x-vector, row 1 zeros
  item{i}.out          [2, 80, T]  DiT(x, mask, mu, t, spks, cond) as the CFM calls it (CFG-doubled)
  item{i}.out_single   [1, 80, T]  DiT on row 0 alone (no CFG doubling)
  batch.out            [2B, 80, Tmax]  DiT on the padded CFG batch: rows [cond item 0..B-1, CFG item
                                   0..B-1] (torch.split order of solve_euler), each item's row of the
                                   above zero-padded to Tmax (x, mu, cond zeros; mask 0 past its end)
  batch.out_single     [B, 80, Tmax]   DiT on the padded rows 0 only
parity-euler.safetensors  (CausalConditionalCFM.forward: 10 Euler steps, cosine t, CFG 0.7)
  noise                [80, Tmax]  flow.rand_noise[0, :, :Tmax]: each item starts from its first T columns
  item{i}.mu, .cond    [80, T]     as above (cond: prompt mel in its first Tp frames, zeros after)
  item{i}.spks         [80]        spk_embed_affine_layer(normalize(embedding))
  item{i}.out          [80, T]     the CFM's output (prompt frames included; the flow cuts them)
parity-hift.safetensors  (CausalHiFTGenerator.inference, finalize=True)
  item{i}.mel          [80, Tg]    the vocoder's input (the flow's output)
  item{i}.f0           [Tg]        F0 predictor output (run in float64, cast to fp32 as upstream does)
  item{i}.source       [L]         the harmonic source after l_linear + tanh (`s`)
  item{i}.wav          [L]         the waveform (clamped to ±0.99)
  speed.mel            [80, ⌊Tg0/SPEED⌋]  item 0's mel stretched as upstream's `speed` does
                                   (F.interpolate linear, align_corners False), SPEED in the metadata
  speed.wav            [480·⌊Tg0/SPEED⌋]  the vocoder on it
  batch.mel            [B, 80, Tgmax]  mels right-padded with zeros
  batch.wav            [B, 480·Tgmax]  the reference on it: an item's samples equal its alone `wav`
                                   except at most its last 63 (the source STFT's reflect padding
                                   and the iSTFT's frames past its end; parity.json
                                   `hift_batch_vs_alone`; `hift_batch_fixed_vs_alone` is the same
                                   batch with both edges taken per item, `batched_as_alone` below)
parity-token2wav.safetensors  (the whole: flow.inference then hift.inference, as CosyVoice3Model.token2wav)
  item{i}.token [N] i64, .prompt_token [P] i64, .prompt_feat [Tp, 80], .embedding [192]
  item{i}.mel          [80, Tg]    the flow's output;   item{i}.wav [L] the waveform
The fixed noise of the vocoder (hift.m_source.l_sin_gen.sine_waves, [1, 7.2e6, 9]) is not in the
fixtures: the converted model has it (tools/convert_cosyvoice.py), checked here against the reference.

Usage: make_cv3_fixtures.py --snapshot DIR --out DIR [--config tiny|full] [--seed N] [--site DIR] [--no-fixtures]
"""
import argparse
import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_cosyvoice  # noqa: E402
import make_llm_fixtures  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAML = "examples/libritts/cosyvoice3/conf/cosyvoice3.yaml"

# Keys of the yaml replaced for each config (each occurs once as `key: N`, at the top level or in a section).
CONFIGS = {
    "full": {},  # upstream's: vocab 6561, DiT 1024 × 22 layers, 16 heads of 64, ff ×2, HiFT 512 channels
    # Same architecture, small: DiT 48 wide, 2 layers, 2 heads of 24 (rotary on the first 24 of the 48
    # query/key channels, as the full model's on 64 of 1024); pre-lookahead 32 channels; HiFT 16 base
    # channels (8, 4, 2 per stage), F0 predictor 16. The official directory is 0.9 MB.
    # The LLM (tools/make_cv3_llm_fixtures.py): CosyVoice2's tiny Qwen2 (make_llm_fixtures.DIMS), 32 wide,
    # over the same 64 speech tokens.
    "tiny": {"vocab_size": 64, "channels": 32, "dim": 48, "depth": 2, "heads": 2, "dim_head": 24,
             "base_channels": 16, "cond_channels": 16, "llm_input_size": make_llm_fixtures.DIMS["hidden"],
             "llm_output_size": make_llm_fixtures.DIMS["hidden"], "speech_token_size": make_llm_fixtures.DIMS["speech_tokens"]},
}
# (speech tokens, prompt tokens) per item.
ITEMS = {"tiny": [(6, 2), (3, 0), (8, 2)], "full": [(30, 6), (17, 0), (41, 8)]}
DIT_STEP = 3  # which of the 10 estimator calls parity-dit records (t = 1 − cos(3π/20) ≈ 0.109)
SPEED = 1.25
# Modules of the snapshot the export path never calls, replaced by stubs (their imports pull in
# transformers, whisper, pyarrow, lightning, hydra, …).
STUBBED = {
    "lightning", "lightning.pytorch", "lightning.pytorch.utilities",
    "cosyvoice.dataset", "cosyvoice.dataset.processor", "cosyvoice.tokenizer", "cosyvoice.tokenizer.tokenizer",
    "cosyvoice.llm", "cosyvoice.llm.llm", "cosyvoice.cli", "cosyvoice.cli.model", "cosyvoice.utils.class_utils",
    "cosyvoice.hifigan.hifigan", "cosyvoice.hifigan.discriminator", "matcha.hifigan", "matcha.hifigan.models",
    "matcha.utils.audio", "matcha.utils.instantiators", "matcha.utils.logging_utils", "matcha.utils.rich_utils",
    "matcha.utils.utils",
}


class _Stub:
    def __init__(self, *args, **kwargs):
        pass


def _stub_function(*args, **kwargs):
    return None


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of `stubbed` with empty modules whose every attribute is a stub (a class for
    capitalised names, so hyperpyyaml's `!new:` accepts it; a function otherwise)."""

    def __init__(self, stubbed):
        self.stubbed = set(stubbed)

    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in self.stubbed else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            if name == "rank_zero_only":
                return lambda f: f
            return _Stub if name[:1].isupper() else _stub_function
        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


def git_head(path):
    """`path`'s commit and date: git's, or a copy's REFERENCE_COMMIT file (scripts/device/pack.sh
    cv3 writes one beside the files it packs, which carry no .git)."""
    try:
        out = subprocess.run(["git", "-C", path, "log", "-1", "--format=%H %cs"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        try:
            with open(os.path.join(path, "REFERENCE_COMMIT")) as f:
                return f.read().strip()
        except OSError:
            return "unknown"


def use_snapshot(snapshot, site, stubbed):
    """Puts a FunAudioLLM/CosyVoice checkout (with third_party/Matcha-TTS) first on sys.path, then
    `site` (a --target directory) when it exists, and answers imports of `stubbed` with stubs.
    Returns (snapshot, matcha) as absolute paths."""
    snapshot = os.path.abspath(snapshot)
    matcha = os.path.join(snapshot, "third_party", "Matcha-TTS")
    if not os.path.isfile(os.path.join(snapshot, "cosyvoice", "flow", "DiT", "dit.py")):
        sys.exit(f"{snapshot} is not a CosyVoice checkout with CosyVoice3 (no cosyvoice/flow/DiT/dit.py)")
    if not os.path.isdir(os.path.join(matcha, "matcha")):
        sys.exit(f"{matcha} is empty: check out the Matcha-TTS submodule at the commit `git ls-tree HEAD third_party` names")
    sys.path[:0] = [snapshot, matcha] + ([site] if site and os.path.isdir(site) else [])
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(stubbed))
    return snapshot, matcha


def import_reference(snapshot, site=None):
    """Imports the CosyVoice3 token2wav classes of a FunAudioLLM/CosyVoice checkout (with
    third_party/Matcha-TTS) without its LLM/CLI/training dependencies; `site` is a --target
    directory holding x-transformers and hyperpyyaml (default .run/cv3-site when it exists)."""
    site = site or os.path.join(REPO, ".run", "cv3-site")
    snapshot, matcha = use_snapshot(snapshot, site, STUBBED)
    try:
        from hyperpyyaml import load_hyperpyyaml
        from cosyvoice.flow.DiT.dit import DiT
        from cosyvoice.flow.flow import CausalMaskedDiffWithDiT
        from cosyvoice.flow.flow_matching import CausalConditionalCFM
        from cosyvoice.hifigan.f0_predictor import CausalConvRNNF0Predictor
        from cosyvoice.hifigan.generator import CausalHiFTGenerator
        from cosyvoice.transformer.upsample_encoder import PreLookaheadLayer
    except ImportError as e:
        sys.exit(f"cannot import the CosyVoice3 reference ({e}); pip install --target {site} --no-deps "
                 "x-transformers==2.11.24 loguru einx frozendict HyperPyYAML==1.2.3 ruamel.yaml==0.17.40")
    return types.SimpleNamespace(snapshot=snapshot, commit=git_head(snapshot), matcha_commit=git_head(matcha), **{
        k: v for k, v in locals().items() if k[0].isupper() or k == "load_hyperpyyaml"})


def official_yaml(ref, config):
    """The snapshot's cosyvoice3.yaml with `config`'s dimensions put in."""
    with open(os.path.join(ref.snapshot, YAML)) as f:
        text = f.read()
    for key, value in CONFIGS[config].items():
        text, n = re.subn(rf"^([ \t]*){key}: \d+[ \t]*$", rf"\g<1>{key}: {value}", text, flags=re.M)
        if n != 1:
            sys.exit(f"{YAML}: expected one `{key}: N`, found {n} (has the upstream config changed?)")
    head = (f"# Written by tools/make_cv3_fixtures.py --config {config} (random weights) from FunAudioLLM/CosyVoice\n"
            f"# {ref.commit} {YAML}" + (f", with {CONFIGS[config]}" if CONFIGS[config] else "") + ".\n")
    return head + text


def build(ref, yaml_text):
    """(flow, hift) as CosyVoice3 builds them: load_hyperpyyaml over the whole config, top-down
    (the seeds it applies and the constructors' own draws in upstream's order); the LLM is not built."""
    configs = ref.load_hyperpyyaml(yaml_text, overrides={"llm": None})
    return configs["flow"].eval(), configs["hift"].eval()


def randomise(module, gen):
    """Moves every parameter off its initial value so each one is exercised (as make_parity_fixtures.py)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("alpha") or name.endswith("original0"):
                p.copy_(p.abs().clamp(min=0.5) * (1 + 0.1 * noise).abs())  # scales stay positive
            elif p.dim() == 1:
                p.add_(0.05 * noise)
            else:
                p.mul_(1 + 0.1 * noise)


def record_calls(module, store):
    """Appends (args, output) of each call of `module` to `store`, cloned (the CFM reuses its buffers)."""
    keep = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return module.register_forward_hook(lambda _m, args, out: store.append((tuple(keep(a) for a in args), keep(out))))


def metadata(ref, args, stage, description):
    """The file's header: one key, `about`, a JSON object (one key keeps the header's bytes the same
    from run to run: safetensors writes several in hash order)."""
    about = {"stage": stage, "config": args.config, "seed": args.seed,
             "reference": f"FunAudioLLM/CosyVoice {ref.commit}; Matcha-TTS {ref.matcha_commit}",
             "regenerate": f"tools/make_cv3_fixtures.py --snapshot <CosyVoice checkout> --config {args.config} "
                           f"--seed {args.seed} --out <dir>",
             "tensors": description, "speed": SPEED, "dit_step": DIT_STEP}
    return {"about": json.dumps(about, indent=1, sort_keys=True, ensure_ascii=False)}


def stage_doc(stage):
    """The docstring's paragraph for `stage` (what each tensor of the file is)."""
    part = __doc__.split(f"parity-{stage}.safetensors", 1)[1]
    return re.split(r"\nparity-|\nThe fixed noise", part, maxsplit=1)[0].strip()


def batched_as_alone(hift, mel, frames):
    """The reference vocoder's layers on a zero-padded batch `mel` [B, 80, Tmax] with the two edges
    that make a padded item differ from itself alone taken per item: the source STFT reads each
    item's own reflection past its end (torch.stft's center padding, s[L+k] = s[L−2−k]), and each
    item's iSTFT covers only its own 120·frames+1 frames (overlap-add and window envelope). Every
    other layer after conv_pre pads on the left only. Returns one waveform per item."""
    hift.f0_predictor.to(torch.float64)
    f0 = hift.f0_predictor(mel.to(torch.float64), finalize=True).to(mel)
    s, _, _ = hift.m_source(hift.f0_upsamp(f0[:, None]).transpose(1, 2))
    s = s.transpose(1, 2).squeeze(1).clone()
    for i, n in enumerate(frames):
        end = 480 * n
        if end < s.shape[1]:
            s[i, end:end + 8] = s[i, end - 9:end - 1].flip(0)
    re_, im_ = hift._stft(s)
    s_stft = torch.cat([re_, im_], dim=1)
    x = hift.conv_pre(mel)
    for i in range(hift.num_upsamples):
        x = hift.ups[i](F.leaky_relu(x, hift.lrelu_slope))
        if i == hift.num_upsamples - 1:
            x = hift.reflection_pad(x)
        x = x + hift.source_resblocks[i](hift.source_downs[i](s_stft))
        x = sum(hift.resblocks[i * hift.num_kernels + j](x) for j in range(hift.num_kernels)) / hift.num_kernels
    x = hift.conv_post(F.leaky_relu(x))
    half = hift.istft_params["n_fft"] // 2 + 1
    mag, phase = torch.exp(x[:, :half]), torch.sin(x[:, half:])
    return [hift._istft(mag[i:i + 1, :, :120 * n + 1], phase[i:i + 1, :, :120 * n + 1])[0].clamp(-hift.audio_limit, hift.audio_limit)
            for i, n in enumerate(frames)]


def pad_to(t, length, dim):
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, length - t.shape[dim]]
    return F.pad(t, pad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshot", required=True, help="a FunAudioLLM/CosyVoice checkout with third_party/Matcha-TTS")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--site", default=None, help="where x-transformers and hyperpyyaml are (default .run/cv3-site)")
    ap.add_argument("--no-fixtures", action="store_true", help="write only the official directory (for benches)")
    args = ap.parse_args()
    from safetensors.torch import save_file

    ref = import_reference(args.snapshot, args.site)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    yaml_text = official_yaml(ref, args.config)
    official = os.path.join(args.out, "official")
    os.makedirs(official, exist_ok=True)
    yaml_path = os.path.join(official, "cosyvoice3.yaml")
    with open(yaml_path, "w") as f:
        f.write(yaml_text)
    flow, hift = build(ref, yaml_text)

    # The converter's replay of the constructors' noise must be the reference's own.
    c = convert_cosyvoice.cosyvoice3_config(yaml_path)
    rand_noise, sine_waves = convert_cosyvoice.cosyvoice3_noise(c, 300)
    if not (torch.equal(rand_noise, flow.decoder.rand_noise) and torch.equal(sine_waves, hift.m_source.l_sin_gen.sine_waves)):
        sys.exit("convert_cosyvoice.cosyvoice3_noise does not replay the reference's noise buffers: fix it before converting")
    del sine_waves

    gen = torch.Generator().manual_seed(args.seed)
    randomise(flow, gen)
    randomise(hift, gen)
    with torch.no_grad():
        # F0 of tens to hundreds of Hz, crossing the 10 Hz voicing threshold now and then, so that both the
        # voiced (harmonic) and unvoiced (noise) branches of the source are exercised.
        cls = hift.f0_predictor.classifier
        cls.weight.mul_(1000.0 / (cls.weight.norm() + 1e-6))
        cls.bias.fill_(30.0)
        # Log-magnitudes lowered so that the waveform is mostly below the ±0.99 clamp (random weights
        # would clip most samples, hiding differences).
        hift.conv_post.bias[: c["n_fft"] // 2 + 1] -= float(os.environ.get("CV3_MAG_SHIFT", "2"))
    # Saved before any inference: hift.inference moves the F0 predictor to float64 for good.
    torch.save(flow.state_dict(), os.path.join(official, "flow.pt"))
    torch.save(hift.state_dict(), os.path.join(official, "hift.pt"))
    vocab = c["vocab_size"]
    voices = {"voice0": {"embedding": torch.randn(1, 192, generator=gen)}}
    n = 4
    voices["voice1"] = {
        "flow_embedding": torch.randn(1, 192, generator=gen), "llm_embedding": torch.randn(1, 192, generator=gen),
        "flow_prompt_speech_token": torch.randint(0, vocab, (1, n), generator=gen),
        "flow_prompt_speech_token_len": torch.tensor([n]),
        "prompt_speech_feat": torch.randn(1, 2 * n, 80, generator=gen), "prompt_speech_feat_len": torch.tensor([2 * n]),
        "prompt_text": torch.randint(3, 200, (1, 8), generator=gen), "prompt_text_len": torch.tensor([8]),
    }
    voices["voice1"]["llm_prompt_speech_token"] = voices["voice1"]["flow_prompt_speech_token"]
    voices["voice1"]["llm_prompt_speech_token_len"] = torch.tensor([n])
    torch.save(voices, os.path.join(official, "spk2info.pt"))
    if args.no_fixtures:
        return

    items = ITEMS[args.config]
    B = len(items)
    out = {s: {} for s in ("prelookahead", "dit", "euler", "hift", "token2wav")}
    meta = {"config": args.config, "seed": args.seed, "reference": ref.commit, "matcha": ref.matcha_commit,
            "dit_step": DIT_STEP, "speed": SPEED, "items": []}
    est = flow.decoder.estimator
    recorded = []
    for i, (n_tok, n_prompt) in enumerate(items):
        token = torch.randint(0, vocab, (1, n_tok), generator=gen)
        prompt_token = torch.randint(0, vocab, (1, n_prompt), generator=gen)
        prompt_feat = torch.randn(1, 2 * n_prompt, 80, generator=gen)
        embedding = torch.randn(1, 192, generator=gen)
        pre_calls, est_calls, cfm_calls, f0_calls, src_calls = [], [], [], [], []
        hooks = [record_calls(flow.pre_lookahead_layer, pre_calls), record_calls(est, est_calls),
                 record_calls(flow.decoder, cfm_calls), record_calls(hift.f0_predictor, f0_calls)]
        with torch.inference_mode():
            mel, _ = flow.inference(token=token, token_len=torch.tensor([n_tok]), prompt_token=prompt_token,
                                    prompt_token_len=torch.tensor([n_prompt]), prompt_feat=prompt_feat,
                                    prompt_feat_len=torch.tensor([2 * n_prompt]), embedding=embedding,
                                    streaming=False, finalize=True)
            wav, source = hift.inference(speech_feat=mel, finalize=True)
            # Upstream's `speed`: the flow's mel stretched before the vocoder (item 0 only).
            if i == 0:
                speed_mel = F.interpolate(mel, size=int(mel.shape[2] / SPEED), mode="linear")
                speed_wav, _ = hift.inference(speech_feat=speed_mel, finalize=True)
        for h in hooks:
            h.remove()
        assert len(est_calls) == 10 and len(pre_calls) == 1 and len(cfm_calls) == 1, (len(est_calls), len(pre_calls))
        (embedded,), pre = pre_calls[0]
        (x, mask, mu, t, spks, cond), dit_out = est_calls[DIT_STEP]
        with torch.inference_mode():
            out_single = est(x[:1], mask[:1], mu[:1], t[:1], spks[:1], cond[:1])
        euler_out = cfm_calls[0][1][0]
        f0 = f0_calls[0][1].float()
        T, Tg = mu.shape[2], mel.shape[2]
        assert T == 2 * (n_tok + n_prompt) and Tg == 2 * n_tok and wav.shape[1] == 480 * Tg
        p = f"item{i}."
        tok_all = torch.cat([prompt_token, token], 1)[0]
        out["prelookahead"].update({p + "token": tok_all, p + "embedded": embedded[0], p + "pre": pre[0], p + "mu": mu[0]})
        out["dit"].update({p + "x": x, p + "mask": mask, p + "mu": mu, p + "t": t, p + "spks": spks, p + "cond": cond,
                           p + "out": dit_out, p + "out_single": out_single})
        out["euler"].update({p + "mu": mu[0], p + "cond": cond[0], p + "spks": spks[0], p + "out": euler_out[0]})
        out["hift"].update({p + "mel": mel[0], p + "f0": f0[0], p + "source": source[0, 0], p + "wav": wav[0]})
        out["token2wav"].update({p + "token": token[0], p + "prompt_token": prompt_token[0], p + "prompt_feat": prompt_feat[0],
                                 p + "embedding": embedding[0], p + "mel": mel[0], p + "wav": wav[0]})
        if i == 0:
            out["hift"].update({"speed.mel": speed_mel[0], "speed.wav": speed_wav[0]})
        recorded.append(dict(embedded=embedded[0], x=x, mask=mask, mu=mu, t=t, spks=spks, cond=cond, mel=mel[0]))
        meta["items"].append({"tokens": n_tok, "prompt_tokens": n_prompt, "mel_frames": T, "generated_frames": Tg,
                              "samples": wav.shape[1], "t_dit": float(t[0]),
                              "voiced_fraction": float((f0 > 10).float().mean()),
                              "clipped_fraction": float((wav.abs() >= 0.99).float().mean())})
    out["euler"]["noise"] = flow.decoder.rand_noise[0, :, :max(r["mu"].shape[2] for r in recorded)].clone()

    # The padded batches, where the reference classes take one.
    n_max = max(r["embedded"].shape[0] for r in recorded)
    t_max = max(r["mu"].shape[2] for r in recorded)
    tg_max = max(r["mel"].shape[1] for r in recorded)
    gaps = {}
    with torch.inference_mode():
        emb = torch.stack([pad_to(r["embedded"], n_max, 0) for r in recorded])
        pre_b = flow.pre_lookahead_layer(emb)
        out["prelookahead"].update({"batch.embedded": emb, "batch.pre": pre_b})
        gaps["prelookahead_batch_vs_alone"] = max(
            float((pre_b[i, :r["embedded"].shape[0]] - out["prelookahead"][f"item{i}.pre"]).abs().max()) for i, r in enumerate(recorded))
        rows = [(r, 0) for r in recorded] + [(r, 1) for r in recorded]
        padded = {k: torch.stack([pad_to(r[k][j], t_max, -1) for r, j in rows]) for k in ("x", "mask", "mu", "cond")}
        spks_b, t_b = torch.stack([r["spks"][j] for r, j in rows]), torch.stack([r["t"][j] for r, j in rows])
        dit_b = est(padded["x"], padded["mask"], padded["mu"], t_b, spks_b, padded["cond"])
        dit_b1 = est(padded["x"][:B], padded["mask"][:B], padded["mu"][:B], t_b[:B], spks_b[:B], padded["cond"][:B])
        out["dit"].update({"batch.out": dit_b, "batch.out_single": dit_b1})
        gaps["dit_batch_vs_alone"] = max(
            max(float((dit_b[j * B + i, :, :r["mu"].shape[2]] - out["dit"][f"item{i}.out"][j]).abs().max()) for j in (0, 1))
            for i, r in enumerate(recorded))
        mel_b = torch.stack([pad_to(r["mel"], tg_max, -1) for r in recorded])
        wav_b, _ = hift.inference(speech_feat=mel_b, finalize=True)
        out["hift"].update({"batch.mel": mel_b, "batch.wav": wav_b})
        per_item = []
        for i, r in enumerate(recorded):
            alone = out["hift"][f"item{i}.wav"]
            d = (wav_b[i, :alone.shape[0]] - alone).abs()
            bad = (d > 1e-5).nonzero().flatten()
            per_item.append({"max": float(d.max()), "differs_from_sample_from_end": int(alone.shape[0] - bad.min()) if len(bad) else 0,
                             "max_before_last_63": float(d[:-63].max())})
        gaps["hift_batch_vs_alone"] = per_item
        fixed = batched_as_alone(hift, mel_b, [r["mel"].shape[1] for r in recorded])
        gaps["hift_batch_fixed_vs_alone"] = max(float((w - out["hift"][f"item{i}.wav"]).abs().max()) for i, w in enumerate(fixed))
        gaps["dit_single_vs_cfg_row0"] = max(
            float((out["dit"][f"item{i}.out_single"][0] - out["dit"][f"item{i}.out"][0]).abs().max()) for i in range(B))
        # SineGen2's fixed initial phases (rand_ini) reach no sample: the frame-rate interpolation of
        # the phase increments never reads time index 0, where they are added.
        sine = hift.m_source.l_sin_gen
        kept = sine.rand_ini.clone()
        sine.rand_ini = torch.rand(kept.shape, generator=gen)
        again, _ = hift.inference(speech_feat=recorded[0]["mel"][None], finalize=True)
        sine.rand_ini = kept
        gaps["rand_ini_effect"] = float((again[0] - out["hift"]["item0.wav"]).abs().max())
    meta["gaps"] = gaps

    for stage, tensors in out.items():
        tensors = {k: v.contiguous().float() if v.is_floating_point() else v.contiguous().long() for k, v in tensors.items()}
        save_file(tensors, os.path.join(args.out, f"parity-{stage}.safetensors"), metadata=metadata(ref, args, stage, stage_doc(stage)))
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
