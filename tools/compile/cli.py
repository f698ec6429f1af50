"""Compiles a model family's token2wav stages of a converted voxbatch model directory into
AOTInductor packages (issues 16 and 43), each exported with a dynamic batch and length and compiled
by `torch._inductor.aoti_compile_and_package` for one device and precision:

- the stages, and how each may be computed, are the model family's (`--family`, default
  cosyvoice2: families/cosyvoice2/ — encoder, estimator, hift; cosyvoice3: families/cosyvoice3/ —
  estimator (the DiT), hift (the causal vocoder's body));
- each package is filed under DIR/compiled/<key>/<stage>.pt2, key = <device arch>-torch<version>-
  <precision>, with the same facts in its metadata (packages.py), so that a worker on another GPU,
  torch or precision finds no package of its key and runs the eager port;
- `--check`, `--eager-check`, `--cuda-kernels`: checks.py; `--tuning`, `--inductor-option`: export.py.

Needs the project venv's torch and, for cosyvoice2, the reference code (bootstrap installs both; on
the GPU machine scripts/device/run.sh carries them as wheels); cosyvoice3's modules are voxbatch's
own. The entry is tools/compile_token2wav.py.

Usage: compile_token2wav.py --model DIR [--family cosyvoice2|cosyvoice3] [--device cuda:0|cpu] [--stages estimator,hift]
                            [--attention auto|sdpa|flex|flash|cudnn]
                            [--precision bf16|fp16|fp32] [--vocoder-precision tf32|fp32|bf16|fp16]
                            [--max-frames 3000] [--max-batch 1024] [--tuning none|coordinate-descent|max-autotune]
                            [--layout reference|time-major|time-major-strided|time-major-strided-copy|time-major-cudnn|time-major-shift]
                            [--ff-gelu epilogue|exact] [--mish auto|exp|exact] [--qkv auto|separate|fused] [--hift-channel-multiple K]
                            [--hift-dilation auto|phases|dilated]
                            [--inductor-option [STAGE:]KEY=VALUE]... [--check | --eager-check | --cuda-kernels]
       (the flags between --max-batch and --inductor-option are cosyvoice2's; cosyvoice3 has --layout
       time-major|reference, --hift-channel-multiple K and --hift-dilation auto|phases|dilated)

CosyVoice3 on a GPU host, as a worker at bf16 runs it (its vocoder at the flow's precision unless
model.toml says otherwise):

    compile_token2wav.py --family cosyvoice3 --model models/cosyvoice3 --device cuda:0 --precision bf16 --check
"""
import argparse
import functools
import json
import sys
import traceback

import torch

from . import checks, export, families
from .packages import PRECISIONS


def inductor_option(text, stages):
    """`[STAGE:]KEY=VALUE` → (stage or None, key, value), the value read as a bool, int or float
    where it is one. The key must be one of torch._inductor.config's; a stage prefix (one of
    `stages`) limits the setting to that stage's compile."""
    stage, colon, rest = text.partition(":")
    if not colon or "=" in stage:
        stage, rest = None, text
    elif stage not in stages:
        raise argparse.ArgumentTypeError(f"{text!r}: {stage!r} is not a stage ({names(stages)})")
    key, sep, value = rest.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: [STAGE:]KEY=VALUE")
    import torch._inductor.config as inductor_config
    try:
        inductor_config.get_config_copy()[key]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{key!r} is not an inductor setting") from None
    for read in (lambda v: {"true": True, "false": False}[v.lower()], int, float):
        try:
            return stage, key, read(value)
        except (KeyError, ValueError):
            pass
    return stage, key, value


def names(stages):
    """"encoder, estimator or hift"."""
    return f"{', '.join(stages[:-1])} or {stages[-1]}" if len(stages) > 1 else stages[0]


def stage_inductor_options(options, stage):
    """The `--inductor-option` settings that apply to `stage`'s compile, as a dict."""
    return {key: value for only, key, value in options if only in (None, stage)}


