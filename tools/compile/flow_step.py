"""The flow step both families export as their `estimator` stage: one call of the CFG-doubled
batch on six inputs (x, mask, mu, t, spks, cond — the order Rust's `model::flow_graphs` and the
families' flows pass them), with its example inputs and dynamic shapes.

The package takes mel lengths in multiples of `FRAME_MULTIPLE` frames, at least two of them: the
flows pad every batch so (src/model/flow_matching.rs FRAME_MULTIPLE). For CosyVoice2's estimator
the attention bias rows then meet SDPA's 8-element alignment, so the memory-efficient kernel needs
no padded copy of the bias."""
import torch

FRAME_MULTIPLE = 8


def estimator_inputs(batch, frames, device, seed=0):
    """A CFG-doubled step's inputs: `batch` rows of `frames` frames, the last row's item shorter and
    the first one a few frames short of the padded length (mask 0 past their ends)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    mask = torch.ones(batch, 1, frames, device=device)
    mask[-1, :, frames * 3 // 4:] = 0  # one shorter item
    mask[0, :, frames - 5:] = 0  # and one a few frames short of the padded length
    return (r(batch, 80, frames), mask, r(batch, 80, frames), torch.rand(batch, generator=g).to(device), r(batch, 80), r(batch, 80, frames))


def estimator_shapes(max_batch, max_frames):
    blocks = torch.export.Dim("frame_blocks", min=2, max=max_frames // FRAME_MULTIPLE)
    batch = torch.export.Dim("batch", min=2, max=max_batch)
    frames = FRAME_MULTIPLE * blocks
    return {"x": {0: batch, 2: frames}, "mask": {0: batch, 2: frames}, "mu": {0: batch, 2: frames},
            "t": {0: batch}, "spks": {0: batch}, "cond": {0: batch, 2: frames}}
