"""Whether the LLM's projections run on a green context of the SMs another green context leaves
(the shape of `[llm] decode_sms` with the decode on the remainder): F.linear with bias in bf16 —
cuBLASLt's bias epilogue, the call that failed with CUBLAS_STATUS_EXECUTION_FAILED in the worker
on an H100 on 2026-12-07 (docs/PERFORMANCE.md#2026-12-07-h100l-e2e) — at the decode's and the
prefill's row counts, on every SM, on the group and on the rest, alone and while the group runs
long matmuls, and captured in a CUDA graph on the rest. Each result is checked against the same
call on every SM. The streams are tools/check_green_split.py's. A subprocess per setting:

    python3 tools/check_green_linear.py [--sms 120] [--mode plain|no-lt|carveout]

`no-lt`: DISABLE_ADDMM_CUDA_LT=1 (addmm through cublasGemmEx, the bias added apart); `carveout`:
torch's SM carve-out (cuBLASLt told to target the rest's SM count). Prints one JSON line per call.

Run on an H100 on 2026-12-07 (docs/PERFORMANCE.md#2026-12-07-h100n): on the rest (12 SMs) every
projection of 1, 7 or 64 rows fails with CUBLAS_STATUS_EXECUTION_FAILED in all three modes, alone or
beside the group's matmuls; 512, 1,024 and 4,096 rows pass; every SM and the group pass everything.
Hence no `decode_on_its_sms`.
"""
import argparse
import json
import os
import subprocess
import sys
import threading

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_green_split import split_streams  # noqa: E402

ROWS = (1, 7, 64, 512, 1024, 4096)


def run(mode, sms):
    if mode == "carveout":
        torch._C._set_sm_carveout_experimental(sms)
    (group, _), (rest, rest_sms), every = split_streams(sms)
    torch.manual_seed(0)
    w = torch.randn(1152, 896, device="cuda", dtype=torch.bfloat16) / 30
    b = torch.randn(1152, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = []

    def one(where, stream, n, busy=False):
        x = torch.randn(n, 896, device="cuda", dtype=torch.bfloat16, generator=None)
        want = F.linear(x, w, b)
        torch.cuda.synchronize()
        stop = threading.Event()

        def load():
            with torch.cuda.stream(group):
                while not stop.is_set():
                    torch.matmul(big, big)
                    group.synchronize()

        t = threading.Thread(target=load) if busy else None
        if t:
            t.start()
        row = {"mode": mode, "where": where, "rows": n, "busy": busy}
        try:
            with torch.cuda.stream(stream):
                got = F.linear(x, w, b)
                for _ in range(50):
                    got = F.linear(x, w, b)
            stream.synchronize()
            row["max_err"] = float((got.float() - want.float()).abs().max())
            row["ok"] = row["max_err"] < 0.05
        except Exception as e:  # noqa: BLE001 — the error is the finding
            row["ok"], row["error"] = False, str(e).splitlines()[0][:200]
        stop.set()
        if t:
            t.join()
        out.append(row)
        print(json.dumps(row), flush=True)

    for n in ROWS:
        one("every", torch.cuda.current_stream(), n)
        one("group", group, n)
        one(f"rest({rest_sms})", rest, n)
        one(f"rest({rest_sms})", rest, n, busy=True)
    # A CUDA graph of the projection captured on the rest's stream, replayed there.
    row = {"mode": mode, "where": f"rest({rest_sms})", "rows": 512, "graph": True}
    try:
        x = torch.randn(512, 896, device="cuda", dtype=torch.bfloat16)
        want = F.linear(x, w, b)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(rest):
            F.linear(x, w, b)
            rest.synchronize()
            with torch.cuda.graph(g, stream=rest):
                y = F.linear(x, w, b)
            g.replay()
        rest.synchronize()
        row["max_err"] = float((y.float() - want.float()).abs().max())
        row["ok"] = row["max_err"] < 0.05
    except Exception as e:  # noqa: BLE001
        row["ok"], row["error"] = False, str(e).splitlines()[0][:200]
    print(json.dumps(row), flush=True)
    print(json.dumps({"mode": mode, "summary": True, "all_ok": all(r["ok"] for r in out) and row["ok"], "sms": every}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sms", type=int, default=120, help="the group's SMs (token2wav's)")
    p.add_argument("--mode", choices=("plain", "no-lt", "carveout", "all"), default="all")
    args = p.parse_args()
    if args.mode != "all":
        run(args.mode, args.sms)
        return
    for mode in ("plain", "no-lt", "carveout"):
        env = dict(os.environ)
        if mode == "no-lt":
            env["DISABLE_ADDMM_CUDA_LT"] = "1"
        r = subprocess.run([sys.executable, __file__, "--sms", str(args.sms), "--mode", mode], env=env, timeout=300)
        if r.returncode != 0:
            print(json.dumps({"mode": mode, "summary": True, "all_ok": False, "exit": r.returncode}), flush=True)


if __name__ == "__main__":
    main()
