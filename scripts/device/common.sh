# Sourced by the scripts in scripts/device/: libtorch from the machine's torch, NVML, and the
# reference model of size $SIZE exported there (the GPU machine has torch but no cargo).
PY=${PY:-python3}
SIZE=${SIZE:-large}
TORCH_LIB=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
export LD_LIBRARY_PATH="$TORCH_LIB:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
MODEL=/tmp/voxbatch-models/reference-$SIZE
[ -f "$MODEL/model.pt" ] || $PY tools/export_reference_model.py --size "$SIZE" --out "$MODEL"
