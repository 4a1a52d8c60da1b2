#!/usr/bin/env bash
# The paper's central finding under several optimizers (issue: the paper's own optimizer).
# Every run is the Fashion-MNIST attention preset's model (hidden 96, 4 layers, 7x7 tokens),
# float32, with heads.jsonl; one folder per recipe:
#   sgd          --preset fmnist-sa-quadratic-sgd (the paper's SGD lr 0.1, momentum 0.9, wd 1e-4, batch 100)
#   adamw-als10  --preset fmnist-sa-quadratic --attention-lr-scale 10   (centers and widths at 10x the lr)
#   adamw-als100 --preset fmnist-sa-quadratic --attention-lr-scale 100
#   R-h16        recipe R with --heads 16 (the paper's appendix; 4x4 offsets)
#   R-48ep       recipe R for 48 epochs
#   vit          --preset fmnist-vit (the ViT asked the paper's question; model vit)
# The AdamW preset itself at 12 epochs is benchmarks/table1.
# Runs are resumable: every run checkpoints every 100 steps and is resumed where it stopped, so the
# script can be killed and started again at any time (finished runs are skipped).
#   nohup nice -n 19 benchmarks/recipes/run_all.sh > runs/recipes/log.txt 2>&1 &
# Each run goes to $RUNS/<recipe>/<model>/seed<k>/; config.json, metrics.csv and heads.jsonl are copied
# to $DEST/<recipe>/<model>/seed<k>/ when it finishes. `attnconv compare benchmarks/recipes/*/sa-quadratic` compares them.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/recipes}
DEST=${DEST:-benchmarks/recipes}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
mkdir -p "$RUNS"

flags() {  # flags RECIPE: the train flags of a recipe, and its epochs on the last line
  local recipe=$1 base=${1%%-h16} epochs=12 extra=""
  case $recipe in *-48ep) base=${recipe%-48ep}; epochs=48 ;; esac
  case $recipe in *-h16) extra="--heads 16" ;; esac
  case $base in
    sgd) echo "--preset fmnist-sa-quadratic-sgd $extra" ;;
    adamw-als10) echo "--preset fmnist-sa-quadratic --attention-lr-scale 10 $extra" ;;
    adamw-als100) echo "--preset fmnist-sa-quadratic --attention-lr-scale 100 $extra" ;;
    vit) echo "--preset fmnist-vit $extra" ;;
    *) echo "unknown recipe $recipe" >&2; return 1 ;;
  esac
  echo "$epochs"
}

job() {  # job RECIPE MODEL SEED
  local recipe=$1 model=$2 seed=$3 spec train epochs
  spec=$(flags "$recipe") || return 0
  train=$(head -1 <<< "$spec"); epochs=$(tail -1 <<< "$spec")
  local out=$RUNS/$recipe/$model/seed$seed dest=$DEST/$recipe/$model/seed$seed
  if [ -f "$dest/metrics.csv" ] && [ "$(($(wc -l < "$dest/metrics.csv") - 1))" -ge "$epochs" ]; then
    echo "$(date -u +%H:%M:%S) skip $out (finished: $dest)"; return 0
  fi
  mkdir -p "$(dirname "$out")"
  echo "$(date -u +%H:%M:%S) start $out: $train --epochs $epochs ($(grep -o 'avx512_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '))"
  # shellcheck disable=SC2086  # train is a list of flags
  $PY -m attnconv train $train --model "$model" --epochs "$epochs" --seed "$seed" --workers "$THREADS" \
      --checkpoint-every 100 --no-progress --out "$out" --resume > "$out.log" 2>&1 \
    || { echo "$(date -u +%H:%M:%S) FAILED $out (see $out.log)"; return 0; }
  mkdir -p "$dest"
  cp "$out/config.json" "$out/metrics.csv" "$out/heads.jsonl" "$dest/"
  echo "$(date -u +%H:%M:%S) done $out: $(tail -1 "$out/metrics.csv")"
}
export -f job flags
export PY RUNS DEST THREADS

# RUN_LIST ("recipe model seed" per line) replaces this list: the first SGD seed and the
# dose-response first, then the ViT, the further seeds and models, the 16 heads and the long run
# (the last two with adamw-als100, the recipe that moved the centers most).
RUN_LIST=${RUN_LIST:-$(printf '%s\n' \
  "sgd sa-quadratic 0" "adamw-als100 sa-quadratic 0" "adamw-als10 sa-quadratic 0" "sgd sa-quadratic 1" \
  "vit vit 0" "vit vit 1" "sgd sa-quadratic 2" "adamw-als100-h16 sa-quadratic 0" \
  "sgd sa-quadratic-aniso 0" "sgd sa-learned 0" "adamw-als100-48ep sa-quadratic 0")}
printf '%s\n' "$RUN_LIST" | xargs -P "$JOBS" -I{} bash -c 'job {}'
echo "$(date -u +%H:%M:%S) all done"
