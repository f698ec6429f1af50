# Sourced by the Makefile and scripts: the environment voxbatch builds and runs in.
# libtorch comes from the project venv's torch (tch 0.24 pairs with torch 2.11.0 exactly).
VOXBATCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VOXBATCH_ROOT
export PATH="$VOXBATCH_ROOT/.venv/bin:$HOME/.cargo/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
TORCH_LIB="$VOXBATCH_ROOT/.venv/lib/python3.11/site-packages/torch/lib"
if [ -d "$VOXBATCH_ROOT/.venv" ]; then
  TORCH_LIB="$(ls -d "$VOXBATCH_ROOT"/.venv/lib/python3*/site-packages/torch/lib 2>/dev/null | head -n1)"
fi
export LD_LIBRARY_PATH="${TORCH_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# dev_binary: target/debug/voxbatch as the dev profile builds it (optimised; nothing to do when it
# is built). The test profile (Cargo.toml) compiles voxbatch unoptimised into the same folder and
# cargo links target/debug/voxbatch to the profile built last, so after `make test` it is the
# test build until this runs: what scripts that run or pack the binary call first.
dev_binary() { cargo build --quiet --bin voxbatch; }
