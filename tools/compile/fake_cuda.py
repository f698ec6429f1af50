"""Inductor's CUDA code for a module, generated on a machine without a GPU: which Triton kernels a
compile would launch, and what each fuses, without spending device time.

The module runs on fake CUDA tensors (torch's FakeTensorMode: shapes, dtypes and devices, no
data) through `torch.export` and inductor's lowering, fusion and code generation — the same
decisions a GPU compile makes — and stops where Triton would compile the first kernel (it needs
a driver). What comes back is the generated wrapper: every kernel's name (inductor names a kernel
after the ops it fuses, as the GPU's profiles show them) and each launch in call order.

It works by standing in for the few queries inductor makes of a real device (its properties, bf16
support, Triton's backend), an H100/H200-like sm90 part; they are torch internals, checked with
torch 2.11.0 only — where one has moved, the listing stops with
inductor's "no NVIDIA driver" error and says it wrote no wrapper. Nothing here is timed or run: the
kernels' speed is the GPU's to say (`scripts/device/run.sh token2wav`).

Neighbours: checks.py (`--cuda-kernels`: `list_cuda_kernels` builds a stage as it would compile it
and calls `cuda_kernels` here, then checks that the export holds nothing off the GPU),
tools/make_parity_fixtures.py (`move_plain_tensors`, shared with the real compile).
"""
import glob
import os
import re
import types

import torch

import make_parity_fixtures as mpf

# An sm90 part as inductor asks about it (heuristics read the SM count and shared memory).
SM90 = types.SimpleNamespace(
    name="NVIDIA H200 (fake)", major=9, minor=0, multi_processor_count=132, total_memory=140 << 30,
    max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, warp_size=32,
    shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472, shared_memory_per_block=49152,
    max_threads_per_block=1024, L2_cache_size=50 << 20, gcnArchName="", clock_rate=1980000,
    memory_clock_rate=2619000, memory_bus_width=6144, uuid="fake", is_integrated=False)


def patch():
    """Stands in for the device queries code generation makes; code generation only — never call
    this in a process that runs anything on a GPU."""
    import torch._dynamo.device_interface as device_interface
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config
    import torch._inductor.scheduler as scheduler
    import torch.cuda.amp.common as amp_common
    import torch.utils._triton as triton_utils

    props = lambda device=None: SM90  # noqa: E731
    torch.cuda.get_device_properties = props
    torch.cuda.get_device_capability = lambda device=None: (SM90.major, SM90.minor)
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    cuda = device_interface.CudaInterface
    cuda.get_device_properties = staticmethod(props)
    cuda.Worker.get_device_properties = staticmethod(props)
    cuda.get_compute_capability = staticmethod(lambda device=None: SM90.major * 10 + SM90.minor)
    cuda.is_available = staticmethod(lambda: True)
    cuda.current_device = staticmethod(lambda: 0)
    cuda.is_bf16_supported = staticmethod(lambda including_emulation=False: True)
    # autocast("cuda") would switch itself off without a driver; the bf16 check would stop the compile.
    amp_common.amp_definitely_not_available = lambda: False
    compile_fx._check_triton_bf16_support = lambda graph: None
    scheduler.has_triton = lambda: True
    triton_utils.triton_hash_with_backend = lambda: "fake-cuda"
    # Folding constants and timing padded matmuls run real CUDA ops at compile time (the packages'
    # dynamic shapes are not padded anyway).
    inductor_config.joint_graph_constant_folding = False
    inductor_config.shape_padding = False
    inductor_config.compile_threads = 1  # kernels compiled (and refused) after the wrapper is written


def to_fake_cuda(module, inputs):
    """`module` (on the CPU) and `inputs` as fake CUDA tensors, with the mode that holds them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        # Plain tensor attributes too (a position table the reference moves on its first call).
        module = mpf.move_plain_tensors(module.to("cuda"), "cuda")
        return mode, module, tuple(i.to("cuda") for i in inputs)


def cuda_kernels(module, inputs, inductor_options=None, keep_wrapper=None):
    """The Triton kernel launches inductor generates for one call of `module(*inputs)` on CUDA:
    (launches in call order — kernel names —, extern calls such as cuBLAS matmuls and
    convolutions, the exported program, for its constants' devices). `module` must be on the CPU
    and run its autocast under device type "cuda"; call `patch()` first. `keep_wrapper`: a path to copy the generated wrapper (all kernels' code) to."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch._inductor.utils import fresh_cache
    mode, module, inputs = to_fake_cuda(module, inputs)
    with mode, torch.no_grad():
        exported = torch.export.export(module, inputs)
        graph = exported.module()
    # A fresh cache: the one wrapper module in it is this compile's.
    with fresh_cache(), torch.no_grad(), torch._inductor.config.patch(dict(inductor_options or {})):
        try:
            compile_fx(graph, list(inputs))
            stopped = "nothing: it compiled"
        except Exception as e:  # Triton cannot compile without a driver: the code is written by then
            stopped = str(e)
        wrappers = [p for p in glob.glob(os.path.join(cache_dir(), "**", "*.py"), recursive=True) if "def call(" in open(p).read()]
        if len(wrappers) != 1:
            raise RuntimeError(f"inductor wrote {len(wrappers)} wrapper modules, not one (it stopped at: {stopped[:300]})")
        text = open(wrappers[0]).read()
    if keep_wrapper:
        with open(keep_wrapper, "w") as f:
            f.write(text)
    launches = re.findall(r"^\s+(triton_\w+)\.run\(", text, re.M)
    extern = re.findall(r"\b(extern_kernels\.\w+|torch\.ops\.aten\.\w+(?:\.\w+)?)\(", text)
    return launches, extern, exported
