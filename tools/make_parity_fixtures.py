#!/usr/bin/env python3
"""Parity fixtures for voxbatch's CosyVoice2 token2wav port (src/model/cosyvoice2/).

Builds CosyVoice2's flow (speech tokens -> mel) and HiFT vocoder (mel -> 24 kHz waveform) from the
reference Python code of the PyPI package `token2wav-cosyvoice`, with random weights from a fixed
seed, and writes:

  OUT/official/           an "official" model directory as CosyVoice2 ships one (flow.pt, hift.pt with
                          weight norm not folded, spk2info.pt, cosyvoice2.yaml), the converter's input;
  OUT/parity.safetensors  inputs (tokens, prompt, x-vector, the fixed flow noise, the vocoder's random
                          draws) and the reference outputs of each stage, per item, run the way the
                          official code runs (batch 1, fp32, CPU, non-streaming);
  OUT/parity.json         the items' lengths and the config;
  OUT/parity-<precision>-<cpu|cuda>.safetensors  (with --precisions) the reference's outputs of the
                          same items per stage at a reduced precision, run as the official code runs
                          it: the flow under that autocast, HiFT outside autocast with torch's default
                          flags (cuDNN convolutions in TF32 on a GPU), the vocoder's draws replayed.
                          Stages: `encoder_out` and `mel` (the whole flow), `est.out` (one estimator
                          call on the fp32 fixtures' recorded inputs), `wav` (HiFT on this mel).

`tools/convert_cosyvoice.py OUT/official OUT` then writes the model directory voxbatch loads, and
`tests/cosyvoice2_parity.rs` compares the Rust port with the reference outputs.

Only the token2wav half of the package is imported; its LLM, CLI and training helpers (which pull in
transformers, torchaudio, lightning, hydra) are stubbed out of sys.modules before the import.

Usage: make_parity_fixtures.py --config tiny|full --out DIR [--seed N] [--precisions bf16,fp16 --device cpu|cuda:0]
"""
import argparse
import copy
import importlib.util
import json
import os
import sys
import types

import torch

CONFIGS = {
    # CosyVoice2's published dimensions (cosyvoice2.yaml).
    "full": dict(vocab_size=6561, enc_heads=8, enc_units=2048, enc_blocks=6, dec_channels=256, dec_heads=8,
                 dec_head_dim=64, dec_blocks=4, dec_mid_blocks=12, hift_channels=512, f0_channels=512),
    # Same architecture, small dimensions. The encoder stays 512-wide: the reference hard-codes 512
    # channels in its pre-lookahead and upsampling layers.
    "tiny": dict(vocab_size=64, enc_heads=8, enc_units=64, enc_blocks=1, dec_channels=64, dec_heads=2,
                 dec_head_dim=16, dec_blocks=1, dec_mid_blocks=2, hift_channels=32, f0_channels=32),
}

# (speech tokens, prompt tokens) per parity item: different lengths, one without a prompt.
ITEMS = [(23, 5), (11, 0), (31, 8)]


def import_reference():
    """Imports the token2wav modules of `token2wav-cosyvoice` without its LLM/CLI dependencies."""
    stub = types.ModuleType
    lightning_utils = stub("lightning.pytorch.utilities")
    lightning_utils.rank_zero_only = lambda f: f
    sys.modules.update({"lightning": stub("lightning"), "lightning.pytorch": stub("lightning.pytorch"),
                        "lightning.pytorch.utilities": lightning_utils})
    spec = importlib.util.find_spec("matcha")
    if spec is None:
        sys.exit("token2wav-cosyvoice is not installed: pip install --no-deps token2wav-cosyvoice==0.1.0 "
                 "conformer==0.3.2 && pip install diffusers einops omegaconf scipy safetensors")
    matcha_utils = stub("matcha.utils")
    matcha_utils.__path__ = [os.path.join(os.path.dirname(spec.origin), "utils")]
    llm = stub("cosyvoice.llm.llm")
    llm.TransformerLM = llm.Qwen2LM = object
    cli = stub("cosyvoice.cli.model")
    cli.CosyVoiceModel = cli.CosyVoice2Model = object
    sys.modules.update({"matcha.utils": matcha_utils, "cosyvoice.llm.llm": llm, "cosyvoice.cli.model": cli})
    from omegaconf import DictConfig
    from cosyvoice.flow.decoder import CausalConditionalDecoder
    from cosyvoice.flow.flow import CausalMaskedDiffWithXvec
    from cosyvoice.flow.flow_matching import CausalConditionalCFM
    from cosyvoice.hifigan.f0_predictor import ConvRNNF0Predictor
    from cosyvoice.hifigan.generator import HiFTGenerator
    from cosyvoice.transformer.upsample_encoder import UpsampleConformerEncoder
    return types.SimpleNamespace(**locals())


