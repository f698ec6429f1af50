"""A converted CosyVoice2 directory as the compile tool reads it (tools/convert_cosyvoice.py wrote
it): the `[cosyvoice2]` dimensions of its model.toml and the weights of one stage from
token2wav.safetensors."""
import os
import sys


def read_dims(model_dir):
    import tomllib
    with open(os.path.join(model_dir, "model.toml"), "rb") as f:
        manifest = tomllib.load(f)
    dims = manifest.get("cosyvoice2")
    if not dims:
        sys.exit(f"{model_dir}/model.toml has no [cosyvoice2] section: not a converted CosyVoice2 model")
    return manifest, dims


def stage_weights(model_dir, prefix):
    from safetensors.torch import load_file
    weights = load_file(os.path.join(model_dir, "token2wav.safetensors"))
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
