"""What the compile tool checks beside compiling:
- `require_on_device`: every export, before it is compiled or listed, holds nothing off its device;
- `--eager-check` (`check_eager`): a stage's eager module in the chosen forms against the
  reference's own (cosyvoice3: the port's channel-major body), no export — seconds on a CPU;
  tests/integration/compiled.rs and cosyvoice3_compiled.rs run it per variant;
- `--check` (`check_package_in_child`): after a compile, the package against the eager module on
  random inputs, the worst difference printed. The package is loaded in a child process (this tool
  again, with `--check-package`), because loading one into Python has killed the process on the
  H200 host (a segfault, which then cost the stages after it their compile): a crash there is
  reported and the next stage still compiles;
- `--cuda-kernels` (`list_cuda_kernels`): the Triton kernels a CUDA compile of a stage would
  launch, generated on this machine without a GPU (fake_cuda.py; code generation only).
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

import torch

from . import packages

# The tool's entry (tools/compile_token2wav.py): what `--check` runs again in a child process.
ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compile_token2wav.py")


def require_on_device(exported, device_type, stage):
    """Refuses an exported program that holds a weight, buffer or lifted constant off the device it
    is compiled for: AOTInductor loads every constant onto the package's device, so a CPU constant
    in a CUDA program (a position table `Module.to` did not move, a default argument's
    `torch.zeros`) is code for one device reading another's memory — a crash at run time, where
    it cannot say why (docs/PERFORMANCE.md: the encoder package's SIGSEGV on an H100, 2026-12-05)."""
    tensors = {**exported.state_dict, **exported.constants}
    off = sorted(f"{name} ({t.device})" for name, t in tensors.items()
                 if isinstance(t, torch.Tensor) and t.device.type != device_type)
    if off:
        raise RuntimeError(f"the {stage} export holds {len(off)} tensor(s) off {device_type}: {', '.join(off[:5])}")


def worst_difference(a, b, example, device):
    """The largest absolute difference between `a` and `b` on two random batches of `example`."""
    worst = 0.0
    with torch.no_grad():
        for batch, frames in [(2, 40), (6, 136)]:
            args = example(batch, frames, device, seed=batch)
            worst = max(worst, (a(*args) - b(*args)).abs().max().item())
    return worst


def check_eager(family, stage, model_dir, device, precision, variant, module=None):
    """Prints the worst difference between `variant`'s eager module and the reference's own
    (`--eager-check`: no export, seconds on a CPU; tests/integration/compiled.rs and
    cosyvoice3_compiled.rs run it for each variant)."""
    build, example, _ = family.stage_parts(stage, variant)
    packages.set_tf32(device, precision)
    module = module or build(model_dir, device, precision)
    reference = family.stage_parts(stage, family.Variant())[0](model_dir, device, precision)
    worst = worst_difference(module, reference, example, device)
    print(json.dumps({"stage": stage, **variant.metadata(stage), "max_abs_difference_vs_reference_eager": worst}), flush=True)


def check_package_in_child(family, stage, model_dir, device, precision, variant, path):
    """Runs this tool's `--check-package` in a child process (a package loaded into Python has
    killed the process on the H200 host) and says how it ended."""
    args = [sys.executable, ENTRY, "--family", family.NAME, "--model", model_dir, "--device", str(device), "--stages", stage,
            "--precision", precision, "--vocoder-precision", precision, *variant.cli_args(), "--check-package", path]
    done = subprocess.run(args, check=False)
    if done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        print(json.dumps({"package": path, "check": f"loading the package in Python failed ({how}); the package stays: "
                          "the worker loads it through libtorch's C++ loader and compares it with the eager port "
                          "(tests/compiled.rs)"}), flush=True)


def check_package(family, stage, model_dir, device, precision, variant, path):
    """Loads the package at `path` and prints its worst difference from the eager module."""
    build, example, _ = family.stage_parts(stage, variant)
    packages.set_tf32(device, precision)
    module = build(model_dir, device, precision)
    loaded = torch._inductor.aoti_load_package(path)
    worst = worst_difference(loaded, module, example, device)
    print(json.dumps({"package": path, "max_abs_difference_vs_eager": worst}), flush=True)


def list_cuda_kernels(family, stage, model_dir, precision, variant, inductor_options=None, batch=4, frames=104):
    """Prints the Triton kernels a CUDA compile of `stage` would launch for one call of `batch` rows
    and `frames` (static shapes), generated on this machine without a GPU (fake_cuda.py): each
    kernel's name (the ops it fuses) with its launches, the extern calls, the wrapper's path."""
    from . import fake_cuda
    fake_cuda.patch()
    build, example, _ = family.stage_parts(stage, variant)
    module = build(model_dir, torch.device("cpu"), precision)
    module.device_type = "cuda"  # its autocast, as on the GPU
    wrapper = os.path.join(tempfile.gettempdir(), f"cuda-kernels-{stage}.py")
    launches, extern, exported = fake_cuda.cuda_kernels(module, example(batch, frames, "cpu"), inductor_options, wrapper)
    require_on_device(exported, "cuda", stage)
    print(json.dumps({"stage": stage, "precision": precision, **variant.metadata(stage), "batch": batch, "frames": frames,
                      "triton_launches": len(launches), "extern_calls": len(extern),
                      "kernels": collections.Counter(launches), "extern": collections.Counter(extern), "wrapper": wrapper}))
