"""CosyVoice2's vocoder stage as the compile tool exports it: `hift`, the vocoder's convolutional
body — the shared `HiftBody` (tools/compile/vocoder.py) in the centred layout of its
`HiFTGenerator` (src/model/cosyvoice2/hift.rs over src/model/vocoder/) — built from the model
directory's `hift.*` weights and `[cosyvoice2]` dimensions at the vocoder's precision, in the forms
the variant chooses; with the shared example inputs and dynamic shapes."""
import sys

from ...packages import PRECISIONS
from ...vocoder import HiftBody, hift_inputs, hift_shapes  # noqa: F401 — the stage's parts (__init__.py)
from .model import read_dims, stage_weights


def build_hift(model_dir, device, precision, layout="reference", channel_multiple=1, dilation="dilated"):
    _, d = read_dims(model_dir)
    try:
        return HiftBody(stage_weights(model_dir, "hift."), d["hift_channels"], device.type, PRECISIONS[precision],
                        time_major=layout != "reference", channel_multiple=channel_multiple, dilation=dilation,
                        layout="centred").eval().to(device)
    except ValueError as e:
        sys.exit(str(e))
