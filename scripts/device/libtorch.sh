# Sourced by the scripts in scripts/device/ (from the repository root): the carried voxbatch
# binaries link libtorch from the GPU machine's own torch ($PY, default python3) and NVML from the
# driver's folder.
TORCH_LIB=$(${PY:-python3} -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
export LD_LIBRARY_PATH="$TORCH_LIB:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
