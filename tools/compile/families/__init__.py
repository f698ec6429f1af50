"""Model families the compile tool knows (`--family`, default cosyvoice2; cosyvoice3), each a module
of this folder over the shared machinery (export.py, packages.py, checks.py, layouts.py,
attention.py, vocoder.py: the HiFT body both families' `hift` stage is).
A family says what differs between models and nothing else:

    NAME                      the `--family` value
    STAGES                    its stages' names, in compile order (e.g. encoder, estimator, hift)
    DEFAULT_STAGES            what `--stages` compiles when not given
    DEFAULT_INDUCTOR_OPTIONS  [(stage or None, key, value)]: inductor settings every compile starts from
    read_dims(model_dir)      (manifest, the model.toml section of the family's dimensions); exits
                              when the directory is not a converted model of the family
    vocoder_precision(dims)   the vocoder's precision when `--vocoder-precision` is not given (None:
                              the family's default, which stage_precision resolves)
    stage_precision(stage, flow, vocoder)  which of the two a stage computes at
    add_arguments(parser)     the family's own flags (how its stages may be computed)
    variant(args, stage, device, precision)  those flags as a `Variant` of `stage`
    Variant                   how a stage is computed beside its weights and precision; `Variant()`
                              is the reference's own computation (what `--eager-check` compares
                              with); methods for_stage, is_reference, metadata (the package's
                              `voxbatch.*` facts), cli_args (the flags again, for `--check`'s child)
    stage_parts(stage, variant)  (build(model_dir, device, precision) → module,
                              example(batch, frames, device, seed=0) → inputs,
                              shapes(max_batch, limit) → torch.export dynamic shapes)
    length_limit(stage, max_frames)  the length a stage's package takes (frames, or tokens)
    stage_metadata(stage)     the stage's own package facts (e.g. the estimator's frame multiple)

A new family is a module here and a line in FAMILIES: cosyvoice2/ (the reference package's modules,
PyPI token2wav-cosyvoice, with voxbatch's forms of them) and cosyvoice3/ (voxbatch's own modules,
written from the Rust port: no package ships CosyVoice3's code)."""
import importlib

FAMILIES = {"cosyvoice2": "cosyvoice2", "cosyvoice3": "cosyvoice3"}


def load(name):
    """The family module named `name` (one of FAMILIES)."""
    return importlib.import_module(f".{FAMILIES[name]}", __name__)
