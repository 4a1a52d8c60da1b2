#!/usr/bin/env bash
# The checks that need a CUDA device, in one run, each step under its own time limit:
#   tests/test_cuda.py (the layer, conversion, models, capture, training, resume, Run, eval, predict, bench on the
#   device against the CPU), then `attnconv bench --device cuda --quick --only matmul,layer,model`, then one epoch of the Fashion-MNIST
#   attention preset in float32 and under --amp (when the data is in DATA_DIR).
# usage: benchmarks/gpu_check.sh OUTDIR [DATA_DIR]      (from the repository root; python3 has torch with CUDA)
# Writes OUTDIR/machine.txt, tests.log, bench.md, bench.log, train.log.
set -u
out=${1:?usage: benchmarks/gpu_check.sh OUTDIR [DATA_DIR]}
data=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  lscpu | grep -E '^Model name|^CPU\(s\)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

echo "== tests/test_cuda.py"
timeout "${TESTS_S:-150}" $py -m pytest -q -p no:cacheprovider tests/test_cuda.py --durations=10 -W ignore::DeprecationWarning \
  > "$out/tests.log" 2>&1
echo "rc $?" >> "$out/tests.log"
tail -n 25 "$out/tests.log"

echo "== attnconv bench --device cuda --quick --only matmul,layer,model"
timeout "${BENCH_S:-180}" $py -m attnconv bench --device cuda --quick --only matmul,layer,model --markdown "$out/bench.md" \
  > "$out/bench.log" 2>&1
echo "rc $?" >> "$out/bench.log"
tail -n 40 "$out/bench.log"

if [ -n "$data" ]; then
  for amp in "" "--amp"; do
    echo "== attnconv train --model sa-quadratic --dataset fashion-mnist --device cuda --epochs 1 $amp" >> "$out/train.log"
    rm -rf /tmp/gpu-check-run
    timeout "${TRAIN_S:-50}" $py -m attnconv train --model sa-quadratic --dataset fashion-mnist --data-dir "$data" --device cuda --epochs 1 \
      --no-progress $amp --out /tmp/gpu-check-run >> "$out/train.log" 2>&1
    echo "rc $?" >> "$out/train.log"
  done
  tail -n 20 "$out/train.log"
fi
