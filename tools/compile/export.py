"""One stage of a family exported and packaged: `torch.export` with a dynamic batch and length
(the family's shapes), refused if it holds anything off its device (`checks.require_on_device`),
then `torch._inductor.aoti_compile_and_package` for one device and precision with the package's
metadata (packages.py), and its report printed — then, with `--check`, its checks (checks.py).

`--tuning` asks inductor to search kernel configurations at compile time: `coordinate-descent`
tunes each generated kernel's block sizes, `max-autotune` also tries Triton matmul templates (not
yet measured), which can take the FF's GELU into the matmul's epilogue. Both lengthen the compile.
Measured on the H200 (2026-12-04, time-major, batch 128): coordinate-descent made token2wav
*slower*, 744.6 against 840.5 — the FF's GELU kernel took 0.35 s instead of 0.11 (the search tunes
at the export's small example shapes, the package runs at batch 256 × 500 frames) — so `none`
stays the default.

`--inductor-option [STAGE:]KEY=VALUE` (repeatable) passes one of inductor's settings to the
compile (with a stage prefix, e.g. `estimator:freezing=True`, to that stage's alone), after the
family's defaults (`DEFAULT_INDUCTOR_OPTIONS`, both families': `estimator:freezing=True`, the
estimator's weights folded into its package at the autocast dtype; a later setting of the same key
overrides it), and records them in the package's metadata (`voxbatch.inductor_options`): e.g.
`realize_reads_threshold=2`, so that a producer read by three consumers (the time-major
estimator's side-by-side frames) is written once rather than recomputed in each.
"""
import json
import time

import torch

from . import checks, packages

# inductor settings per `--tuning`.
TUNINGS = {
    "none": {},
    "coordinate-descent": {"coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "coordinate_descent_tuning": True},
}


def attention_ops(exported):
    """Which attention the exported graph holds (a fused SDPA kernel, or softmax and matmuls):
    each attention or softmax op with its count."""
    ops = {}
    for graph_module in exported.graph_module.modules():  # autocast regions are submodules
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            name = str(node.target)
            if node.op == "call_function" and ("attention" in name or "softmax" in name):
                ops[name] = ops.get(name, 0) + 1
    return ops


def compile_stage(family, stage, model_dir, device, precision, max_batch, max_frames, check, variant, tuning="none",
                  inductor_options=None):
    """Exports and packages one stage of `family`; prints its report, then (`check`) the worst
    difference between the package and the eager module on two random batches (and, for a stage
    computed in another form than the reference's, between its eager module and the reference's)."""
    build, example, shapes = family.stage_parts(stage, variant)
    packages.set_tf32(device, precision)
    key = packages.package_key(device, precision)
    module = build(model_dir, device, precision)
    started = time.time()
    with torch.no_grad():
        limit = family.length_limit(stage, max_frames)
        exported = torch.export.export(module, example(4, 104, device), dynamic_shapes=shapes(max_batch, limit))
        checks.require_on_device(exported, device.type, stage)
        # Which attention the graph holds: the report says.
        ops = attention_ops(exported)
        path = packages.package_path(model_dir, key, stage)
        metadata = packages.metadata(key, stage, precision, model_dir, limit, max_batch, family.stage_metadata(stage),
                                     variant.metadata(stage), tuning, inductor_options)
        configs = {"aot_inductor.metadata": metadata, **TUNINGS[tuning], **(inductor_options or {})}
        packages.write(exported, path, configs)
    report = {"package": path, "key": key, "compile_seconds": time.time() - started, "attention_ops": ops, **metadata}
    # Said before the check: a failure there must not hide that (and what) the compile wrote.
    print(json.dumps(report), flush=True)
    if check:
        # Another variant's eager module against the reference's own (SDPA, reference layout), then
        # the package against the eager module (in a child process).
        if not variant.is_reference(stage):
            checks.check_eager(family, stage, model_dir, device, precision, variant, module)
        checks.check_package_in_child(family, stage, model_dir, device, precision, variant, path)