def parser(family):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--family", default="cosyvoice2", choices=sorted(families.FAMILIES),
                    help="the model family whose stages are compiled (default cosyvoice2; cosyvoice3 for a "
                         "cosyvoice3-token2wav directory)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--stages", default=family.DEFAULT_STAGES, help=family.STAGES_HELP)
    ap.add_argument("--precision", default="bf16", choices=sorted(PRECISIONS), help="the flow's (encoder, estimator)")
    ap.add_argument("--vocoder-precision", choices=sorted(PRECISIONS),
                    help="the vocoder's (hift); default model.toml's (cosyvoice3 without one: the flow's)")
    ap.add_argument("--max-frames", type=int, default=3000, help="longest mel (frames, 50 a second) a package takes")
    ap.add_argument("--max-batch", type=int, default=1024, help="largest batch (CFG doubles the flow's batch)")
    family.add_arguments(ap)
    ap.add_argument("--tuning", default="none", choices=sorted(export.TUNINGS),
                    help="inductor's compile-time search: none (default), coordinate-descent, max-autotune")
    ap.add_argument("--inductor-option", action="append", default=[], metavar="[STAGE:]KEY=VALUE",
                    type=functools.partial(inductor_option, stages=family.STAGES),
                    help="an inductor setting for this compile (repeatable; e.g. realize_reads_threshold=2, or "
                         "hift:realize_reads_threshold=2 for one stage's compile alone), recorded in the package's metadata; "
                         f"after the defaults ({' '.join(f'{s}:{k}={v}' for s, k, v in family.DEFAULT_INDUCTOR_OPTIONS)}), which "
                         "a later setting of the same key overrides (estimator:freezing=False)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--eager-check", action="store_true",
                    help="no compile: print each stage's eager module's worst difference from the reference's own")
    ap.add_argument("--cuda-kernels", action="store_true",
                    help="no compile: list the Triton kernels a CUDA compile would launch for one call (each named "
                         "after the ops it fuses, as GPU profiles name them), generated on this machine without a GPU "
                         "(tools/compile/fake_cuda.py; static shapes --kernels-batch × --kernels-frames)")
    ap.add_argument("--kernels-batch", type=int, default=4, help="--cuda-kernels: rows of the call (CFG doubles the flow's)")
    ap.add_argument("--kernels-frames", type=int, default=104,
                    help="--cuda-kernels: mel frames of the call (tokens for the encoder; a multiple of 8 for the estimator)")
    ap.add_argument("--check-package", metavar="PT2", help=argparse.SUPPRESS)  # --check's child process
    return ap


def main(argv=None):
    # The family first: its stages and flags make the rest of the parser.
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--family", default="cosyvoice2", choices=sorted(families.FAMILIES))
    known, _ = first.parse_known_args(argv)
    family = families.load(known.family)
    a = parser(family).parse_args(argv)
    a.inductor_option = family.DEFAULT_INDUCTOR_OPTIONS + a.inductor_option
    device = torch.device(a.device)
    _, dims = family.read_dims(a.model)
    vocoder = a.vocoder_precision or family.vocoder_precision(dims)
    stages = a.stages.split(",")
    for stage in stages:
        if stage not in family.STAGES:
            sys.exit(f"unknown stage {stage!r}: {names(family.STAGES)}")
    failed = []
    for stage in stages:
        precision = family.stage_precision(stage, a.precision, vocoder)
        # --cuda-kernels lists what a CUDA compile builds, whatever --device says: `auto` resolves as on CUDA.
        variant = family.variant(a, stage, torch.device("cuda") if a.cuda_kernels else device, precision)
        if a.eager_check and variant.is_reference(stage):
            print(json.dumps({"stage": stage, "eager_check": "computed as the reference computes it: nothing to compare"}))
        elif a.eager_check:
            checks.check_eager(family, stage, a.model, device, precision, variant)
        elif a.cuda_kernels:
            checks.list_cuda_kernels(family, stage, a.model, precision, variant, stage_inductor_options(a.inductor_option, stage),
                                     a.kernels_batch, a.kernels_frames)
        elif a.check_package:
            checks.check_package(family, stage, a.model, device, precision, variant, a.check_package)
        else:
            # One stage's failed compile does not stop the next stage's: the report says which failed.
            try:
                export.compile_stage(family, stage, a.model, device, precision, a.max_batch, a.max_frames, a.check, variant,
                                     a.tuning, stage_inductor_options(a.inductor_option, stage))
            except Exception as e:  # noqa: BLE001 — reported, and the exit status says so
                traceback.print_exc()
                print(json.dumps({"stage": stage, "failed": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
                failed.append(stage)
    if failed:
        sys.exit(f"compile failed for: {', '.join(failed)}")
