"""A converted CosyVoice3 directory as the compile tool reads it (tools/convert_cosyvoice.py wrote
it from an official CosyVoice3 directory): the `[cosyvoice3]` dimensions of its model.toml and the
weights of one stage from token2wav.safetensors, by the names the Rust port reads them
(src/model/cosyvoice3/)."""
import os
import sys


def read_dims(model_dir):
    import tomllib
    with open(os.path.join(model_dir, "model.toml"), "rb") as f:
        manifest = tomllib.load(f)
    dims = manifest.get("cosyvoice3")
    if not dims:
        sys.exit(f"{model_dir}/model.toml has no [cosyvoice3] section: not a converted CosyVoice3 model "
                 "(convert it with tools/convert_cosyvoice.py, or compile with --family cosyvoice2)")
    return manifest, dims


def stage_weights(model_dir, prefix):
    """The tensors of token2wav.safetensors under `prefix`, by their names after it."""
    from safetensors.torch import load_file
    weights = load_file(os.path.join(model_dir, "token2wav.safetensors"))
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def load_exactly(module, weights, what):
    """`weights` into `module`, every tensor by name and shape (strict): exits listing what is
    missing, unexpected or misshapen — a directory converted from another model, or by another
    converter, must not compile into a package that computes something else."""
    try:
        module.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        sys.exit(f"token2wav.safetensors does not fit the {what}: {e}")
    return module
