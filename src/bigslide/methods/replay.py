"""Exact chunked backward through an encoder whose outputs a head needs all at once (Andersson et al., Eq. 1).

dL/dθ = Σ_i dL/dz_i · dz_i/dθ, so: (1) encode every input chunk by chunk without grad, keeping only the
outputs Z; (2) run the head on Z with grad, which gives the head's gradients and dL/dZ; (3) replay the
encoder chunk by chunk with grad and push dL/dZ[chunk] through it. Only one chunk's activations are alive
at a time. ABMIL-ACC uses it for whole bags, PatchGD for the patches of one inner iteration.

The result equals one big graph's gradient when the encoder treats every input independently: BatchNorm
in eval mode, or no BatchNorm. Dropout and drop-path are exact: each chunk's RNG state is saved in pass 1
and restored for its replay. Train-mode BatchNorm (`batch_stats=True`) normalises per chunk: pass 1 then
uses the replay's chunks, so the two passes agree, and the replay does not count in the running statistics.

The inputs may stay on the host (pinned on CUDA): each chunk is moved to the encoder's device on its own,
in both passes, so device memory does not grow with the number of inputs beyond the (N, D) outputs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bigslide.data.colour import RowColour
from bigslide.data.sample import as_float, to_device
from bigslide.data.transfer import pinned
from bigslide.errors import ConfigError

AutocastFactory = Callable[[], contextlib.AbstractContextManager[Any]]
BackwardFn = Callable[[torch.Tensor], None]
Extra = TypeVar("Extra")


class InexactGradientWarning(UserWarning):
    """The accumulated gradient is not the one-graph gradient (train-mode BatchNorm in the encoder)."""


def batchnorm_layers(module: nn.Module) -> list[_BatchNorm]:
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


@contextlib.contextmanager
def batchnorm_mode(module: nn.Module, training: bool, *, keep_statistics: bool = False) -> Iterator[None]:
    """The BatchNorm layers of `module` in train (batch statistics) or eval (running statistics) mode
    inside the block, their modes restored after it. `keep_statistics`: the running statistics a
    train-mode pass updates are restored too."""
    layers = batchnorm_layers(module)
    saved = [
        (m.training, [b.clone() for b in m.buffers(recurse=False)] if keep_statistics else []) for m in layers
    ]
    for m in layers:
        m.train(training)
    try:
        yield
    finally:
        for m, (mode, buffers) in zip(layers, saved):
            m.train(mode)
            for buffer, value in zip(m.buffers(recurse=False), buffers):
                buffer.copy_(value)


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


def _rng_moved(state: _RngState, device: torch.device) -> bool:
    """Whether random numbers were drawn since `state` was captured."""
    if not torch.equal(state.cpu, torch.get_rng_state()):
        return True
    return state.cuda is not None and not torch.equal(state.cuda, torch.cuda.get_rng_state(device))


def compute_device(module: nn.Module, fallback: torch.device) -> torch.device:
    """Where `module` computes: the device of its first parameter or buffer, else `fallback`."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return fallback


def move_chunk(
    chunk: torch.Tensor, device: torch.device, colour: RowColour | None = None, *, channels_last: bool = False
) -> torch.Tensor:
    """One chunk of inputs onto the compute device (asynchronous from pinned host memory), through its
    rows' colour maps when given. `channels_last`: in channels-last memory, converted on the device in
    the same copy that makes uint8 pixels floats (the host's copy stays as read)."""
    if not channels_last or chunk.dim() != 4:
        return to_device(chunk, device, colour)
    x = as_float(chunk.to(device, non_blocking=True), colour, memory_format=torch.channels_last)
    return x.contiguous(memory_format=torch.channels_last)