def move_plain_tensors(module, device):
    """Moves the tensors the reference keeps as plain attributes (not parameters or buffers, so
    `Module.to` leaves them where they are: the relative position encodings' `pe` tables) to
    `device`. Eager code moves them on its first call; an export would hold them as constants on
    the CPU inside a CUDA program (tools/compile_token2wav.py, tools/compile/fake_cuda.py)."""
    for m in module.modules():
        for name, value in list(vars(m).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(m, name, value.to(device))
    return module


def flow_encoder(ref, heads, units, blocks):
    """The flow's `UpsampleConformerEncoder` as CosyVoice2's configuration builds it (also
    tools/compile_token2wav.py's encoder stage, at a converted model's dimensions)."""
    return ref.UpsampleConformerEncoder(
        input_size=512, output_size=512, attention_heads=heads, linear_units=units,
        num_blocks=blocks, dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1,
        normalize_before=True, input_layer="linear", pos_enc_layer_type="rel_pos_espnet",
        selfattention_layer_type="rel_selfattn", use_cnn_module=False, macaron_style=False, static_chunk_size=25)


def flow_estimator(ref, channels, head_dim, blocks, mid_blocks, heads):
    """The flow's `CausalConditionalDecoder` as CosyVoice2's configuration builds it (also
    tools/compile_token2wav.py's estimator stage)."""
    return ref.CausalConditionalDecoder(
        in_channels=320, out_channels=80, channels=[channels], dropout=0.0,
        attention_head_dim=head_dim, n_blocks=blocks, num_mid_blocks=mid_blocks,
        num_heads=heads, act_fn="gelu", static_chunk_size=50, num_decoding_left_chunks=-1)


def build(ref, c):
    encoder = flow_encoder(ref, c["enc_heads"], c["enc_units"], c["enc_blocks"])
    estimator = flow_estimator(ref, c["dec_channels"], c["dec_head_dim"], c["dec_blocks"], c["dec_mid_blocks"], c["dec_heads"])
    cfm_params = ref.DictConfig({"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "cosine",
                                 "training_cfg_rate": 0.2, "inference_cfg_rate": 0.7, "reg_loss_type": "l1"})
    decoder = ref.CausalConditionalCFM(in_channels=240, n_spks=1, spk_emb_dim=80, cfm_params=cfm_params,
                                       estimator=estimator)
    flow = ref.CausalMaskedDiffWithXvec(
        input_size=512, output_size=80, spk_embed_dim=192, output_type="mel", vocab_size=c["vocab_size"],
        input_frame_rate=25, only_mask_loss=True, token_mel_ratio=2, pre_lookahead_len=3,
        encoder=encoder, decoder=decoder)
    hift = ref.HiFTGenerator(
        in_channels=80, base_channels=c["hift_channels"], nb_harmonics=8, sampling_rate=24000, nsf_alpha=0.1,
        nsf_sigma=0.003, nsf_voiced_threshold=10, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
        istft_params={"n_fft": 16, "hop_len": 4}, resblock_kernel_sizes=[3, 7, 11],
        resblock_dilation_sizes=[[1, 3, 5]] * 3, source_resblock_kernel_sizes=[7, 7, 11],
        source_resblock_dilation_sizes=[[1, 3, 5]] * 3, lrelu_slope=0.1, audio_limit=0.99,
        f0_predictor=ref.ConvRNNF0Predictor(num_class=1, in_channels=80, cond_channels=c["f0_channels"]))
    return flow.eval(), hift.eval()


def randomise(module, gen):
    """Moves every parameter off its initial value (ones, zeros) so that each one is exercised."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("alpha") or name.endswith("original0") or "norm" in name and name.endswith("weight"):
                p.copy_(p.abs().clamp(min=0.5) * (1 + 0.1 * noise).abs())  # scales stay positive
            elif p.dim() == 1:
                p.add_(0.05 * noise)
            else:
                p.mul_(1 + 0.1 * noise)


def record_calls(module, name, store):
    """Keeps the inputs and output of `module`'s first call in store[name]."""
    def hook(_m, args, kwargs, out):
        # Clone: the CFM reuses its input buffers in place from one step to the next.
        keep = lambda v: v.clone() if isinstance(v, torch.Tensor) else v
        if name not in store:
            store[name] = (tuple(keep(a) for a in args), {k: keep(v) for k, v in kwargs.items()}, keep(out))
    return module.register_forward_hook(hook, with_kwargs=True)


class ReplayedDraws:
    """Makes torch.rand / torch.randn_like return recorded draws, in order, on `device`."""
    def __init__(self, draws, device):
        self.draws, self.device = list(draws), device

    def __enter__(self):
        self._rand, self._randn_like = torch.rand, torch.randn_like
        def next_draw(kind, *_a, **_k):
            got, tensor = self.draws.pop(0)
            assert got == kind, (got, kind)
            return tensor.to(self.device)
        torch.rand = lambda *a, **k: next_draw("rand")
        torch.randn_like = lambda *a, **k: next_draw("randn_like")
        return self

    def __exit__(self, *exc):
        torch.rand, torch.randn_like = self._rand, self._randn_like


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def precision_fixtures(flow, hift, recorded, precision, device):
    """The reference's per-stage outputs of the recorded items at `precision` on `device`, as the
    official code runs it (see the module doc): {name: tensor}."""
    dtype, kind = AUTOCAST[precision], device.type
    flow, hift = copy.deepcopy(flow).to(device), copy.deepcopy(hift).to(device)
    on = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    out = {}
    for i, r in enumerate(recorded):
        calls = {}
        hook = record_calls(flow.encoder_proj, "encoder_proj", calls)
        with torch.inference_mode(), torch.autocast(kind, dtype=dtype):
            mel, _ = flow.inference(**{k: on(v) for k, v in r["flow"].items()}, streaming=False, finalize=True)
            args, kwargs = r["estimator"]
            est = flow.decoder.estimator(*(on(a) for a in args), **{k: on(v) for k, v in kwargs.items()})
        hook.remove()
        with torch.inference_mode(), ReplayedDraws(r["draws"], device):
            wav, _ = hift.inference(speech_feat=mel.float())
        p = f"item{i}."
        out.update({p + "encoder_out": calls["encoder_proj"][2][0], p + "est.out": est, p + "mel": mel[0], p + "wav": wav[0]})
    return {k: v.float().cpu().contiguous() for k, v in out.items()}


class RandomDraws:
    """Records what torch.rand / torch.randn_like return while active (the HiFT source's draws)."""
    def __init__(self):
        self.draws = []

    def __enter__(self):
        self._rand, self._randn_like = torch.rand, torch.randn_like
        def rand(*a, **k):
            t = self._rand(*a, **k)
            self.draws.append(("rand", t.clone()))
            return t
        def randn_like(*a, **k):
            t = self._randn_like(*a, **k)
            self.draws.append(("randn_like", t.clone()))
            return t
        torch.rand, torch.randn_like = rand, randn_like
        return self

    def __exit__(self, *exc):
        torch.rand, torch.randn_like = self._rand, self._randn_like


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-fixtures", action="store_true", help="write only the official directory (for benches)")
    ap.add_argument("--precisions", default="", help="also the reference's outputs at these precisions (bf16, fp16)")
    ap.add_argument("--device", default="cpu", help="where the --precisions fixtures run (cpu, cuda:0)")
    args = ap.parse_args()
    from safetensors.torch import save_file

    c = CONFIGS[args.config]
    ref = import_reference()
    torch.manual_seed(args.seed)
    flow, hift = build(ref, c)
    gen = torch.Generator().manual_seed(args.seed)
    randomise(flow, gen)
    randomise(hift, gen)
    with torch.no_grad():
        # F0 of tens to hundreds of Hz, crossing the 10 Hz voicing threshold now and then, so that both the
        # voiced (harmonic) and unvoiced (noise) branches of the source are exercised.
        cls = hift.f0_predictor.classifier
        cls.weight.mul_(1000.0 / (cls.weight.norm() + 1e-6))
        cls.bias.fill_(30.0)

    official = os.path.join(args.out, "official")
    os.makedirs(official, exist_ok=True)
    torch.save(flow.state_dict(), os.path.join(official, "flow.pt"))
    # The official hift.pt keeps weight norm unfolded, under `generator.`-less names.
    torch.save(hift.state_dict(), os.path.join(official, "hift.pt"))
    voices = {}
    for v, prompt_len in enumerate([0, 6]):
        emb = torch.randn(1, 192, generator=gen)
        if prompt_len == 0:
            voices[f"voice{v}"] = {"embedding": emb}
        else:
            voices[f"voice{v}"] = {
                "flow_embedding": emb,
                "flow_prompt_speech_token": torch.randint(0, c["vocab_size"], (1, prompt_len), generator=gen),
                "flow_prompt_speech_token_len": torch.tensor([prompt_len]),
                "prompt_speech_feat": torch.randn(1, 2 * prompt_len, 80, generator=gen),
                "prompt_speech_feat_len": torch.tensor([2 * prompt_len]),
                # The prompt's text as token ids (as CosyVoice2 stores it), so that the voice can
                # serve zero-shot jobs; its own generator leaves the other draws where they were.
                "prompt_text": torch.randint(3, 200, (1, 8), generator=torch.Generator().manual_seed(v + 77)),
                "prompt_text_len": torch.tensor([8]),
            }
    torch.save(voices, os.path.join(official, "spk2info.pt"))
    with open(os.path.join(official, "cosyvoice2.yaml"), "w") as f:
        f.write(f"# written by tools/make_parity_fixtures.py --config {args.config}: random weights\n")
        f.write("sample_rate: 24000\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\n")
        f.write(f"# estimator\nattention_head_dim: {c['dec_head_dim']}\nnum_heads: {c['dec_heads']}\n")
    if args.no_fixtures:
        return

    tensors, meta, recorded = {}, {"config": args.config, "seed": args.seed, "items": []}, []
    # The fixed flow noise of CausalConditionalCFM (seeded 0 in its constructor).
    tensors["flow.rand_noise"] = flow.decoder.rand_noise.contiguous()
    for i, (n_tok, n_prompt) in enumerate(ITEMS):
        token = torch.randint(0, c["vocab_size"], (1, n_tok), generator=gen)
        prompt_token = torch.randint(0, c["vocab_size"], (1, n_prompt), generator=gen)
        prompt_feat = torch.randn(1, 2 * n_prompt, 80, generator=gen)
        embedding = torch.randn(1, 192, generator=gen)
        calls = {}
        hooks = [record_calls(flow.encoder_proj, "encoder_proj", calls),
                 record_calls(flow.decoder.estimator, "estimator", calls)]
        with torch.inference_mode():
            mel, _ = flow.inference(token=token, token_len=torch.tensor([n_tok]), prompt_token=prompt_token,
                                    prompt_token_len=torch.tensor([n_prompt]), prompt_feat=prompt_feat,
                                    prompt_feat_len=torch.tensor([2 * n_prompt]), embedding=embedding,
                                    streaming=False, finalize=True)
        for h in hooks:
            h.remove()
        est_args, est_kwargs, est_out = calls["estimator"]
        x, mask, mu, t, spks, cond = est_args
        hooks = [record_calls(hift.f0_predictor, "f0", calls)]
        with torch.inference_mode(), RandomDraws() as draws:
            wav, source = hift.inference(speech_feat=mel)
        for h in hooks:
            h.remove()
        kinds = [k for k, _ in draws.draws]
        assert kinds == ["rand", "randn_like", "randn_like"], kinds
        recorded.append({"flow": dict(token=token, token_len=torch.tensor([n_tok]), prompt_token=prompt_token,
                                      prompt_token_len=torch.tensor([n_prompt]), prompt_feat=prompt_feat,
                                      prompt_feat_len=torch.tensor([2 * n_prompt]), embedding=embedding),
                         "estimator": (est_args, est_kwargs), "draws": draws.draws})
        p = f"item{i}."
        tensors.update({
            p + "token": token[0], p + "prompt_token": prompt_token[0], p + "prompt_feat": prompt_feat[0],
            p + "embedding": embedding[0],
            p + "encoder_out": calls["encoder_proj"][2][0],          # mu, (T_mel, 80), prompt included
            p + "est.x": x, p + "est.mask": mask, p + "est.mu": mu, p + "est.t": t, p + "est.spks": spks,
            p + "est.cond": cond, p + "est.out": est_out,             # first estimator call (CFG-doubled)
            p + "mel": mel[0],                                       # (80, T) without the prompt frames
            p + "f0": calls["f0"][2][0],
            p + "sine.rand_ini": draws.draws[0][1][0],               # (9,)
            p + "sine.noise": draws.draws[1][1][0],                  # (samples, 9)
            p + "source": source[0, 0],
            p + "wav": wav[0],
        })
        meta["items"].append({"tokens": n_tok, "prompt_tokens": n_prompt, "mel_frames": mel.shape[2],
                              "samples": wav.shape[1],
                              "clipped_fraction": float((wav.abs() >= 0.99).float().mean())})
    tensors = {k: v.contiguous().float() if v.is_floating_point() else v.contiguous().long() for k, v in tensors.items()}
    save_file(tensors, os.path.join(args.out, "parity.safetensors"))
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump(meta, f, indent=1)
    device = torch.device(args.device)
    for precision in filter(None, args.precisions.split(",")):
        if precision not in AUTOCAST:
            sys.exit(f"--precisions: {precision!r} is not one of {sorted(AUTOCAST)}")
        path = os.path.join(args.out, f"parity-{precision}-{device.type}.safetensors")
        save_file(precision_fixtures(flow, hift, recorded, precision, device), path)
        meta.setdefault("precision_fixtures", []).append(os.path.basename(path))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
