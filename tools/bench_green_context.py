"""What a CUDA green context does to two kinds of work sharing one GPU (issue 42, `[llm] decode_sms`).

A compute-bound stand-in for token2wav's flow (bf16 matmuls, M×K×N: 8,192³, or the flow's own
shape of 143,360×256×1,024 — 512 CFG rows × 280 frames through a 256 → 1,024 projection — on a
stream of a green context of N SMs, or of every SM) and a memory-bound stand-in for the LLM's decode (a chain of
small reads of a 256-MiB tensor, on a stream of high priority of the primary context), timed
alone and at once. Prints one JSON line per setting: each side's seconds alone and together.

    python3 tools/bench_green_context.py [--sms 0,104,112,120] [--shape 8192x8192x8192] [--out FILE]

`--sms 0`: no green context (both on ordinary streams, the decode's of high priority). Needs
torch's `torch.cuda.green_contexts` (2.10+) and a driver with green contexts.
"""

import argparse
import json
import time

import torch


def flow_work(a, b, steps):
    for _ in range(steps):
        torch.matmul(a, b)


def decode_work(x, steps):
    # Memory-bound: each step reads the tensor and writes a scalar.
    for _ in range(steps):
        x.sum()


def timed(stream, fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        fn()
        end.record()
    return start, end


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sms", default="0,104,112,120")
    p.add_argument("--flow-steps", type=int, default=200)
    p.add_argument("--shape", default="8192x8192x8192", help="the flow stand-in's matmul, MxKxN")
    p.add_argument("--decode-steps", type=int, default=2000)
    p.add_argument("--out")
    args = p.parse_args()
    dev = torch.device("cuda:0")
    total = torch.cuda.get_device_properties(0).multi_processor_count
    m, k, n = (int(v) for v in args.shape.split("x"))
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(64 * 1024 * 1024, device=dev)
    decode_stream = torch.cuda.Stream(priority=-1)
    rows = []
    keep = []
    for sms in [int(s) for s in args.sms.split(",")]:
        if sms:
            from torch.cuda.green_contexts import GreenContext

            # The context must outlive its stream: a dropped GreenContext destroys it.
            green = GreenContext.create(sms, 0)
            keep.append(green)
            flow_stream = green.Stream()
        else:
            flow_stream = torch.cuda.Stream()
        flow = lambda: flow_work(a, b, args.flow_steps)  # noqa: E731
        decode = lambda: decode_work(x, args.decode_steps)  # noqa: E731
        for fn, stream in ((flow, flow_stream), (decode, decode_stream)):
            timed(stream, fn)  # warm-up
        torch.cuda.synchronize()
        out = {"shape": args.shape, "sms_total": total, "flow_sms": sms or total}
        for name, fn, stream in (("flow", flow, flow_stream), ("decode", decode, decode_stream)):
            s, e = timed(stream, fn)
            torch.cuda.synchronize()
            out[f"{name}_alone_s"] = s.elapsed_time(e) / 1000
        wall = time.perf_counter()
        fs, fe = timed(flow_stream, flow)
        ds, de = timed(decode_stream, decode)
        torch.cuda.synchronize()
        out["together_wall_s"] = time.perf_counter() - wall
        out["flow_together_s"] = fs.elapsed_time(fe) / 1000
        out["decode_together_s"] = ds.elapsed_time(de) / 1000
        rows.append(out)
        print(json.dumps(out), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
