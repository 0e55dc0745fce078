"""Exact chunked backward through an encoder whose outputs a head needs all at once (Andersson et al., Eq. 1).

dL/dθ = Σ_i dL/dz_i · dz_i/dθ, so: (1) encode every input chunk by chunk without grad, keeping only the
outputs Z; (2) run the head on Z with grad, which gives the head's gradients and dL/dZ; (3) replay the
encoder chunk by chunk with grad and push dL/dZ[chunk] through it. Only one chunk's activations are alive
at a time. ABMIL-ACC uses it for whole bags, PatchGD for the patches of one inner iteration.

The result equals one big graph's gradient when the encoder treats every input independently: BatchNorm
in eval mode, or no BatchNorm. Dropout and drop-path are exact: each chunk's RNG state is saved in pass 1
and restored for its replay. Train-mode BatchNorm (`batch_stats=True`) normalises per chunk: pass 1 then
uses the replay's chunks, so the two passes agree, and the replay does not count in the running statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bigslide.errors import ConfigError

AutocastFactory = Callable[[], contextlib.AbstractContextManager[Any]]
BackwardFn = Callable[[torch.Tensor], None]
Extra = TypeVar("Extra")


class InexactGradientWarning(UserWarning):
    """The accumulated gradient is not the one-graph gradient (train-mode BatchNorm in the encoder)."""


def batchnorm_layers(module: nn.Module) -> list[_BatchNorm]:
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


def has_stochastic_layers(module: nn.Module) -> bool:
    """Whether a module in train mode draws random numbers (dropout, drop-path, drop-block, drop_rate)."""
    for m in module.modules():
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        for attribute in ("drop_prob", "drop_rate"):
            value = getattr(m, attribute, None)
            if isinstance(value, int | float) and value > 0:
                return True
    return False


@dataclass
class _RngState:
    cpu: torch.Tensor
    cuda: torch.Tensor | None


def _capture_rng(device: torch.device) -> _RngState:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return _RngState(torch.get_rng_state(), cuda)


def _restore_rng(state: _RngState, device: torch.device) -> None:
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state(state.cuda, device)


def encode_chunks(
    encoder: nn.Module, inputs: torch.Tensor, chunk_size: int, autocast: AutocastFactory | None = None
) -> torch.Tensor:
    """Encoder outputs of every input, chunk by chunk, without grad: (N, D) in float32 or float64."""
    autocast = autocast or contextlib.nullcontext
    chunks = []
    with torch.inference_mode():
        for start in range(0, inputs.shape[0], chunk_size):
            with autocast():
                z = encoder(inputs[start : start + chunk_size])
            chunks.append(z if z.dtype in (torch.float32, torch.float64) else z.float())
    # Concatenated outside inference mode: an ordinary tensor that autograd may use.
    return torch.cat(chunks)


def replay_backward(
    encoder: nn.Module,
    inputs: torch.Tensor,
    head_loss: Callable[[torch.Tensor], tuple[torch.Tensor, Extra]],
    *,
    chunk_size: int,
    forward_chunk_size: int | None = None,
    autocast: AutocastFactory | None = None,
    backward: BackwardFn | None = None,
    batch_stats: bool = False,
    stochastic: bool | None = None,
) -> tuple[torch.Tensor, Extra]:
    """Gradients of `head_loss(encoder(inputs))` into `.grad` (accumulating, like `.backward()`).

    `head_loss(Z)` returns the loss to backpropagate and anything else the caller wants back; it runs
    once, under `autocast`. `chunk_size`: inputs per replayed (with-grad) encoder call; sets the peak
    memory. `forward_chunk_size`: inputs per no-grad call in pass 1 (may be larger: nothing is kept);
    ignored when the encoder is stochastic or `batch_stats`. `stochastic`: whether the encoder draws
    random numbers; None detects dropout/drop-path layers. `backward(loss)` runs the head's backward
    (e.g. a stepper's, for loss scaling); dL/dZ inherits its scale, so the encoder's gradient does too.
    Returns the detached loss and `head_loss`'s extra value.
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk size must be >= 1, got {chunk_size}")
    autocast = autocast or contextlib.nullcontext
    n, device = inputs.shape[0], inputs.device
    if stochastic is None:
        stochastic = has_stochastic_layers(encoder)
    same_chunks = stochastic or batch_stats or not forward_chunk_size
    first_chunk = chunk_size if same_chunks else max(forward_chunk_size or 0, chunk_size)

    # Pass 1: every output, no activations kept.
    rng_states: list[_RngState] = []
    if stochastic:
        parts = []
        for start in range(0, n, chunk_size):
            rng_states.append(_capture_rng(device))
            parts.append(encode_chunks(encoder, inputs[start : start + chunk_size], chunk_size, autocast))
        Z = torch.cat(parts)
    else:
        Z = encode_chunks(encoder, inputs, first_chunk, autocast)

    # Pass 2: the head once, on all outputs.
    Z.requires_grad_(True)
    with autocast():
        loss, extra = head_loss(Z)
    (backward or torch.Tensor.backward)(loss)
    grad_z = Z.grad

    # Pass 3: replay each chunk with grad and push dL/dZ[chunk] through it.
    if grad_z is not None and any(p.requires_grad for p in encoder.parameters()):
        buffers = [b for layer in batchnorm_layers(encoder) for b in layer.buffers()]
        saved_stats = [b.clone() for b in buffers] if batch_stats else []
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=stochastic):
            for index, start in enumerate(range(0, n, chunk_size)):
                if stochastic:
                    _restore_rng(rng_states[index], device)
                with autocast():
                    z = encoder(inputs[start : start + chunk_size])
                z.backward(grad_z[start : start + chunk_size].to(z.dtype))
        # The replay must not count the chunks twice in the running statistics.
        for buffer, saved in zip(buffers, saved_stats):
            buffer.copy_(saved)
    return loss.detach(), extra
