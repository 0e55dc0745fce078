"""`make_big`: turn the stem and the first stages of a timm ResNet into Big-Layers, in place.

The converted modules share the original Parameter and buffer objects and keep their names, so
state dicts load both ways and pretrained weights keep giving the same function (timm's own stem
padding is kept). Everything after the big part stays native and runs on the compute device.
"""

from __future__ import annotations

from torch import nn

from bigslide.errors import ConfigError
from bigslide.nn.backbones import Encoder
from bigslide.nn.big.cheap import HostMaxPool2d, HostNormalize, HostReLU, SendToComputeDevice
from bigslide.nn.big.conv import BigConv2d
from bigslide.nn.big.norm import BigBatchNorm2d

_STEM = ("conv1", "bn1", "act1", "maxpool")


def _convert(module: nn.Module, budget_bytes: int, path: str) -> nn.Module:
    kind = type(module)
    if kind is nn.Conv2d:
        return BigConv2d.from_native(module, budget_bytes)  # type: ignore[arg-type]
    if kind is nn.BatchNorm2d:
        return BigBatchNorm2d.from_native(module, budget_bytes)  # type: ignore[arg-type]
    if kind is nn.ReLU:
        return HostReLU(inplace=module.inplace)  # type: ignore[arg-type]
    if kind is nn.MaxPool2d:
        pool: nn.MaxPool2d = module  # type: ignore[assignment]
        return HostMaxPool2d(
            pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.return_indices, pool.ceil_mode
        )
    if isinstance(module, BigConv2d | BigBatchNorm2d):
        raise ConfigError(f"model: {path} is already a Big-Layer; convert a model only once")
    for name, child in module.named_children():
        setattr(module, name, _convert(child, budget_bytes, f"{path}.{name}"))
    if any(p is not None for p in module._parameters.values()):
        # the stem is always converted: fewer stages cannot keep one of its layers native
        cure = (
            "Big-Layers need a stem of Conv2d, BatchNorm2d, ReLU and MaxPool2d (resnet18, resnet50, "
            "resnet18d…): choose such a backbone"
            if path.split(".")[0] in _STEM
            else "lower method.params.stages so it stays native"
        )
        raise ConfigError(
            f"model.backbone: {path} ({kind.__name__}) has parameters but no Big-Layer version; {cure}"
        )
    return module


def _stage_count(model: nn.Module) -> int:
    count = 0
    while hasattr(model, f"layer{count + 1}"):
        count += 1
    return count


def make_big(model: nn.Module, stages: int, budget_bytes: int) -> nn.Module:
    """Convert the stem (conv1, bn1, act1, maxpool) and `layer1..layer{stages}` to Big-Layers in place.

    `model` is a timm ResNet-family model or an `Encoder` wrapping one. The returned model takes a host
    (CPU) tensor and returns its output on the compute device, the device of its parameters.
    `budget_bytes` bounds the device memory one partition of a big layer uses.
    """
    if isinstance(model, Encoder):
        make_big(model.backbone, stages, budget_bytes)
        norm = model.normalize
        model.normalize = HostNormalize(
            tuple(norm.mean.flatten().tolist()), tuple(norm.std.flatten().tolist())
        )
        return model
    if isinstance(model, nn.Sequential) and len(model) and all(hasattr(model[0], n) for n in _STEM):
        # a plain module's ResNet that returns its feature map, with the pooling (and projection) bigslide
        # put after it: its stages are converted, what follows runs on the device as before
        make_big(model[0], stages, budget_bytes)
        return model
    available = _stage_count(model)
    if not all(hasattr(model, name) for name in _STEM) or available == 0:
        raise ConfigError(
            f"model.backbone: Big-Layers support timm ResNet-family models (conv1, bn1, act1, maxpool, "
            f"layer1..); {type(model).__name__} is not one"
        )
    if not 0 <= stages <= available:
        raise ConfigError(f"method.params.stages: {stages} is outside 0..{available} for this backbone")
    if budget_bytes <= 0:
        raise ConfigError(
            f"method.params.budget_mb: the device budget must be positive, got {budget_bytes} B"
        )
    names = [*_STEM, *(f"layer{i}" for i in range(1, stages + 1))]
    for name in names:
        setattr(model, name, _convert(getattr(model, name), budget_bytes, name))
    model.get_submodule(names[-1]).register_forward_hook(SendToComputeDevice(model.get_submodule("bn1")))
    model.big_stages = stages  # type: ignore[assignment]
    return model


def split_stages(model: nn.Module, stages: int) -> tuple[list[nn.Module], list[nn.Module]]:
    """A ResNet-family model's modules before global pooling: the stem and `layer1..layer{stages}` (what
    `make_big` converts), and the native stages after them."""
    total = _stage_count(model)
    big = [model.get_submodule(name) for name in _STEM]
    big += [model.get_submodule(f"layer{i}") for i in range(1, stages + 1)]
    return big, [model.get_submodule(f"layer{i}") for i in range(stages + 1, total + 1)]


def set_budget(model: nn.Module, budget_bytes: int) -> None:
    """Change the device budget of every big layer in `model`."""
    for module in model.modules():
        if isinstance(module, BigConv2d | BigBatchNorm2d):
            module.budget_bytes = budget_bytes
