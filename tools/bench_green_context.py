"""What a CUDA green context does to two kinds of work sharing one GPU (issue 42, `[llm] decode_sms`).

A compute-bound stand-in for token2wav's flow (bf16 matmuls, M×K×N: 8,192³, or the flow's own
shape of 143,360×256×1,024 — 512 CFG rows × 280 frames through a 256 → 1,024 projection — on a
stream of a green context of N SMs, or of every SM) and a memory-bound stand-in for the LLM's
decode (`--decode reads`: reads of a 256-MiB tensor, one kernel each, on a stream of high priority
of the primary context), timed alone and at once. Prints one JSON line per setting: each side's seconds alone and together.

`--decode chain` models the real decode step instead (the reads above are large kernels that need
no free SM at a given moment; the real decode got 5-9 % of the GPU beside a bucket, h100g in
docs/PERFORMANCE.md): per step `--chain`
(400) tiny dependent kernels on a [512, 896] bf16 tensor, then the host waits for them (the picks'
round trip), `--decode-steps` times; its events span the host's waits, so its seconds are the
steps' wall time.

`--decode-on-rest`: the decode's stream is one of a green context of the SMs the flow's leaves
(tools/check_green_split.py makes both), so the two never share an SM — the stand-in of the worker's
`[llm] decode_on_its_sms`, removed on 2026-12-07 (docs/PERFORMANCE.md#2026-12-07-h100l-e2e).

At once, the flow's launches come from a thread of their own: CUDA takes only so many pending
launches before a launch blocks the host, and the runs of 2026-12-07 07:38 launched 3,000 matmuls
first from one thread, so the decode's launches most likely waited for most of them to finish.

    python3 tools/bench_green_context.py [--sms 0,104,112,120] [--shape 8192x8192x8192] [--decode reads|chain] [--out FILE]

`--sms 0`: no green context (both on ordinary streams, the decode's of high priority). Needs
torch's `torch.cuda.green_contexts` (2.10+) and a driver with green contexts.
"""

import argparse
import json
import threading
import time

import torch


def flow_work(a, b, steps):
    for _ in range(steps):
        torch.matmul(a, b)


def decode_work(x, steps):
    # Memory-bound: each step reads the tensor and writes a scalar.
    for _ in range(steps):
        x.sum()


def chain_work(y, steps, chain, stream):
    # Latency-bound: each kernel waits for the one before, and each step for the host.
    for _ in range(steps):
        for i in range(chain):
            if i % 2:
                y.mul_(0.999)
            else:
                y.add_(1e-3)
        stream.synchronize()


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
    p.add_argument("--decode", choices=["reads", "chain"], default="reads")
    p.add_argument("--decode-steps", type=int, default=None, help="2,000 reads, or 200 chained steps")
    p.add_argument("--chain", type=int, default=400, help="kernels per chained step")
    p.add_argument("--decode-on-rest", action="store_true", help="the decode on a green context of the SMs the flow's leaves")
    p.add_argument("--out")
    args = p.parse_args()
    if args.decode_steps is None:
        args.decode_steps = 2000 if args.decode == "reads" else 200
    dev = torch.device("cuda:0")
    total = torch.cuda.get_device_properties(0).multi_processor_count
    m, k, n = (int(v) for v in args.shape.split("x"))
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(64 * 1024 * 1024, device=dev)
    y = torch.randn(512, 896, device=dev, dtype=torch.bfloat16)
    decode_stream = torch.cuda.Stream(priority=-1)
    rows = []
    keep = []
    for sms in [int(s) for s in args.sms.split(",")]:
        decode_on = decode_stream
        if sms and args.decode_on_rest:
            from check_green_split import split_streams

            (flow_stream, _), (decode_on, _), _ = split_streams(sms)
        elif sms:
            from torch.cuda.green_contexts import GreenContext

            # The context must outlive its stream: a dropped GreenContext destroys it.
            green = GreenContext.create(sms, 0)
            keep.append(green)
            flow_stream = green.Stream()
        else:
            flow_stream = torch.cuda.Stream()
        flow = lambda: flow_work(a, b, args.flow_steps)  # noqa: E731
        if args.decode == "reads":
            decode = lambda: decode_work(x, args.decode_steps)  # noqa: E731
        else:
            decode = lambda: chain_work(y, args.decode_steps, args.chain, decode_on)  # noqa: E731
        for fn, stream in ((flow, flow_stream), (decode, decode_on)):
            timed(stream, fn)  # warm-up
        torch.cuda.synchronize()
        out = {"shape": args.shape, "decode": args.decode, "sms_total": total, "flow_sms": sms or total, "decode_on_rest": bool(sms and args.decode_on_rest)}
        for name, fn, stream in (("flow", flow, flow_stream), ("decode", decode, decode_on)):
            s, e = timed(stream, fn)
            torch.cuda.synchronize()
            out[f"{name}_alone_s"] = s.elapsed_time(e) / 1000
        wall = time.perf_counter()
        flow_events = []
        launcher = threading.Thread(target=lambda: flow_events.extend(timed(flow_stream, flow)))
        launcher.start()
        ds, de = timed(decode_on, decode)
        launcher.join()
        fs, fe = flow_events
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
