"""CosyVoice2 (`--family cosyvoice2`, the default): its token2wav stages, exported with a dynamic
batch and length, from a converted voxbatch model directory (model.py) with the model's own weights:

- `encoder` (flow.py): the flow's encoder stage, the reference `UpsampleConformerEncoder` and
  `encoder_proj` (`FlowEncoder`) over the masked token embeddings, with the model's
  `flow.encoder.*` and `flow.encoder_proj.*` weights, at the flow's precision; its length is
  tokens (`--max-frames`/2, at most 2,500). Not in the default `--stages`: on the H200
  (2026-12-05) it took 0.25 s of a batch of 256 ten-second utterances where the eager port's
  fused encoder takes 0.08 s (its attention is the reference's softmax and matmuls). Its package
  once crashed an H100 bench (SIGSEGV, 2026-12-05): the export held CPU tensors in a CUDA program
  (position tables `Module.to` does not move, the look-ahead's default context), now moved, and
  `checks.require_on_device` refuses any such export; on the H200 it then ran, 47.2 dB from the
  eager port (tiny model);
- `estimator` (flow.py): the flow's estimator, the reference `CausalConditionalDecoder` (PyPI
  `token2wav-cosyvoice`) built at the model's `[cosyvoice2]` dimensions with the model's own
  `flow.decoder.estimator.*` weights (frames even, as two mel frames per token make them), at the
  flow's precision (`--precision`), computed time-major (`--layout`: layouts.py) with the
  attention `--attention` chooses (attention.py);
- `hift` (hift.py): the vocoder's convolutional body between its source STFT and its iSTFT, at
  the vocoder's precision (`--vocoder-precision`, default model.toml's `vocoder_precision`), on
  channels-last tensors (`--layout`).

The flags below choose how each stage is computed (`Variant`); each form is described in
layouts.py and attention.py.
"""
import dataclasses
import functools
import sys

from ... import attention, layouts
from . import flow, hift
from .model import read_dims  # noqa: F401 — part of the family's interface

NAME = "cosyvoice2"
STAGES = ("encoder", "estimator", "hift")
DEFAULT_STAGES = "estimator,hift"
STAGES_HELP = ("comma-separated: estimator, hift, encoder (not in the default: measured slower than the "
               "eager encoder on an H200, 2026-12-05, docs/PERFORMANCE.md)")

# Inductor settings every compile starts from (`--inductor-option` adds to them or overrides them):
# freezing folds the estimator's weights into its package at the autocast dtype — without it each
# call casts every fp32 weight to bf16 again (582 of its 888 kernel launches a call). Not the
# encoder's: freezing failed in its CUDA compile on an H100 (2026-12-05: a CPU constant, since moved).
DEFAULT_INDUCTOR_OPTIONS = [("estimator", "freezing", True)]


def vocoder_precision(dims):
    return dims.get("vocoder_precision") or ("fp32" if dims.get("vocoder_fp32") else "tf32")


def stage_precision(stage, flow_precision, vocoder):
    return flow_precision if stage in ("encoder", "estimator") else vocoder


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a stage is computed beside its weights and precision: the estimator's attention,
    layout, feed-forward GELU and Mish, the vocoder's layout and STFT channel multiple. The
    defaults are the reference's own computation (what `--check` compares a variant with)."""
    attention: str = "sdpa"
    layout: str = "reference"
    ff_gelu: str = "exact"
    mish: str = "exact"
    qkv: str = "separate"
    hift_channel_multiple: int = 1
    hift_dilation: str = "dilated"

    def for_stage(self, stage):
        """The fields that shape `stage` (the others left at their defaults; the encoder has none)."""
        if stage == "estimator":
            return dataclasses.replace(self, hift_channel_multiple=1, hift_dilation="dilated")
        if stage == "encoder":
            return Variant()
        return Variant(layout=self.layout, hift_channel_multiple=self.hift_channel_multiple, hift_dilation=self.hift_dilation)

    def is_reference(self, stage):
        return self.for_stage(stage) == Variant()

    def metadata(self, stage):
        """The package metadata that records the variant (`voxbatch.*`)."""
        v = self.for_stage(stage)
        if stage == "estimator":
            return {"voxbatch.attention": v.attention, "voxbatch.ff_gelu": v.ff_gelu, "voxbatch.mish": v.mish,
                    "voxbatch.qkv": v.qkv, "voxbatch.layout": v.layout}
        if stage == "encoder":
            return {}
        return {"voxbatch.layout": v.layout, "voxbatch.hift_channel_multiple": str(v.hift_channel_multiple),
                "voxbatch.hift_dilation": v.hift_dilation}

    def cli_args(self):
        return ["--attention", self.attention, "--layout", self.layout, "--ff-gelu", self.ff_gelu, "--mish", self.mish,
                "--qkv", self.qkv, "--hift-channel-multiple", str(self.hift_channel_multiple), "--hift-dilation", self.hift_dilation]


