"""Where a compiled package is filed and what it says about itself: DIR/compiled/<key>/<stage>.pt2,
key = <device arch>-torch<version>-<precision> (e.g. sm90-torch2.11.0-bf16, cpu-torch2.11.0-fp32;
on a CPU tf32 is fp32), with the same facts in the package's metadata (`voxbatch.*`: key, stage,
torch, precision, the weights' digest, its limits, how it was computed), so that a worker on
another GPU, torch or precision finds no package of its key and runs the eager port (a warning,
not a failure), and one made from other weights is not used (src/model/compiled.rs reads them).
A package is written beside its name and renamed once whole (`write`)."""
import hashlib
import json
import os

import torch

# Each precision's autocast dtype (None: fp32 computation; tf32 is fp32 with TF32 matmuls and
# convolutions on CUDA, `set_tf32`).
PRECISIONS = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_tf32(device, precision):
    """TF32 matmuls and convolutions on for precision tf32 on CUDA, off otherwise."""
    on = precision == "tf32" and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def package_key(device, precision):
    """The key a worker looks a package up by (src/model/compiled.rs builds the same)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm{major}{minor}"
    else:
        arch = "cpu"
        precision = "fp32" if precision == "tf32" else precision
    return f"{arch}-torch{torch.__version__.split('+')[0]}-{precision}"


def weights_digest(model_dir):
    """The first 16 hex digits of token2wav.safetensors' sha256: a worker uses a package only with
    the weights file it was made from (src/model/compiled.rs computes the same)."""
    digest = hashlib.sha256()
    with open(os.path.join(model_dir, "token2wav.safetensors"), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def package_path(model_dir, key, stage):
    """DIR/compiled/<key>/<stage>.pt2 (its folder made)."""
    out_dir = os.path.join(model_dir, "compiled", key)
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, f"{stage}.pt2")


def metadata(key, stage, precision, model_dir, limit, max_batch, stage_facts, variant_facts, tuning, inductor_options):
    """The package's `voxbatch.*` metadata: what it is (key, stage, torch, precision, the weights'
    digest), what it takes (`limit` frames — tokens for an encoder —, `max_batch` rows), the
    family's facts of the stage (e.g. the estimator's frame multiple) and how it was computed (the
    variant's fields, `--tuning`, the `--inductor-option` settings)."""
    facts = {"voxbatch.key": key, "voxbatch.stage": stage, "voxbatch.torch": torch.__version__.split("+")[0],
             "voxbatch.precision": precision, "voxbatch.weights": weights_digest(model_dir),
             "voxbatch.max_frames": str(limit), "voxbatch.max_batch": str(max_batch)}
    facts.update(stage_facts)
    facts.update(variant_facts)
    facts["voxbatch.tuning"] = tuning
    if inductor_options:
        facts["voxbatch.inductor_options"] = json.dumps(inductor_options, sort_keys=True)
    return facts


def write(exported, path, configs):
    """AOTInductor's package of `exported` at `path`, compiled with inductor's `configs`. Written
    beside its name and renamed once whole: a compile cut off (a time limit, a crash) leaves no
    `<stage>.pt2` for a worker to load, nor a truncated one over the last good package. (Under its
    own name in a hidden folder: the archive's root folder is named after the file.)"""
    partial = os.path.join(os.path.dirname(path), ".partial", os.path.basename(path))
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    torch._inductor.aoti_compile_and_package(exported, package_path=partial, inductor_configs=configs)
    os.replace(partial, path)
