#!/usr/bin/env bash
# Table 1 on Fashion-MNIST at the recipe's full length: the five models of the paper, 12 epochs,
# float32 (every machine of the project has it; bf16 only some), several seeds. Two runs at a
# time, one thread each; every run checkpoints every 100 steps and is resumed where it stopped,
# so the script can be killed and started again at any time (finished runs are skipped).
#   nohup benchmarks/table1/run_all.sh > runs/table1/log.txt 2>&1 &
# Each run goes to $RUNS/<model>/seed<k>/ (weights stay there, out of git); its config.json,
# metrics.csv and heads.jsonl are copied to $DEST/<model>/seed<k>/ when it finishes.
# `attnconv table benchmarks/table1/*/*` prints the table from the copies.
# The 2-epoch bf16 table this replaces is in benchmarks/table1-2ep/.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
EPOCHS=${EPOCHS:-12}
RUNS=${RUNS:-runs/table1}
DEST=${DEST:-benchmarks/table1}
JOBS=${JOBS:-2}
EXTRA=${EXTRA:-}  # more train flags for every run (benchmarks/grid14/run_all.sh: --downsample 2)
mkdir -p "$RUNS"

job() {  # job MODEL SEED
  local model=$1 seed=$2
  local out=$RUNS/$model/seed$seed dest=$DEST/$model/seed$seed
  if [ -f "$dest/metrics.csv" ] && [ "$(($(wc -l < "$dest/metrics.csv") - 1))" -ge "$EPOCHS" ]; then
    echo "$(date -u +%H:%M:%S) skip $out (finished: $dest)"; return 0
  fi
  # The attention rows share the attention recipe; the ResNet keeps its own, stretched to the same length.
  if [ "$model" = resnet18 ]; then preset=fmnist-resnet-small; else preset=fmnist-sa-quadratic; fi
  mkdir -p "$(dirname "$out")"
  echo "$(date -u +%H:%M:%S) start $out"
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  $PY -m attnconv train --preset $preset --model "$model" --epochs "$EPOCHS" --seed "$seed" --workers 1 \
      --checkpoint-every 100 --no-progress --out "$out" --resume $EXTRA > "$out.log" 2>&1 \
    || { echo "$(date -u +%H:%M:%S) FAILED $out (see $out.log)"; return 0; }
  mkdir -p "$dest"
  cp "$out/config.json" "$out/metrics.csv" "$dest/"
  [ -f "$out/heads.jsonl" ] && cp "$out/heads.jsonl" "$dest/"
  echo "$(date -u +%H:%M:%S) done $out: $(tail -1 "$out/metrics.csv")"
}
export -f job
export PY EPOCHS RUNS DEST EXTRA

# One seed of every row first (the cheap ones early), then the further seeds; content is the costliest.
# RUN_LIST ("model seed" per line) replaces the list.
RUN_LIST=${RUN_LIST:-$(printf '%s\n' \
  "sa-quadratic 0" "resnet18 0" "sa-learned 0" "sa-quadratic-aniso 0" "sa-quadratic 1" "resnet18 1" \
  "sa-learned-content 0" "sa-quadratic 2" "resnet18 2" "sa-learned 1" "sa-quadratic-aniso 1" \
  "sa-learned-content 1")}
printf '%s\n' "$RUN_LIST" | xargs -P "$JOBS" -I{} bash -c 'job {}'
echo "$(date -u +%H:%M:%S) all done"
