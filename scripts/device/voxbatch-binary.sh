# Sourced by the scripts in scripts/device/ (from the repository root), after libtorch.sh: unpacks
# the carried voxbatch binary ($BIN_XZ, default .t2w/voxbatch.xz from pack-gpu.sh) to $BIN (default
# /tmp/voxbatch) through a temporary file and a rename, so a copy another step still runs is not
# overwritten in place; exits the script when there is none.
BIN=${BIN:-/tmp/voxbatch}
{ xz -dc "${BIN_XZ:-.t2w/voxbatch.xz}" > "$BIN.unpacking" && chmod +x "$BIN.unpacking" && mv -f "$BIN.unpacking" "$BIN"; } || {
  echo "no voxbatch binary at ${BIN_XZ:-.t2w/voxbatch.xz} (scripts/device/pack-gpu.sh, then carry it)"
  exit 1
}
