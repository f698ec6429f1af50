#!/usr/bin/env python3
"""Compiles CosyVoice2's flow estimator of a converted voxbatch model directory into an
AOTInductor package (issue 16): the reference `CausalConditionalDecoder` (PyPI
`token2wav-cosyvoice`) built at the model's `[cosyvoice2]` dimensions, loaded with the model's own
`flow.decoder.estimator.*` weights from token2wav.safetensors, exported with a dynamic batch and
length (frames even, as CosyVoice2's two mel frames per token make them), compiled by
`torch._inductor.aoti_compile_and_package` for one device and precision.

Written to DIR/compiled/<key>/estimator.pt2, key = <device arch>-torch<version>-<precision>
(e.g. sm90-torch2.11.0-bf16, cpu-torch2.11.0-fp32), with the same facts in the package's metadata
(`voxbatch.*`), so that a worker on another GPU, torch or precision finds no package of its key and
runs the eager port (a warning, not a failure). Needs the project venv's torch and the reference
code (bootstrap installs both; on the GPU machine scripts/device/*.sh carry them as wheels).

For export only, two helpers are replaced by exportable equivalents: the reference's
`add_optional_chunk_mask` by its non-streaming meaning without the data-dependent `.item()` check
(a row with no valid key attends to every key: what the reference does after printing a warning),
and diffusers' `Attention.prepare_attention_mask` by the same per-head repeat without the
`output_size` argument that pins the batch size. `--check` compares the package with the eager
reference on random inputs and prints the worst difference.

Usage: compile_token2wav.py --model DIR [--device cuda:0|cpu] [--precision bf16|fp16|fp32]
                            [--max-frames 3000] [--check]
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_parity_fixtures as mpf  # noqa: E402

PRECISIONS = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def package_key(device, precision):
    """The key a worker looks a package up by (src/model/compiled.rs builds the same)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm{major}{minor}"
    else:
        arch = "cpu"
    return f"{arch}-torch{torch.__version__.split('+')[0]}-{precision}"


def read_dims(model_dir):
    import tomllib
    with open(os.path.join(model_dir, "model.toml"), "rb") as f:
        manifest = tomllib.load(f)
    dims = manifest.get("cosyvoice2")
    if not dims:
        sys.exit(f"{model_dir}/model.toml has no [cosyvoice2] section: not a converted CosyVoice2 model")
    return manifest, dims


def exportable_prepare_attention_mask(self, attention_mask, target_length, batch_size, out_dim=3):
    """diffusers' `Attention.prepare_attention_mask` for the estimator's masks (3-D, already
    `target_length` long): each item's mask repeated per head, without the `output_size` argument
    whose concrete value pins the exported batch size."""
    if attention_mask is None:
        return None
    assert out_dim == 3 and attention_mask.shape[-1] == target_length, "the estimator passes full-length 3-D masks"
    b, q, k = attention_mask.shape
    return attention_mask.unsqueeze(1).expand(b, self.heads, q, k).reshape(b * self.heads, q, k)


def exportable_chunk_mask(xs, masks, use_dynamic_chunk, use_dynamic_left_chunk, decoding_chunk_size,
                          static_chunk_size, num_decoding_left_chunks, enable_full_context=True):
    """`add_optional_chunk_mask` as the non-streaming estimator calls it, without `.item()`."""
    assert not use_dynamic_chunk and static_chunk_size == 0, "only the non-streaming path is exported"
    return masks | (masks.sum(dim=-1, keepdim=True) == 0)


class Estimator(torch.nn.Module):
    """The estimator's forward as the flow's Euler steps call it, under the precision's autocast;
    fp32 out."""

    def __init__(self, inner, device_type, dtype):
        super().__init__()
        self.inner, self.device_type, self.dtype = inner, device_type, dtype

    def forward(self, x, mask, mu, t, spks, cond):
        if self.dtype is None:
            return self.inner(x, mask, mu, t, spks, cond, streaming=False).float()
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.inner(x, mask, mu, t, spks, cond, streaming=False).float()


