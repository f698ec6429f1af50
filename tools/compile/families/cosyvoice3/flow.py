"""CosyVoice3's flow stage as the compile tool exports it: `estimator` (`Estimator` over the DiT of
dit.py, the model's `flow.decoder.estimator.*` weights), called by the flow's Euler steps with the
six inputs CosyVoice2's estimator takes (x, mask, mu, t, spks, cond: src/model/cosyvoice3/flow.rs
`Flow::solve`, through the same `flow_graphs` on CUDA); with its example inputs and dynamic shapes.
The token embedding, pre-lookahead layer and ×2 repeat before it stay eager in the worker (a few
small kernels per batch, not per step)."""
import torch

from ...flow_step import FRAME_MULTIPLE, estimator_inputs, estimator_shapes  # noqa: F401 — the estimator stage's
from ...packages import PRECISIONS
from .dit import Dit
from .model import load_exactly, read_dims, stage_weights


class Estimator(torch.nn.Module):
    """The DiT as a step of the flow's Euler loop calls it, at the flow's precision; fp32 out.

    At bf16/fp16 the inputs are first cast to that dtype and the DiT runs under autocast: the eager
    port's flow types every step's inputs as its speaker projection's output, which autocast makes
    bf16 (upstream's buffers are so typed; `t` is rounded before the time embedding), and the
    worker passes those values as fp32 (`CompiledPackage::run`), so the cast gives back exactly
    what the eager DiT receives. The output is the last projection's, cast to fp32 (exactly: the
    flow casts it back to the eager dtype before guidance)."""

    def __init__(self, dit, device_type, dtype):
        super().__init__()
        self.dit, self.device_type, self.dtype = dit, device_type, dtype

    def forward(self, x, mask, mu, t, spks, cond):
        if self.dtype is None:
            return self.dit(x, mask, mu, t, spks, cond).float()
        inputs = [v.to(self.dtype) for v in (x, mask, mu, t, spks, cond)]
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.dit(*inputs).float()


def build_estimator(model_dir, device, precision, **_):
    _, d = read_dims(model_dir)
    dit = Dit(d["dit_dim"], d["dit_depth"], d["dit_heads"], d["dit_head_dim"], d["dit_ff_mult"])
    load_exactly(dit, stage_weights(model_dir, "flow.decoder.estimator."), "DiT (flow.decoder.estimator.*)")
    return Estimator(dit.eval().to(device), device.type, PRECISIONS[precision])
