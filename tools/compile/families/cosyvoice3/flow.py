"""CosyVoice3's flow stage as the compile tool exports it: `estimator` (`Estimator` over the DiT of
dit.py, the model's `flow.decoder.estimator.*` weights), called by the flow's Euler steps with the
six inputs CosyVoice2's estimator takes (x, mask, mu, t, spks, cond: src/model/cosyvoice3/flow.rs
`Flow::solve`, through the same `flow_graphs` on CUDA); with its example inputs and dynamic shapes.
The token embedding, pre-lookahead layer and ×2 repeat before it stay eager in the worker (a few
small kernels per batch, not per step)."""
import torch

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


def estimator_inputs(batch, frames, device, seed=0):
    """A CFG-doubled step's inputs: `batch` rows of `frames` frames, the last row's item shorter and
    the first one a few frames short of the padded length (mask 0 past their ends)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    mask = torch.ones(batch, 1, frames, device=device)
    mask[-1, :, frames * 3 // 4:] = 0  # one shorter item
    mask[0, :, frames - 5:] = 0  # and one a few frames short of the padded length
    return (r(batch, 80, frames), mask, r(batch, 80, frames), torch.rand(batch, generator=g).to(device), r(batch, 80), r(batch, 80, frames))


# The package takes mel lengths in multiples of 8 frames, at least two of them: the flow pads every
# batch so (src/model/flow_matching.rs FRAME_MULTIPLE, shared with CosyVoice2).
FRAME_MULTIPLE = 8


def estimator_shapes(max_batch, max_frames):
    blocks = torch.export.Dim("frame_blocks", min=2, max=max_frames // FRAME_MULTIPLE)
    batch = torch.export.Dim("batch", min=2, max=max_batch)
    frames = FRAME_MULTIPLE * blocks
    return {"x": {0: batch, 2: frames}, "mask": {0: batch, 2: frames}, "mu": {0: batch, 2: frames},
            "t": {0: batch}, "spks": {0: batch}, "cond": {0: batch, 2: frames}}
