#!/usr/bin/env bash
# Table 1 on Fashion-MNIST: the five models of the paper at one shared budget (2 epochs),
# bf16 autocast on the CPU, several seeds. Two runs at a time, one thread each.
#   nohup benchmarks/table1/run_all.sh > runs/table1/log.txt 2>&1 &
# Each run goes to runs/table1/<model>/seed<k>/ (weights stay there, out of git); its
# config.json and metrics.csv are copied to benchmarks/table1/<model>/seed<k>/.
# `attnconv table benchmarks/table1/*/*` prints the table from the copies.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
EPOCHS=${EPOCHS:-2}
mkdir -p runs/table1

job() {  # job MODEL SEED [extra flags]
  local model=$1 seed=$2; shift 2
  local name=$model
  case "$*" in *--no-amp*) name=$model-fp32 ;; esac
  local out=runs/table1/$name/seed$seed
  if [ "$model" = resnet18 ]; then preset=fmnist-resnet-small; else preset=fmnist-sa-quadratic; fi
  if [ "$model" = sa-learned ] || [ "$model" = sa-learned-content ]; then
    while [ ! -e runs/table1/go-learned ]; do sleep 20; done  # the authors' initialization has to land first
  fi
  echo "$(date -u +%H:%M:%S) start $out"
  $PY -m attnconv train --preset $preset --model $model --epochs "$EPOCHS" --seed "$seed" --amp --workers 1 \
      --checkpoint-every 100 --no-progress --out "$out" --resume "$@" > "$out.log" 2>&1 \
    || { echo "$(date -u +%H:%M:%S) FAILED $out (see $out.log)"; return 0; }
  mkdir -p "benchmarks/table1/$name/seed$seed"
  cp "$out/config.json" "$out/metrics.csv" "benchmarks/table1/$name/seed$seed/"
  echo "$(date -u +%H:%M:%S) done $out: $(tail -1 "$out/metrics.csv")"
}
export -f job
export PY EPOCHS

mkdirs() { for m in resnet18 sa-quadratic sa-quadratic-aniso sa-learned sa-learned-content sa-quadratic-fp32 resnet18-fp32; do mkdir -p runs/table1/$m; done; }
mkdirs
# The seeds of every row, then the bf16/float32 check of the attention preset.
printf '%s\n' \
  "resnet18 0" "sa-quadratic 0" "sa-quadratic-aniso 0" "resnet18 1" "sa-quadratic 1" "sa-quadratic-aniso 1" \
  "resnet18 2" "sa-quadratic 2" "sa-learned 0" "sa-learned-content 0" "sa-learned 1" "sa-learned-content 1" \
  "sa-quadratic 0 --no-amp" \
  | xargs -P 2 -I{} bash -c 'job {}'
echo "$(date -u +%H:%M:%S) all done"