def add_arguments(ap):
    """The flags that choose how CosyVoice2's stages are computed."""
    ap.add_argument("--attention", default="auto", choices=attention.ATTENTIONS,
                    help="the estimator's attention: SDPA with the reference's bias, FlexAttention masking padded keys in "
                         "the kernel, FlashAttention reading each item's valid keys only (CUDA, bf16/fp16), or cuDNN's "
                         "fused attention with a broadcast key bias (CUDA, bf16/fp16; experimental); "
                         "auto (default): flash on CUDA at bf16/fp16, else sdpa")
    ap.add_argument("--layout", default="time-major-strided-copy", choices=layouts.LAYOUTS,
                    help="each stage's activations: time-major throughout (the estimator as "
                         "tools/compile/layouts.py computes it, the vocoder body channels-last) with the estimator's "
                         "convolution windows copied from a strided view of the padded frames by a kernel of the package "
                         "(time-major-strided-copy, the default since 2026-12-05) or by the matmul itself, with libtorch's "
                         "generic strided copy (time-major-strided, the default before it), or from a `cat` of shifted "
                         "slices (time-major); time-major-shift: the "
                         "estimator's convolutions as one matmul per frame and a shifted sum, experimental; time-major-cudnn: "
                         "the estimator's convolutions through cuDNN instead of matmuls, experimental; or "
                         "channel-major as the reference computes them")
    ap.add_argument("--ff-gelu", default="epilogue", choices=layouts.FF_GELUS,
                    help="the estimator's feed-forward GELU: epilogue (default): in the input projection's cuBLASLt "
                         "matmul (tanh approximation on CUDA), or exact, a separate kernel as the reference computes it")
    ap.add_argument("--mish", default="auto", choices=["auto", "exact", "exp"],
                    help="the time-major estimator's Mish: exp, x·n/(n+2) with n = eˣ(eˣ+2), one exponential and one "
                         "division, or exact, torch's x·tanh(softplus(x)) (the same function within 1e-6); auto "
                         "(default): exp with a time-major layout, else exact")
    ap.add_argument("--qkv", default="auto", choices=["auto", "separate", "fused"],
                    help="the estimator's attention projections: fused, query, key and value in one matmul (needs "
                         "--attention flash, flex or cudnn), or separate, as the reference; auto (default): fused where "
                         "the attention allows it")
    ap.add_argument("--hift-channel-multiple", type=int, default=4, metavar="K",
                    help="the vocoder body's convolutions on the 18 STFT channels padded with zero channels to a "
                         "multiple of K (4, the default → 20: cuDNN's TF32 kernels want multiples of 4); 1: as they are. "
                         "Same result")
    ap.add_argument("--hift-dilation", default="auto", choices=["auto", *layouts.HIFT_DILATIONS],
                    help="the vocoder body's dilated convolutions: phases, each as an undilated convolution over the "
                         "time axis split into phases (time-major layouts only), or dilated, as they are; auto "
                         "(default): phases with a time-major layout, else dilated")


def variant(args, stage, device, precision):
    """The flags as `stage`'s Variant on `device` at `precision`: each `auto` resolved to the
    measured fastest form the layout has (the reference's modules have none)."""
    if args.hift_channel_multiple < 1:
        sys.exit("--hift-channel-multiple: 1 or more")
    hift_dilation = args.hift_dilation if args.hift_dilation != "auto" else ("dilated" if args.layout == "reference" else "phases")
    mish = args.mish if args.mish != "auto" else ("exact" if args.layout == "reference" else "exp")
    attn = attention.resolve_attention(args.attention, device, precision)
    qkv = args.qkv if args.qkv != "auto" else ("separate" if attn == "sdpa" else "fused")
    return Variant(attention=attn, layout=args.layout, ff_gelu=args.ff_gelu, mish=mish, qkv=qkv,
                   hift_channel_multiple=args.hift_channel_multiple, hift_dilation=hift_dilation)


STAGE_PARTS = {
    "encoder": (flow.build_encoder, flow.encoder_inputs, flow.encoder_shapes),
    "estimator": (flow.build_estimator, flow.estimator_inputs, flow.estimator_shapes),
    "hift": (hift.build_hift, hift.hift_inputs, hift.hift_shapes),
}


def stage_parts(stage, variant):
    """A stage's (build, example inputs, dynamic shapes), built as `variant` says."""
    build, example, shapes = STAGE_PARTS[stage]
    v = variant
    if stage == "estimator":
        build = functools.partial(build, attention=v.attention, layout=v.layout, ff_gelu=v.ff_gelu, mish=v.mish, qkv=v.qkv)
    elif stage == "hift":
        build = functools.partial(build, layout=v.layout, channel_multiple=v.hift_channel_multiple, dilation=v.hift_dilation)
        shapes = functools.partial(shapes, bounded=v.hift_dilation != "phases")
    return build, example, shapes


def length_limit(stage, max_frames):
    """The encoder's lengths are tokens (two mel frames each), at most what its position table covers."""
    return min(max_frames // 2, flow.ENCODER_MAX_TOKENS) if stage == "encoder" else max_frames


def stage_metadata(stage):
    return {"voxbatch.frame_multiple": str(flow.FRAME_MULTIPLE)} if stage == "estimator" else {}
