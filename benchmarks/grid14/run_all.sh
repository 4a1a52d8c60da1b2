#!/usr/bin/env bash
# The paper's token grid on Fashion-MNIST: sa-quadratic and sa-learned at --downsample 2 (14x14
# tokens of 4 channels, against the table's 7x7 of 16), one seed each, the attention recipe of
# Table 1, float32, a checkpoint every 100 steps (resumable: kill it and start it again; finished
# runs are skipped). One run at a time with both threads: on a 2-core CPU that trained at 105
# images/s against 2 x 29 for two runs of one thread each (RESULTS.md, "The paper's token grid").
#   EPOCHS=6 nohup benchmarks/grid14/run_all.sh > runs/grid14/log.txt 2>&1 &     # what was committed
#   EPOCHS=12 DEST=benchmarks/grid14-12ep RUNS=runs/grid14-12ep benchmarks/grid14/run_all.sh
# Each run goes to $RUNS/<model>/seed0/; config.json, metrics.csv and heads.jsonl are copied to
# $DEST/<model>/seed0/ when it finishes.
set -u
cd "$(dirname "$0")/../.."
mkdir -p "${RUNS:-runs/grid14}"
RUNS=${RUNS:-runs/grid14} DEST=${DEST:-benchmarks/grid14} EPOCHS=${EPOCHS:-12} JOBS=${JOBS:-1} \
  EXTRA="--downsample 2 --workers ${THREADS:-2}" RUN_LIST=$'sa-quadratic 0\nsa-learned 0' \
  exec benchmarks/table1/run_all.sh
