#!/usr/bin/env bash
# Runs the example commands of README.md that are cheap enough for a 2-core CPU, in the
# order the README gives them; the results written next to them in README.md come from
# this script's commands.
#
# Run: 2026-11-23 16:07-17:25 UTC, AMD EPYC, 2 cores, 24 GB RAM, no GPU, Python 3.11,
# torch 2.13.0+cpu, the real Fashion-MNIST from /usr/share/datasets/fashion-mnist. The
# commands were run one at a time, in this order, by hand (the script collects them; it has
# not been run end to end in one go). The machine was shared: two other trainings ran the
# whole time (load average 4-5 on 2 cores), so the times are 2-4x those of a quiet machine.
#
# Differences from the README, all said next to the commands in README.md:
#   - every run folder is under runs/readme/ (runs/sa -> runs/readme/sa, ...);
#   - runs/sa and runs/resnet are 1-epoch bf16 runs of the two Fashion-MNIST presets
#     (the presets train 12 and 8 epochs); the other commands use them;
#   - runs/content (for `plot maps --image`) is a 100-step sa-learned-content run;
#   - folder:PATH is 600 Fashion-MNIST test images written as PNGs (400 train, 200 test),
#     and its training was given --max-steps 300 and stopped after 10 minutes;
#   - torchrun was given --max-steps 30 (the preset is 12 epochs);
#   - the Python snippets run from runs/readme/*.py with ~/pets replaced by that folder;
#   - explore is started in the background, asked for /api/info, and stopped;
#   - last, every ```python block of README.md is run exactly as written.
# Not run (too long here, or no data): make demo / make test as such, the 12-epoch presets,
# the paper's CIFAR-10 recipe, --init-from runs, the long benches. README.md cites their
# earlier measurements from benchmarks/RESULTS.md.
#
# Usage: bash benchmarks/readme_examples.sh     (from anywhere; about 70 minutes on the
# shared machine above). Output: runs/readme/, one log per command in runs/readme/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"   # attnconv, torchrun, python
R=runs/readme
mkdir -p "$R/logs"

run() {  # run NAME CMD...: run a command, log it to $R/logs/NAME.log, print its tail and time
    local name=$1; shift
    echo "== $name: $*"
    local t0=$SECONDS rc=0
    "$@" >"$R/logs/$name.log" 2>&1 || rc=$?
    tail -n 12 "$R/logs/$name.log"
    echo "== $name: exit $rc, $((SECONDS - t0)) s"
    echo
}

# --- Attention as a drop-in for nn.Conv2d (README's snippet, plus a print of the shape)
cat >"$R/snippet_dropin.py" <<'EOF'
import torch
from torch import nn
from attnconv import SelfAttention2d

net = nn.Sequential(
    nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
    SelfAttention2d(64, 64, heads=9, encoding="quadratic"),   # was nn.Conv2d(64, 64, 3, padding=1)
)
y = net(torch.randn(8, 3, 32, 32))                            # (8, 64, 32, 32)
print(tuple(y.shape))
EOF
run snippet_dropin python "$R/snippet_dropin.py"

# --- Theorem 1 (README's snippet, plus prints of the max abs error and the distance)
cat >"$R/snippet_theorem1.py" <<'EOF'
import torch
from torch import nn
from attnconv import conv_to_attention, effective_kernel, conv_likeness

conv = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1, groups=4, padding_mode="reflect").double()
attn = conv_to_attention(conv)            # 9 heads, centers on the kernel grid, alpha chosen from the dtype
x = torch.randn(2, 16, 20, 13, dtype=torch.float64)
print((attn(x) - conv(x)).norm() / conv(x).norm())    # ~1e-16; no convolution op is called
print(attn.error_bound(x))                             # the leakage bound on the max abs error

report = conv_likeness(attn, (20, 13), kernel_size=3)  # reverse direction: distance to the nearest 3x3 conv
print("max abs error", (attn(x) - conv(x)).abs().max().item())
print("conv_likeness distance", report.distance)
zeros = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1, groups=4).double()
print("the same with padding_mode='zeros':", conv_likeness(conv_to_attention(zeros), (20, 13), kernel_size=3).distance)
EOF
run snippet_theorem1 python "$R/snippet_theorem1.py"

run express attnconv express --dim 2 --kernel 3 --in-channels 8 --out-channels 16 --dtype float64 --plot "$R/heads.png"

# --- Training and the paper's table
rm -rf "$R/sa" "$R/resnet" "$R/x" "$R/ddp" "$R/content" "$R/mine" "$R/resnet-attention"
run train_sa attnconv train --preset fmnist-sa-quadratic --epochs 1 --amp --out "$R/sa"
run train_x attnconv train --model sa-learned --dataset fashion-mnist --hidden 64 --layers 2 --epochs 3 --out "$R/x"
run eval_sa attnconv eval "$R/sa"
run train_resnet attnconv train --preset fmnist-resnet-small --epochs 1 --amp --out "$R/resnet"
run table attnconv table "$R/sa" "$R/resnet"
run table_seeds bash -c 'attnconv table benchmarks/table1/*/*'
run torchrun torchrun --nproc-per-node 2 -m attnconv train --preset fmnist-sa-quadratic --max-steps 30 --no-progress --out "$R/ddp"

