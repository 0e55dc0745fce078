"""Host tensors onto the compute device without the host waiting for the copy."""

from __future__ import annotations

import torch


def pinned(inputs: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`inputs` in page-locked memory when they are on the host and the compute device is CUDA.

    The engine's batches are pinned already; a scripted caller's bag is pinned once by the methods that
    move it chunk by chunk (ACC's chunks cross twice: no-grad pass and replay).
    """
    if device.type == "cuda" and inputs.device.type == "cpu" and not inputs.is_pinned():
        return inputs.pin_memory()
    return inputs


def send(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (targets, indices) on `device` without the host waiting for the copy: from
    pageable memory a copy to CUDA blocks, so it is pinned first."""
    return pinned(t, device).to(device, non_blocking=True)
