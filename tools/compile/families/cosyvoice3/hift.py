"""CosyVoice3's vocoder stage as the compile tool exports it: `hift`, the causal HiFT's
convolutional body — the shared `HiftBody` (tools/compile/vocoder.py) in the causal layout of its
`CausalHiFTGenerator` (src/model/cosyvoice3/hift.rs over src/model/vocoder/: `conv_pre` looking
`conv_pre_look_right` frames ahead, every other convolution causal, nearest-repetition upsampling)
— built from the model directory's `hift.*` weights and `[cosyvoice3]` dimensions at the vocoder's
precision, in the forms the variant chooses; with the shared example inputs and dynamic shapes.
The F0 predictor (float64), the harmonic source from the model's fixed noise, the STFT and the
iSTFT stay eager in the worker."""
import sys

from ...packages import PRECISIONS
from ...vocoder import HiftBody, hift_inputs, hift_shapes  # noqa: F401 — the stage's parts (__init__.py)
from .model import read_dims, stage_weights

# The body's weights: everything under `hift.` but the F0 predictor's and the source's (eager).
EAGER_PREFIXES = ("f0_predictor.", "m_source.")


def build_hift(model_dir, device, precision, layout="reference", channel_multiple=1, dilation="dilated"):
    _, d = read_dims(model_dir)
    weights = {k: v for k, v in stage_weights(model_dir, "hift.").items() if not k.startswith(EAGER_PREFIXES)}
    try:
        return HiftBody(weights, d["hift_channels"], device.type, PRECISIONS[precision], time_major=layout != "reference",
                        channel_multiple=channel_multiple, dilation=dilation, layout="causal",
                        conv_pre_look_right=d["conv_pre_look_right"]).eval().to(device)
    except ValueError as e:
        sys.exit(str(e))
