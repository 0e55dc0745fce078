"""Encoder activations PatchGD's training step need not hold: the host's layout switch, and recipes
autograd keeps in place of saved tensors the step can remake exactly (no layer is recomputed)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from torch import nn

from bigslide.errors import ConfigError

# On the CPU, a channels-last convolution's weight gradient comes out of oneDNN in the other layout and
# is copied once more: one extra weight-sized buffer during backward, 9.4 MB for a 512x512 3x3 conv.
# Convolutions this large sit late in the network, where activations are too small for channels-last
# to gain speed, so from the first of them on every convolution keeps the standard layout (measured on
# resnet18, 4 patches of 128²: backward peak with accumulated gradients 54 MB all channels-last, 45.5 MB
# mixed, same speed).
HOST_CHANNELS_LAST_MAX_WEIGHT = 2**20  # bytes
ModuleT = TypeVar("ModuleT", bound=nn.Module)


def wants_channels_last(choice: str, encoder: nn.Module, device: torch.device) -> bool:
    """Whether an encoder on `device` runs in channels-last memory (`run.channels_last`): "on", "off", or
    "auto" = a CNN on CUDA, where cuDNN's fastest kernels are channels-last and would otherwise convert
    every convolution's input and output. A CNN has more than one convolution (a ViT's patch embedding
    is its only one)."""
    if choice not in ("auto", "on", "off"):
        raise ConfigError(f"run.channels_last: {choice!r} is not one of 'auto', 'on', 'off'")
    if choice != "auto":
        return choice == "on"
    return device.type == "cuda" and sum(isinstance(m, nn.Conv2d) for m in encoder.modules()) > 1


def channels_last_encoder(encoder: ModuleT, *, host: bool) -> ModuleT:
    """`encoder` in channels-last layout; on the host (`host`), the convolutions from the first one whose
    weight exceeds HOST_CHANNELS_LAST_MAX_WEIGHT bytes on keep the standard layout and take a contiguous
    input (one copy per activation, shared by the convolutions that read it)."""
    encoder = encoder.to(memory_format=torch.channels_last)
    if not host:
        return encoder
    late = False
    hook = _ContiguousInput()
    # the training step's backward remakes these copies instead of keeping them
    _LAYOUT_COPIES[encoder] = hook
    for module in encoder.modules():
        if not isinstance(module, nn.Conv2d):
            continue
        late = late or module.weight.numel() * module.weight.element_size() > HOST_CHANNELS_LAST_MAX_WEIGHT
        if late:
            module.weight.data = module.weight.data.contiguous()
            module.register_forward_pre_hook(hook)
    return encoder


class _ContiguousInput:
    """Forward pre-hook: the input in the standard layout; the last copy is reused when the same activation
    feeds several convolutions (a residual block's first conv and its downsampling shortcut)."""

    def __init__(self) -> None:
        self.source: weakref.ref[torch.Tensor] | None = None
        self.copy: weakref.ref[torch.Tensor] | None = None

    def __call__(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        if x.is_contiguous():
            return args
        if self.source is not None and self.source() is x and self.copy is not None:
            cached = self.copy()
            if cached is not None:
                return (cached, *args[1:])
        out = x.contiguous()
        self.source, self.copy = weakref.ref(x), weakref.ref(out)
        return (out, *args[1:])

    def source_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The activation `t` is this hook's latest copy of, if it is."""
        if self.copy is None or self.source is None or not _same(t, self.copy()):
            return None
        return self.source()


class _Rebuild:
    """What autograd keeps in place of a saved tensor the step can remake exactly: the recipe, and the
    version of the tensor it reads (an in-place change to that tensor would make the remade one differ)."""

    def __init__(self, make: Callable[[], torch.Tensor], reads: torch.Tensor) -> None:
        self.make, self.reads, self.version = make, reads, reads._version

    def __call__(self) -> torch.Tensor:
        if self.reads._version != self.version:
            raise RuntimeError("PatchGD: a tensor saved for backward was modified in place")
        return self.make()


def _unpack(saved: torch.Tensor | _Rebuild) -> torch.Tensor:
    return saved() if isinstance(saved, _Rebuild) else saved


def _same(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    return (
        b is not None
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


@contextlib.contextmanager
def rebuilt_in_backward(
    encoder: nn.Module, sampled: torch.Tensor, rebuild: Callable[[], torch.Tensor], images: torch.Tensor
) -> Iterator[None]:
    """During one with-grad encoder forward, autograd saves two kinds of tensors as recipes instead:
    - the sampled patches (what the first layer saves for its weight gradient): re-gathered from the images,
      which the step holds anyway, so B·k patches are not held through the forward and backward;
    - on the host, the standard-layout copies `channels_last_encoder` makes of a channels-last activation
      (whose original the preceding layer saves anyway): copied again from that original.
    Each is remade once per use in backward: a memory copy, no layer is recomputed. Gradients are exact."""
    target = weakref.ref(sampled)
    layout = _LAYOUT_COPIES.get(encoder)

    def pack(t: torch.Tensor) -> torch.Tensor | _Rebuild:
        if _same(t, target()):
            return _Rebuild(rebuild, images)
        source = layout.source_of(t) if layout is not None else None
        if source is not None:
            return _Rebuild(source.contiguous, source)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        yield


_LAYOUT_COPIES: weakref.WeakKeyDictionary[nn.Module, _ContiguousInput] = weakref.WeakKeyDictionary()
