#!/usr/bin/env bash
# The paper's token grid on Fashion-MNIST: sa-quadratic and sa-learned at --downsample 2 (14x14
# tokens of 4 channels, against the table's 7x7 of 16), one seed each, the attention recipe of
# Table 1 at its full 12 epochs, float32, two runs at a time with one thread each, a checkpoint
# every 100 steps (resumable: kill it and start it again; finished runs are skipped).
#   nohup benchmarks/grid14/run_all.sh > runs/grid14/log.txt 2>&1 &
# Each run goes to $RUNS/<model>/seed0/; config.json, metrics.csv and heads.jsonl are copied to
# benchmarks/grid14/<model>/seed0/ when it finishes.
set -u
cd "$(dirname "$0")/../.."
mkdir -p "${RUNS:-runs/grid14}"
RUNS=${RUNS:-runs/grid14} DEST=${DEST:-benchmarks/grid14} EXTRA="--downsample 2" \
  RUN_LIST=$'sa-quadratic 0\nsa-learned 0' exec benchmarks/table1/run_all.sh