# --- Your own images: 600 Fashion-MNIST test images as PNGs in the ImageFolder layout
cat >"$R/make_folder.py" <<'EOF'
import sys
from pathlib import Path
from PIL import Image
from attnconv import data as D

root = Path(sys.argv[1])
_, test = D.load_dataset("fashion-mnist")
classes = D.dataset_info("fashion-mnist").classes
for split, lo, hi in (("train", 0, 400), ("test", 400, 600)):
    for i in range(lo, hi):
        name = classes[int(test.labels[i])].replace("/", "-").replace(" ", "-")
        d = root / split / name
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(test.images[i, 0].numpy(), mode="L").save(d / f"{i:05d}.png")
print(root, "classes:", sorted(p.name for p in (root / "train").iterdir()))
EOF
rm -rf "$R/fmnist-folder"
run make_folder python "$R/make_folder.py" "$R/fmnist-folder"
# the folder recipe is 400 steps for 400 images; stopped after 10 minutes as in the README's note
run train_folder timeout 600 attnconv train --model sa-quadratic --dataset "folder:$R/fmnist-folder" --image-size 32 \
    --max-steps 300 --no-progress --out "$R/mine"
cat >"$R/snippet_folder.py" <<'EOF'
from attnconv import data as D
train, test = D.load_dataset("folder:runs/readme/fmnist-folder", image_size=32)   # uint8 (N, C, 32, 32), int64 labels
info = D.dataset_info("folder:runs/readme/fmnist-folder", image_size=32)          # classes, channels, mean/std
print(train.images.dtype, tuple(train.images.shape), train.labels.dtype, tuple(test.images.shape))
print(info.classes, info.channels, info.mean, info.std)
EOF
run snippet_folder python "$R/snippet_folder.py"

# --- What the heads learned
run train_content attnconv train --model sa-learned-content --dataset fashion-mnist --hidden 64 --layers 2 \
    --max-steps 100 --amp --no-progress --out "$R/content"
run plot_centers attnconv plot centers "$R/sa"
run plot_maps attnconv plot maps "$R/sa" --query 3,3
run plot_maps_content attnconv plot maps "$R/content" --image 7
run analyze attnconv analyze "$R/sa"
run learn_conv bash -c "cd $R && attnconv learn-conv --no-progress"   # writes ./learn-conv/ in its folder
run report attnconv report "$R/sa"

attnconv explore "$R/sa" --port 8765 --no-browser >"$R/logs/explore.log" 2>&1 &
explore_pid=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:8765/api/info >"$R/logs/explore-info.json" && break; sleep 1; done
echo "== explore /api/info:"; cat "$R/logs/explore-info.json" || echo "(no answer)"; echo
kill "$explore_pid" || true; wait "$explore_pid" || true

# --- Whole networks
cat >"$R/snippet_cnn.py" <<'EOF'
from attnconv import cnn_to_attention, build_model
cnn = build_model("resnet18", in_channels=1).eval()
attn = cnn_to_attention(cnn, fold_bn=True)   # 20 convs -> 156 attention heads, BatchNorm folded in
import torch
from torch import nn
heads = sum(m.heads for m in attn.modules() if isinstance(getattr(m, "heads", None), int))
print("convs", sum(isinstance(m, nn.Conv2d) for m in cnn.modules()), "-> heads", heads,
      "; Conv2d left", sum(isinstance(m, nn.Conv2d) for m in attn.modules()),
      "; BatchNorm left", sum(isinstance(m, nn.BatchNorm2d) for m in attn.modules()))
x = torch.randn(4, 1, 28, 28)
print("relative difference of the outputs", ((attn(x) - cnn(x)).norm() / cnn(x).norm()).item())
EOF
run snippet_cnn python "$R/snippet_cnn.py"
run convert attnconv convert "$R/resnet" --out "$R/resnet-attention"

# --- Performance: the one cheap bench
run bench_quick attnconv bench --quick

# --- Every ```python block of README.md, exactly as written (~/pets -> the folder above)
run readme_python_blocks python - <<'EOF2'
import re, subprocess, sys
blocks = re.findall(r"```python\n(.*?)```", open("README.md").read(), re.S)
failed = 0
for i, code in enumerate(blocks):
    code = code.replace("~/pets", "runs/readme/fmnist-folder")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print(f"block {i + 1}/{len(blocks)}: exit {r.returncode}", (r.stdout + r.stderr).strip()[-400:])
    failed += r.returncode != 0
sys.exit(1 if failed else 0)
EOF2
