"""The Checkpointer under DDP: two gloo processes on the CPU save a checkpoint (a collective; rank 0 writes),
train on, then restore it into fresh models and replay the same steps, which must give the same weights
bit for bit on every rank: the weights, the optimizer state and each rank's own RNG state (dropout) come
back, and the sums that every rank adds up come back once, on rank 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from attnconv.config import TrainConfig
from attnconv.training.checkpoint import Checkpointer
from attnconv.training.distributed import init_distributed
from attnconv.training.progress import RunProgress

out, results = Path(sys.argv[1]), Path(sys.argv[2])
d = init_distributed(TrainConfig(model="sa-quadratic", dataset="fashion-mnist", device="cpu"))
torch.manual_seed(0)  # the same initial weights on both ranks (DDP broadcasts rank 0's anyway)


def fresh():
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    net = nn.parallel.DistributedDataParallel(model)
    return model, net, torch.optim.AdamW(model.parameters(), lr=0.05)


def steps(net, opt, progress, first, count):
    """`count` steps from step `first`; every rank its own shard of a batch that depends on the step only."""
    net.train()
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        x, y = x[4 * d.rank:4 * d.rank + 4], y[4 * d.rank:4 * d.rank + 4]
        loss = nn.functional.cross_entropy(net(x), y)  # dropout draws from this rank's generator
        opt.zero_grad()
        loss.backward()
        opt.step()
        progress.step += 1
        progress.batch += 1  # one epoch: its steps are its batches
        progress.loss_sum += float(loss) * len(y)
        progress.seen += len(y)


model, net, opt = fresh()
progress = RunProgress()
torch.manual_seed(100 + d.rank)  # each rank its own dropout stream, as training seeds them
steps(net, opt, progress, 0, 3)
local_loss = progress.loss_sum
checkpointer = Checkpointer(out, d, torch.device("cpu"), "tiny")
checkpointer.save(model, opt, progress)
d.barrier()
steps(net, opt, progress, 3, 4)
straight = {k: v.clone() for k, v in model.state_dict().items()}

model2, net2, opt2 = fresh()
with torch.no_grad():
    for p in model2.parameters():
        p.add_(1.0)  # not the checkpoint's: the restore must overwrite them
restored = checkpointer.restore(model2, opt2, seed=0)
after_restore = restored.loss_sum
steps(net2, opt2, restored, 3, 4)
same = all(torch.equal(straight[k], v) for k, v in model2.state_dict().items())
losses = [None] * d.world_size
dist.all_gather_object(losses, local_loss)
# one file per rank: lines two processes print to one pipe at once can interleave
(results / f"rank{d.rank}.json").write_text(json.dumps({"rank": d.rank, "same": same, "step": restored.step,
                                                         "loss_sum_after_restore": after_restore,
                                                         "local_loss_sums": losses}))
d.barrier()
d.shutdown()
'''


def test_ddp_checkpoint_saved_by_rank_0_restores_every_rank_exactly(tmp_path):
    script = tmp_path / "ddp_checkpoint.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    out.mkdir()
    found = tmp_path / "results"
    found.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(out), str(found)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    written = all((found / f"rank{rank}.json").is_file() for rank in (0, 1))
    # gloo's teardown on a loaded 2-core machine can abort a rank after its last line ("terminate called without an
    # active exception"): once both ranks have written their results, that exit is not what this test checks
    teardown = written and "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or teardown, proc.stderr[-3000:]
    results = [json.loads((found / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["same"] for r in results), results  # the replay matches training straight on, on both ranks
    assert all(r["step"] == 7 for r in results)
    total = sum(results[0]["local_loss_sums"])  # the sums come back once: on rank 0, added over the ranks
    assert abs(results[0]["loss_sum_after_restore"] - total) <= 1e-9 * abs(total)
    assert results[1]["loss_sum_after_restore"] == 0.0
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "state.pt"]  # written once, by rank 0
