"""Several processes under torchrun: where this process sits, and collectives that keep ranks in step.

Every rank takes a contiguous shard of each *global* batch (`batch_size` is global) and
DDP averages the per-shard mean gradients, which equals the 1-process gradient of the
global batch mean. Only rank 0 prints, logs and writes checkpoints.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnconv.config import TrainConfig
from attnconv.errors import AttnconvError


@dataclass
class Dist:
    """Where this process sits among torchrun's processes (world_size 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def agree(self, error: AttnconvError | str | None) -> None:
        """Raise on every rank if any rank failed, so no rank waits forever in a collective. An error
        is raised as it is (a ParameterError still names its parameter, or its flag in the CLI)."""
        if self.active:
            errors: list[AttnconvError | str | None] = [None] * self.world_size
            dist.all_gather_object(errors, error)
            error = next((e for e in errors if e), None)
        if error:
            raise error if isinstance(error, AttnconvError) else AttnconvError(error)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def shutdown(self) -> None:
        """Tear the process group down while the interpreter is fully alive (after `barrier` on a
        clean finish). Left to interpreter exit, gloo's worker threads can outlive the objects they
        hold and the process aborts ("terminate called without an active exception") after a
        successful run."""
        if self.active and dist.is_initialized():
            gc.collect()  # the DDP wrapper and its reducer, if a cycle still holds them
            dist.destroy_process_group()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()


def init_distributed(config: TrainConfig) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    d = Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = config.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(d.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    return d
