"""Which precision a device can train in: bfloat16 autocast (`amp`) where the hardware has it.

On the CPU, bf16 matmuls are fast only where oneDNN has native bf16 kernels (AVX-512 BF16 /
AMX); elsewhere PyTorch emulates them, slower than float32. `bf16_supported` says which.
Scores and softmax stay float32 under autocast in every attention layer
(`attnconv.attention.float32_scores`).
"""

from __future__ import annotations

import re

import torch

from attnconv.errors import ParameterError


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """True when `device` runs bfloat16 matmuls natively (the CPU's oneDNN bf16 path, or a bf16 GPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without the query: assume emulated
        return False


def check_amp(amp: bool, device: str | torch.device) -> None:
    """Refuse `amp` on a device without native bfloat16, where it would be slower, not faster."""
    if amp and not bf16_supported(device):
        raise ParameterError("amp", amp, f": {torch.device(device).type} here has no native bfloat16 support "
                             "(bf16 would be emulated, slower than float32); drop {amp}", shown="", mentions=("amp",))


def check_device(device: str, name: str = "device") -> None:
    """Refuse a device name that is not cpu, cuda or cuda:N, or a CUDA device this machine lacks; errors
    name the parameter `name`."""
    device = device if isinstance(device, str) else str(device)  # a torch.device as its name
    match = re.fullmatch(r"cpu|cuda(?::(\d{1,4}))?", device)
    if match is None:
        raise ParameterError(name, device, "is not a device attnconv runs on; choose cpu, cuda or cuda:N",
                             shown=repr(device))
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ParameterError(name, device, f": CUDA is not available here (torch {torch.__version__}); "
                                 f"use {{{name}}} cpu", mentions=(name,))
        index = int(match.group(1) or 0)
        if index >= torch.cuda.device_count():
            raise ParameterError(name, device, f": this machine has {torch.cuda.device_count()} CUDA device(s) "
                                 f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")


def precision_name(amp: bool) -> str:
    return "bfloat16 autocast (scores and softmax float32)" if amp else "float32"
