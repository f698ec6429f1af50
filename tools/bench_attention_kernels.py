"""The estimator's self-attention kernels alone on a GPU, at the shape of one compiled flow step:
`--batch` items (classifier-free guidance doubles a token2wav batch: 512 rows for batch 256) of
`--frames` mel frames (280 = the pipeline's mean 5.6-s segment), `--heads` × `--dim`, bf16.

- `flash`: what the packages run (`--attention flash`): FlashAttention 2's varlen kernel on the
  padded layout, each item reading its first `length` keys (`seqused_k`).
- `cudnn-varlen`: aten's `_cudnn_attention_forward` with cumulative offsets (`--attention
  cudnn-varlen`; AOTInductor cannot package it in torch 2.11: the op returns SymInts).
- `cudnn-dense`: cuDNN's SDPA with no mask (every key valid): the bound of what cuDNN does at this shape.
- `cudnn-bias`: cuDNN's SDPA with the key-padding mask as an additive bias broadcast over heads and
  query rows (`--attention cudnn`).
- `cudnn-aug8`, `cudnn-aug64`: cuDNN's dense kernel with the key-padding mask folded into 8 (or 64)
  more head dimensions (a query's first extra is 1, a padded key's −30000, a valid key's 0): no
  mask, valid keys' scores unchanged; the error against `flash` is printed.
- `efficient`: the memory-efficient (CUTLASS) kernel on the padded layout with each item's key count.
- `flash-dense`: FlashAttention 2 through SDPA with no mask, the same bound for FlashAttention.

Each is timed with CUDA events over `--iters` calls after a warm-up; prints a table and, with
`--out`, writes JSON. Random inputs: a kernel's speed, not a model's output.
"""
import argparse
import json

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--frames", type=int, nargs="+", default=[280, 500])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--valid", type=float, default=1.0, help="share of each item's frames that are valid keys")
    p.add_argument("--out")
    a = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for t in a.frames:
        b, h, d = a.batch, a.heads, a.dim
        q, k, v = (torch.randn(b * t, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
        length = max(1, int(round(t * a.valid)))
        lengths = torch.full((b,), length, device=dev, dtype=torch.int32)
        offsets = torch.arange(b + 1, device=dev, dtype=torch.int32) * t
        cum_k = torch.arange(b + 1, device=dev, dtype=torch.int32) * length
        kk, vv = k[: b * length], v[: b * length]
        dense = [x.view(b, t, h, d).transpose(1, 2) for x in (q, k, v)]

        def flash():
            return torch.ops.aten._flash_attention_forward(q, k, v, offsets, offsets, t, t, 0.0, False, False, seqused_k=lengths)[0]

        def cudnn_varlen():
            return torch.ops.aten._cudnn_attention_forward(q, kk, vv, None, offsets, cum_k, t, length, False, 0.0, False)[0]

        def cudnn_dense():
            return torch.ops.aten._scaled_dot_product_cudnn_attention(*dense, None, False)[0]

        bias = torch.zeros(b, 1, 1, t, device=dev, dtype=torch.bfloat16)
        bias[:, :, :, length:] = float("-inf")

        def cudnn_bias():
            return torch.ops.aten._scaled_dot_product_cudnn_attention(*dense, bias.expand(b, h, t, t), False)[0]

        def efficient():
            return torch.ops.aten._efficient_attention_forward(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, offsets, offsets, t, t, 0.0, 0, False, seqlen_k=lengths)[0]

        def augmented(extra):
            # The key-padding mask as `extra` more head dimensions: the query's first is 1, a
            # valid key's 0 and a padded key's -30000 (scaled: −3750, exp → 0); the rest zeros.
            # Valid keys' scores are the 64-dimension ones exactly. cuDNN's dense kernel, no mask.
            qa = torch.cat([q, q.new_zeros(b * t, h, extra)], -1)
            qa[..., d] = 1.0
            ka = torch.cat([k, k.new_zeros(b * t, h, extra)], -1).view(b, t, h, d + extra)
            ka[:, length:, :, d] = -30000.0
            va = torch.cat([v, v.new_zeros(b * t, h, extra)], -1)
            qa, ka, va = (x.view(b, t, h, d + extra).transpose(1, 2) for x in (qa, ka, va))
            return lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(qa, ka, va, None, False, scale=d ** -0.5)[0]

        cudnn_aug8, cudnn_aug64 = augmented(8), augmented(64)

        def flash_dense():
            return torch.ops.aten._scaled_dot_product_flash_attention(*dense)[0]

        flops = 4.0 * b * h * t * length * d
        ref = flash().float()
        for name, fn in [("cudnn-aug8", cudnn_aug8), ("cudnn-aug64", cudnn_aug64)]:
            try:
                err = (fn().transpose(1, 2).reshape(b * t, h, -1)[..., :d].float() - ref).abs().max().item()
                print(f"{name} at {t} frames: max |difference| from flash {err:.2e}")
            except Exception as e:
                print(f"{name}: {type(e).__name__}: {e}"[:200])
        for name, fn in [("flash", flash), ("cudnn-varlen", cudnn_varlen), ("cudnn-dense", cudnn_dense), ("cudnn-bias", cudnn_bias), ("cudnn-aug8", cudnn_aug8), ("cudnn-aug64", cudnn_aug64),
                         ("efficient", efficient), ("flash-dense", flash_dense)]:
            try:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(a.iters):
                    fn()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / a.iters
                rows.append({"kernel": name, "frames": t, "valid": length, "ms": ms, "tflops": flops / ms / 1e9})
            except Exception as e:  # a kernel this torch or card lacks: said, not fatal
                rows.append({"kernel": name, "frames": t, "valid": length, "error": f"{type(e).__name__}: {e}"[:200]})
    print(f"| kernel | frames | valid keys | ms a call | TFLOP/s |  ({torch.cuda.get_device_name()}, batch {a.batch}, {a.heads}×{a.dim}, bf16)")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kernel']} | {r['frames']} | {r['valid']} | {r['error']} | |")
        else:
            print(f"| {r['kernel']} | {r['frames']} | {r['valid']} | {r['ms']:.3f} | {r['tflops']:.0f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