def is_channels_last(module: nn.Module) -> bool:
    """Whether `module` computes in channels-last memory: its first convolution's weight is in it."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            w = m.weight
            return w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    return False


def _rows(colour: RowColour | None, start: int, stop: int) -> RowColour | None:
    return None if colour is None else colour[start:stop]


def encode_chunks(
    encoder: nn.Module,
    inputs: torch.Tensor,
    chunk_size: int,
    autocast: AutocastFactory | None = None,
    *,
    device: torch.device | None = None,
    colour: RowColour | None = None,
) -> torch.Tensor:
    """Encoder outputs of every input, chunk by chunk, without grad: (N, D) in float32 or float64.

    `inputs` may stay on the host: only one chunk at a time is moved to `device` (default: the
    encoder's), where the outputs are, in the encoder's memory layout (`is_channels_last`). `colour`:
    the inputs' colour maps (stain), one per input.
    """
    autocast = autocast or contextlib.nullcontext
    device = device or compute_device(encoder, inputs.device)
    layout = is_channels_last(encoder)
    chunks = []
    with torch.inference_mode():
        for start in range(0, inputs.shape[0], chunk_size):
            rows = _rows(colour, start, start + chunk_size)
            chunk = move_chunk(inputs[start : start + chunk_size], device, rows, channels_last=layout)
            with autocast():
                z = encoder(chunk)
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
    device: torch.device | None = None,
    colour: RowColour | None = None,
) -> tuple[torch.Tensor, Extra]:
    """Gradients of `head_loss(encoder(inputs))` into `.grad` (accumulating, like `.backward()`).

    `head_loss(Z)` returns the loss to backpropagate and anything else the caller wants back; it runs
    once, under `autocast`. `chunk_size`: inputs per replayed (with-grad) encoder call; sets the peak
    memory. `forward_chunk_size`: inputs per no-grad call in pass 1 (may be larger: nothing is kept);
    ignored when the encoder is stochastic or `batch_stats`. `stochastic`: whether the encoder draws
    random numbers; None detects dropout/drop-path layers, and any other draw in pass 1 (which is then
    redone in replay-sized chunks). `backward(loss)` runs the head's backward
    (e.g. a stepper's, for loss scaling); dL/dZ inherits its scale, so the encoder's gradient does too.
    `inputs` may stay on the host (they are pinned when `device` is CUDA): each pass moves one chunk at
    a time to `device` (default: the encoder's), where Z and the head live; `colour` (the inputs' stain
    maps, one per input) is applied to each chunk there, in both passes alike.
    Returns the detached loss and `head_loss`'s extra value.
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk size must be >= 1, got {chunk_size}")
    autocast = autocast or contextlib.nullcontext
    n = inputs.shape[0]
    device = device or compute_device(encoder, inputs.device)
    inputs = pinned(inputs, device)
    observe = stochastic is None
    if stochastic is None:
        stochastic = has_stochastic_layers(encoder)
    same_chunks = stochastic or batch_stats or not forward_chunk_size
    first_chunk = chunk_size if same_chunks else max(forward_chunk_size or 0, chunk_size)

    # Pass 1: every output, no activations kept.
    rng_states: list[_RngState] = []
    if not stochastic:
        before = _capture_rng(device) if observe else None  # stated not stochastic: nothing to watch
        Z = encode_chunks(encoder, inputs, first_chunk, autocast, device=device, colour=colour)
        if before is not None and _rng_moved(before, device):
            # it drew random numbers through no layer `has_stochastic_layers` knows (functional dropout,
            # RReLU, patch dropout): its replay must draw the same ones, so pass 1 is redone chunk by
            # chunk from the same state, each chunk's RNG state kept
            _restore_rng(before, device)
            stochastic = True
    if stochastic:
        parts = []
        for start in range(0, n, chunk_size):
            rng_states.append(_capture_rng(device))
            chunk = inputs[start : start + chunk_size]
            rows = _rows(colour, start, start + chunk_size)
            parts.append(encode_chunks(encoder, chunk, chunk_size, autocast, device=device, colour=rows))
        Z = torch.cat(parts)

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
        layout = is_channels_last(encoder)
        with torch.random.fork_rng(devices=devices, enabled=stochastic):
            for index, start in enumerate(range(0, n, chunk_size)):
                if stochastic:
                    _restore_rng(rng_states[index], device)
                rows = _rows(colour, start, start + chunk_size)
                chunk = move_chunk(inputs[start : start + chunk_size], device, rows, channels_last=layout)
                with autocast():
                    z = encoder(chunk)
                z.backward(grad_z[start : start + chunk_size].to(z.dtype))
        # The replay must not count the chunks twice in the running statistics.
        for buffer, saved in zip(buffers, saved_stats):
            buffer.copy_(saved)
    return loss.detach(), extra
