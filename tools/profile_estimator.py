#!/usr/bin/env python3
"""Where a compiled flow estimator spends its time (issue 16): loads the estimator package that
tools/compile_token2wav.py wrote into a model directory, times it at one batch and length (as the
flow's Euler steps call it: CFG-doubled batch, mel frames a multiple of the package's
`voxbatch.frame_multiple`), and lists the CUDA kernels of a few calls by their share of GPU time,
grouped into attention, matmul, convolution, fused element-wise (Triton) and other.

Usage: profile_estimator.py --model DIR [--key sm90-torch2.11.0-bf16] [--device cuda:0|cpu] [--batch 256]
                            [--frames 504] [--calls 3] [--out FILE.json]
Random inputs; the figures say where time goes, not how anything sounds. On the H200 host on
2026-12-04 the process ended silently while loading the package into Python (as
compile_token2wav.py --check did there before); on the CPU it runs (the tiny model's package).
"""
import argparse
import collections
import glob
import json
import os
import sys
import time

import torch


def category(name):
    n = name.lower()
    if "fmha" in n or "attention" in n or "flash" in n or "cutlassf" in n:
        return "attention"
    if "triton" in n:
        return "fused element-wise (triton)"
    if "gemm" in n or "cutlass" in n or "sm90_xmma" in n or "nvjet" in n or "cublas" in n:
        return "matmul"
    if "conv" in n or "cudnn" in n or "xmma" in n:
        return "convolution"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--key", help="package key (default: the only estimator package)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--frames", type=int, default=504)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    pattern = os.path.join(a.model, "compiled", a.key or "*", "estimator.pt2")
    found = sorted(glob.glob(pattern))
    if len(found) != 1:
        sys.exit(f"expected one package at {pattern}, found {found}")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    package = torch._inductor.aoti_load_package(found[0])
    g = torch.Generator().manual_seed(0)
    b, f = a.batch, a.frames
    mask = torch.ones(b, 1, f)
    mask[b // 2:, :, f * 3 // 4:] = 0
    args = [torch.randn(b, 80, f, generator=g), mask, torch.randn(b, 80, f, generator=g), torch.rand(b, generator=g),
            torch.randn(b, 80, generator=g), torch.randn(b, 80, f, generator=g)]
    args = [x.to(device) for x in args]
    with torch.no_grad():
        for _ in range(3):
            package(*args)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        started = time.perf_counter()
        for _ in range(a.calls):
            package(*args)
        sync()
        per_call_ms = (time.perf_counter() - started) * 1000.0 / a.calls
        activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
        with torch.profiler.profile(activities=[activity]) as prof:
            for _ in range(a.calls):
                package(*args)
            sync()
    kernels = collections.Counter()
    counts = collections.Counter()
    for e in prof.key_averages():
        # On the GPU the kernels; on the CPU the operators the package calls out to.
        us = e.device_time_total if cuda else e.self_cpu_time_total
        if us > 0 and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA):
            kernels[e.key] += us / a.calls / 1000.0
            counts[e.key] += e.count // a.calls
    total = sum(kernels.values())
    groups = collections.Counter()
    for k, ms in kernels.items():
        groups[category(k)] += ms
    report = {
        "package": found[0], "batch": b, "frames": f, "per_call_ms": per_call_ms, "kernel_ms_per_call": total,
        "groups": {k: {"ms": v, "share": v / total} for k, v in groups.most_common()},
        "top": [{"kernel": k[:160], "ms": v, "share": v / total, "launches": counts[k]} for k, v in kernels.most_common(25)],
        "launches_per_call": sum(counts.values()),
    }
    print(f"estimator package, batch {b}, {f} frames: {per_call_ms:.2f} ms a call, "
          f"{total:.2f} ms of kernels, {report['launches_per_call']} launches")
    for k, v in groups.most_common():
        print(f"  {k:32s} {v:8.2f} ms  {100 * v / total:5.1f} %")
    for row in report["top"][:15]:
        print(f"  {row['ms']:7.2f} ms {100 * row['share']:5.1f} % x{row['launches']:<4d} {row['kernel'][:110]}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