def build(model_dir, device, precision):
    ref = mpf.import_reference()
    import cosyvoice.flow.decoder as decoder_module
    decoder_module.add_optional_chunk_mask = exportable_chunk_mask
    from diffusers.models.attention_processor import Attention
    Attention.prepare_attention_mask = exportable_prepare_attention_mask
    _, d = read_dims(model_dir)
    estimator = ref.CausalConditionalDecoder(
        in_channels=320, out_channels=80, channels=[d["decoder_channels"]], dropout=0.0,
        attention_head_dim=d["decoder_head_dim"], n_blocks=d["decoder_blocks"], num_mid_blocks=d["decoder_mid_blocks"],
        num_heads=d["decoder_heads"], act_fn="gelu", static_chunk_size=50, num_decoding_left_chunks=-1)
    from safetensors.torch import load_file
    weights = load_file(os.path.join(model_dir, "token2wav.safetensors"))
    prefix = "flow.decoder.estimator."
    state = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    missing, unexpected = estimator.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"token2wav.safetensors does not fit the estimator: missing {missing[:5]}, unexpected {unexpected[:5]}")
    # The weights file's digest: a worker uses the package only with the file it was made from.
    digest = hashlib.sha256()
    with open(os.path.join(model_dir, "token2wav.safetensors"), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return Estimator(estimator.eval().to(device), device.type, PRECISIONS[precision]), digest.hexdigest()[:16]


def inputs(batch, frames, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    mask = torch.ones(batch, 1, frames, device=device)
    mask[-1, :, frames * 3 // 4:] = 0  # one shorter item
    return (r(batch, 80, frames), mask, r(batch, 80, frames), torch.rand(batch, generator=g).to(device), r(batch, 80), r(batch, 80, frames))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default="bf16", choices=sorted(PRECISIONS))
    ap.add_argument("--max-frames", type=int, default=3000, help="longest mel (frames, 50 a second) the package takes")
    ap.add_argument("--max-batch", type=int, default=1024, help="largest batch (CFG doubles the flow's batch)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    key = package_key(device, a.precision)
    module, weights_digest = build(a.model, device, a.precision)
    half = torch.export.Dim("half_frames", min=2, max=a.max_frames // 2)
    batch = torch.export.Dim("batch", min=2, max=a.max_batch)
    frames = 2 * half
    shapes = {"x": {0: batch, 2: frames}, "mask": {0: batch, 2: frames}, "mu": {0: batch, 2: frames},
              "t": {0: batch}, "spks": {0: batch}, "cond": {0: batch, 2: frames}}
    started = time.time()
    with torch.no_grad():
        exported = torch.export.export(module, inputs(4, 100, device), dynamic_shapes=shapes)
        out_dir = os.path.join(a.model, "compiled", key)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "estimator.pt2")
        metadata = {"voxbatch.key": key, "voxbatch.stage": "estimator", "voxbatch.torch": torch.__version__.split("+")[0],
                    "voxbatch.precision": a.precision, "voxbatch.weights": weights_digest,
                    "voxbatch.max_frames": str(a.max_frames), "voxbatch.max_batch": str(a.max_batch)}
        torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs={"aot_inductor.metadata": metadata})
    compile_seconds = time.time() - started
    report = {"package": path, "key": key, "compile_seconds": compile_seconds, **metadata}
    if a.check:
        loaded = torch._inductor.aoti_load_package(path)
        worst = 0.0
        with torch.no_grad():
            for b, f in [(2, 40), (6, 130)]:
                args = inputs(b, f, device, seed=b)
                worst = max(worst, (loaded(*args) - module(*args)).abs().max().item())
        report["max_abs_difference_vs_eager"] = worst
    print(json.dumps(report))


if __name__ == "__main__":
    main()
