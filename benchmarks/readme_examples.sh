#!/usr/bin/env bash
# Runs every example of README.md, in the README's order, and checks that it ran them all.
#
#   bash benchmarks/readme_examples.sh        (from anywhere; about 5 minutes on 2 CPU cores)
#
# - Every ```python block of README.md is extracted from README.md and run as written.
# - Every command of the README's ```sh blocks is run as written, with the two shortenings the
#   README states next to the commands: the Fashion-MNIST training gets --max-steps 20, the
#   folder training --max-steps 5.
# - The commands run in a scratch folder, runs/readme/, so the README's runs/sa is
#   runs/readme/runs/sa; runs/readme/benchmarks links to benchmarks/ for `attnconv table`, and
#   runs/readme/my-images is made from 300 Fashion-MNIST test images (200 train, 100 test) as PNGs.
# - `attnconv explore` runs in the background with BROWSER=true (no browser opens), is asked
#   for /api/info, and is stopped.
# - Last, the commands run are compared with those of README.md's ```sh blocks (all but
#   `pip install`, which `make install` / `make test` run): a README example that this script
#   does not run, or runs differently, fails the script.
# Not run here: `make demo` and `make test`, the README's first block (their own targets).
#
# Needs the package installed in .venv (`make install`) and Fashion-MNIST (`make data`, or
# attnconv downloads it). Output: runs/readme/, one log per example in runs/readme/logs/.
# Exit status: 0 when every example succeeded and the README's examples are exactly these.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$ROOT/.venv/bin:$PATH"   # attnconv, python
W="$ROOT/runs/readme"
rm -rf "$W"
mkdir -p "$W/logs"
ln -s ../../benchmarks "$W/benchmarks"
cd "$W"
: >"$W/commands.txt"
failed=0
n=0

finish() {  # finish NAME RC T0: print the log's tail and the status
    local name=$1 rc=$2 t0=$3
    tail -n 8 "$W/logs/$name.log"
    echo "== $name: exit $rc, $((SECONDS - t0)) s"
    echo
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

pyblock() {  # pyblock K: run the K-th ```python block of README.md as written
    local k=$1 name t0 rc=0
    n=$((n + 1)); name=$(printf '%02d-python-%d' "$n" "$k"); t0=$SECONDS
    python - "$ROOT/README.md" "$k" >"$W/$name.py" <<'EOF' || { echo "no python block $k"; failed=$((failed + 1)); return; }
import re, sys
blocks = re.findall(r"^```python\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M)
sys.stdout.write(blocks[int(sys.argv[2]) - 1])
EOF
    echo "== $name: README python block $k"
    python "$W/$name.py" >"$W/logs/$name.log" 2>&1 || rc=$?
    echo "python block $k" >>"$W/commands.txt"
    finish "$name" "$rc" "$t0"
}

cmd() {  # cmd 'README COMMAND' [EXTRA ARGS]: run a README command, with EXTRA appended
    local line=$1 name t0 rc=0; shift
    n=$((n + 1)); name=$(printf '%02d-%s' "$n" "$(echo "$line" | awk '{print $2 ($3 ~ /^[a-z]+$/ ? "-" $3 : "")}')"); t0=$SECONDS
    echo "== $name: $line${*:+  (+ $*)}"
    bash -c "$line $*" >"$W/logs/$name.log" 2>&1 || rc=$?
    echo "$line" >>"$W/commands.txt"
    finish "$name" "$rc" "$t0"
}

explore() {  # explore 'README COMMAND': start it, ask for /api/info, stop it
    local line=$1 name t0 rc=0 pid
    n=$((n + 1)); name=$(printf '%02d-explore' "$n"); t0=$SECONDS
    echo "== $name: $line"
    BROWSER=true bash -c "exec $line" >"$W/logs/$name.log" 2>&1 &
    pid=$!
    python - >>"$W/logs/$name.log" 2>&1 <<'EOF' || rc=$?
import time, urllib.request
for _ in range(120):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8765/api/info", timeout=5).read().decode())
        break
    except OSError:
        time.sleep(1)
else:
    raise SystemExit("no answer from http://127.0.0.1:8765/api/info")
EOF
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "$line" >>"$W/commands.txt"
    finish "$name" "$rc" "$t0"
}

# --- A 5-minute tour
pyblock 1                                  # a drop-in for nn.Conv2d
pyblock 2                                  # Theorem 1, and back
cmd 'attnconv express --dim 2 --kernel 3 --in-channels 8 --out-channels 16 --dtype float64 --plot heads.png'
cmd 'attnconv train --preset fmnist-sa-quadratic --epochs 1 --out runs/sa' --max-steps 20
cmd 'attnconv eval runs/sa'
pyblock 3                                  # load_run("runs/sa")
cmd 'attnconv plot centers runs/sa'
cmd 'attnconv plot centers runs/sa --layer 1'
cmd 'attnconv plot distance runs/sa'
cmd 'attnconv plot maps runs/sa'
cmd 'attnconv analyze runs/sa'
cmd 'attnconv report runs/sa'
explore 'attnconv explore runs/sa'

# --- Your own images: my-images from 300 Fashion-MNIST test images
python - my-images >"$W/logs/make-my-images.log" 2>&1 <<'EOF' || { echo "could not make my-images"; failed=$((failed + 1)); }
import sys
from pathlib import Path
from PIL import Image
from attnconv import data as D

root = Path(sys.argv[1])
_, test = D.load_dataset("fashion-mnist")
classes = D.dataset_info("fashion-mnist").classes
for split, lo, hi in (("train", 0, 200), ("test", 200, 300)):
    for i in range(lo, hi):
        folder = root / split / classes[int(test.labels[i])].replace("/", "-")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(test.images[i, 0].numpy(), mode="L").save(folder / f"{i:05d}.png")
EOF
cmd 'attnconv train --model sa-quadratic --dataset folder:my-images --out runs/mine' --max-steps 5

# --- Results
cmd 'attnconv table benchmarks/table1/*/*'
cmd 'attnconv learn-conv --out runs/learn-conv'

# --- Did this script run exactly the README's examples?
python - "$ROOT/README.md" "$W/commands.txt" <<'EOF' || failed=$((failed + 1))
import re, sys
text = open(sys.argv[1]).read()
readme = [f"python block {k + 1}" for k in range(len(re.findall(r"^```python\n", text, re.M)))]
for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        if line and not line.startswith("pip install"):
            readme.append(line)
ran = open(sys.argv[2]).read().splitlines()
missing = [c for c in readme if c not in ran]
extra = [c for c in ran if c not in readme]
for c in missing:
    print("in README.md, not run by this script:", c)
for c in extra:
    print("run by this script, not in README.md:", c)
print(f"README.md: {len(readme)} examples; this script ran {len(ran)}")
sys.exit(1 if missing or extra else 0)
EOF

echo "failures: $failed (logs in $W/logs)"
[ "$failed" -eq 0 ]
