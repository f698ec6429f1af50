# Sourced by the scripts in scripts/device/: libtorch from the machine's torch, NVML, and the
# reference model of size $SIZE exported there (the GPU machine has torch but no cargo).
PY=${PY:-python3}
SIZE=${SIZE:-large}
source scripts/device/libtorch.sh
MODEL=/tmp/voxbatch-models/reference-$SIZE
[ -f "$MODEL/model.pt" ] || $PY tools/export_reference_model.py --size "$SIZE" --out "$MODEL"
