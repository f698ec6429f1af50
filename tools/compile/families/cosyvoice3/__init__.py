"""CosyVoice3 (`--family cosyvoice3`): its token2wav stages, exported with a dynamic batch and
length, from a converted voxbatch model directory (model.py: kind `cosyvoice3-token2wav`, written
by tools/convert_cosyvoice.py) with the model's own weights. No reference package on PyPI ships
CosyVoice3's code: the modules here are voxbatch's, written from its Rust port
(src/model/cosyvoice3/, at parity with the reference), operation for operation:

- `estimator` (flow.py over dit.py and embeddings.py): the flow's DiT — time and input embeddings,
  `dit_depth` AdaLN-Zero blocks, the final AdaLN and projection — with the model's
  `flow.decoder.estimator.*` weights (each by name and shape), at the flow's precision
  (`--precision`), taking the six inputs CosyVoice2's estimator takes (x, mask, mu, t, spks, cond),
  frames in multiples of 8; the worker calls it inside the Euler loop where the eager DiT runs;
- `hift` (hift.py): the causal HiFT's convolutional body between its source STFT and its iSTFT —
  the shared body of tools/compile/vocoder.py in the causal layout — at the vocoder's precision
  (`--vocoder-precision`, default model.toml's `vocoder_precision`, else the flow's, as upstream
  runs CosyVoice3's vocoder inside the flow's autocast), on channels-last tensors (`--layout`).

The DiT is computed in one form, the port's (its attention SDPA with a boolean key mask; it is
time-major already: no layout to choose); the vocoder body's forms are CosyVoice2's (`--layout`,
`--hift-channel-multiple`, `--hift-dilation`; layouts.py), its causal convolutions padded on the
left. Not measured on a GPU yet.
"""
import dataclasses
import sys

from ... import layouts
from . import flow, hift
from .model import read_dims  # noqa: F401 — part of the family's interface

NAME = "cosyvoice3"
STAGES = ("estimator", "hift")
DEFAULT_STAGES = "estimator,hift"
STAGES_HELP = "comma-separated: estimator (the DiT), hift (the causal vocoder's body)"

# Inductor settings every compile starts from (`--inductor-option` adds to them or overrides them):
# freezing folds the DiT's weights into its package at the autocast dtype, as CosyVoice2's
# estimator's (without it each call casts every fp32 weight to bf16 again).
DEFAULT_INDUCTOR_OPTIONS = [("estimator", "freezing", True)]

# The vocoder body's `--layout` values: channels-last (`time-major`, the default) or channel-major.
HIFT_LAYOUTS = ("time-major", "reference")


def vocoder_precision(dims):
    """model.toml's `vocoder_precision`, or None: the flow's (`stage_precision`)."""
    return dims.get("vocoder_precision")


def stage_precision(stage, flow_precision, vocoder):
    return flow_precision if stage == "estimator" else (vocoder or flow_precision)


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a stage is computed beside its weights and precision: the vocoder body's layout, STFT
    channel multiple and dilations (the DiT has one form). The defaults are the port's own
    channel-major computation (what `--eager-check` compares a variant with)."""
    layout: str = "reference"
    hift_channel_multiple: int = 1
    hift_dilation: str = "dilated"

    def for_stage(self, stage):
        """The fields that shape `stage` (the DiT has none)."""
        return self if stage == "hift" else Variant()

    def is_reference(self, stage):
        return self.for_stage(stage) == Variant()

    def metadata(self, stage):
        """The package metadata that records the variant (`voxbatch.*`)."""
        if stage == "estimator":
            return {"voxbatch.attention": "sdpa"}
        v = self.for_stage(stage)
        return {"voxbatch.layout": v.layout, "voxbatch.hift_channel_multiple": str(v.hift_channel_multiple),
                "voxbatch.hift_dilation": v.hift_dilation}

    def cli_args(self):
        return ["--layout", self.layout, "--hift-channel-multiple", str(self.hift_channel_multiple),
                "--hift-dilation", self.hift_dilation]


def add_arguments(ap):
    """The flags that choose how CosyVoice3's vocoder body is computed."""
    ap.add_argument("--layout", default="time-major", choices=HIFT_LAYOUTS,
                    help="the vocoder body's activations: time-major (default), channels-last [B, C, 1, T] tensors "
                         "(as CosyVoice2's, measured faster there), or reference: channel-major as the eager port")
    ap.add_argument("--hift-channel-multiple", type=int, default=4, metavar="K",
                    help="the vocoder body's convolutions on the 18 STFT channels padded with zero channels to a "
                         "multiple of K (4, the default → 20); 1: as they are. Same result")
    ap.add_argument("--hift-dilation", default="auto", choices=["auto", *layouts.HIFT_DILATIONS],
                    help="the vocoder body's dilated causal convolutions: phases, each as an undilated convolution "
                         "over the time axis split into phases (time-major only), or dilated, as they are; auto "
                         "(default): phases with the time-major layout, else dilated")


def variant(args, stage, device, precision):
    """The flags as `stage`'s Variant (`auto` resolved by the layout)."""
    if args.hift_channel_multiple < 1:
        sys.exit("--hift-channel-multiple: 1 or more")
    hift_dilation = args.hift_dilation if args.hift_dilation != "auto" else ("dilated" if args.layout == "reference" else "phases")
    return Variant(layout=args.layout, hift_channel_multiple=args.hift_channel_multiple, hift_dilation=hift_dilation)


def stage_parts(stage, variant):
    """A stage's (build, example inputs, dynamic shapes), built as `variant` says."""
    if stage == "estimator":
        return flow.build_estimator, flow.estimator_inputs, flow.estimator_shapes
    v = variant

    def build(model_dir, device, precision):
        return hift.build_hift(model_dir, device, precision, layout=v.layout, channel_multiple=v.hift_channel_multiple,
                               dilation=v.hift_dilation)

    def shapes(max_batch, max_frames):
        return hift.hift_shapes(max_batch, max_frames, bounded=v.hift_dilation != "phases")

    return build, hift.hift_inputs, shapes


def length_limit(stage, max_frames):
    return max_frames


def stage_metadata(stage):
    return {"voxbatch.frame_multiple": str(flow.FRAME_MULTIPLE)} if stage == "estimator" else {}
