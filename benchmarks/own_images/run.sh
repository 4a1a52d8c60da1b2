#!/usr/bin/env bash
# The README's own-images command, as written, on a real folder nobody prepared for it: the UCI
# handwritten digits (8x8 grey, 1,437 train / 360 test, 10 classes; digits_folder.py), then eval
# and predict. Prints the preset line, the final accuracy and the wall time of the default run.
#   benchmarks/own_images/run.sh                 # default image size (32)
#   IMAGE_SIZE=16 benchmarks/own_images/run.sh   # the size the speed target names
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DIGITS=${DIGITS:-runs/digits}
OUT=${OUT:-runs/own-digits${IMAGE_SIZE:+-$IMAGE_SIZE}}
[ -d "$DIGITS/train" ] || $PY benchmarks/own_images/digits_folder.py "$DIGITS"
lscpu | grep "Model name"
echo "CPU flags: $(lscpu | grep -o 'avx[0-9a-z_]*\|amx[a-z_]*' | sort -u | tr '\n' ' ')"
start=$(date +%s)
$PY -m attnconv train --model sa-quadratic --dataset "folder:$DIGITS" ${IMAGE_SIZE:+--image-size $IMAGE_SIZE} \
    --no-progress --out "$OUT" --overwrite
echo "default run: $(( $(date +%s) - start )) s wall"
$PY -m attnconv eval "$OUT" | head -4
$PY -m attnconv predict "$OUT" "$DIGITS/test/3" --json | head -c 300; echo
