"""Whether the CUDA driver makes green contexts of both shares of an SM split (`[llm] decode_sms`
with the decode on the remainder, as the worker's `decode_on_its_sms` ran it until its removal on
2026-12-07: its matmuls failed in cuBLAS on an H100, docs/PERFORMANCE.md#2026-12-07-h100l-e2e), and how fast 20
bf16 matmuls of 8,192³ run on every SM, on the group and on the remainder. Through the driver API
with ctypes, as csrc/cuda_stream.cpp calls it (CUdevResource: the SM count at byte 96, the layout of
CUDA 12.4+ and 13).

    python3 tools/check_green_split.py [--sms 120]
"""
import argparse
import ctypes as C
import time

import torch

CU_DEV_RESOURCE_TYPE_SM = 1
CU_GREEN_CTX_DEFAULT_STREAM = 1
CU_STREAM_NON_BLOCKING = 1


def check(result, what):
    if result:
        raise SystemExit(f"{what}: CUresult {result}")


def sm_count(resource):
    return int.from_bytes(resource.raw[96:100], "little")


def timed_matmuls(a, stream, n=20):
    with torch.cuda.stream(stream):
        torch.matmul(a, a)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            torch.matmul(a, a)
        torch.cuda.synchronize()
    return time.perf_counter() - start


def split_streams(sms, device=0):
    """Streams of two green contexts of `device`: a group of `sms` SMs and the rest of the split,
    as torch streams, with the SM count of each. The contexts are never destroyed (the process's life)."""
    torch.zeros(1, device=f"cuda:{device}")  # the primary context, before the green ones
    cu = C.CDLL("libcuda.so.1")
    dev = C.c_int()
    check(cu.cuDeviceGet(C.byref(dev), device), "cuDeviceGet")
    every = C.create_string_buffer(256)
    check(cu.cuDeviceGetDevResource(dev, every, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    group, rest, groups = C.create_string_buffer(256), C.create_string_buffer(256), C.c_uint(1)
    check(cu.cuDevSmResourceSplitByCount(group, C.byref(groups), every, rest, 0, sms), "cuDevSmResourceSplitByCount")
    streams = []
    for name, share in (("group", group), ("rest", rest)):
        desc, context, stream = C.c_void_p(), C.c_void_p(), C.c_void_p()
        check(cu.cuDevResourceGenerateDesc(C.byref(desc), share, 1), f"{name}: cuDevResourceGenerateDesc")
        check(cu.cuGreenCtxCreate(C.byref(context), desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), f"{name}: cuGreenCtxCreate")
        check(cu.cuGreenCtxStreamCreate(C.byref(stream), context, CU_STREAM_NON_BLOCKING, 0), f"{name}: cuGreenCtxStreamCreate")
        streams.append((torch.cuda.ExternalStream(stream.value, device=f"cuda:{device}"), sm_count(share)))
    return streams[0], streams[1], sm_count(every)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sms", type=int, default=120, help="the group's SMs (token2wav's)")
    args = p.parse_args()
    (group, group_sms), (rest, rest_sms), every = split_streams(args.sms)
    print("SMs: all", every, "group", group_sms, "rest", rest_sms, flush=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    print("every SM: 20 matmuls 8192^3 s", round(timed_matmuls(a, torch.cuda.Stream()), 4), flush=True)
    for name, stream in (("group", group), ("rest", rest)):
        print(f"{name}: 20 matmuls 8192^3 s", round(timed_matmuls(a, stream), 4), flush=True)


if __name__ == "__main__":
    main()
