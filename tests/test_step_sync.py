"""A training step never makes the host wait for the device until its loss is read.

On CUDA every read of a device value (`.item()`, `bool()`, `float()`, `.tolist()`, `.cpu()`), every shape
that depends on device data (`nonzero`, boolean masks) and every blocking copy from pageable host memory
stalls the host until the queued kernels finish, so the GPU idles while the host prepares the next
launches. The steps hand their loss over unread (`StepResult.loss` reads it when the engine asks).

On the CPU the check runs the step on the meta device (shapes without data) under a dispatch mode that
records each such operation on a device tensor; tests/test_cuda.py runs the same steps on CUDA under
`torch.cuda.set_sync_debug_mode("error")`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bigslide.data.colour import SampleStain, SampleView
from bigslide.data.sample import Sample
from bigslide.data.stain import draw_stain_jitter
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.abmil_acc import ABMILACC, ABMILACCParams
from bigslide.methods.base import Batch, Method, ModelSpec, StepResult
from bigslide.methods.mil import EndToEndParams
from bigslide.methods.mil_baselines import FullBag
from bigslide.methods.patchgd import PatchGD, PatchGDParams

aten = torch.ops.aten
_READS = {
    aten._local_scalar_dense.default,  # item(), bool(), float(), int(), tolist()
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
}


class DeviceWaits(TorchDispatchMode):
    """Records, by name, every operation on a `device` tensor that would make the host wait for it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.waits: list[str] = []

    def _on_device(self, value: object) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == self.device.type

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        why = self._wait(func, args, kwargs)
        if why:
            self.waits.append(f"{func} {why}".strip())
        return func(*args, **kwargs)

    def _wait(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why `func` on these arguments makes the host wait ("" for a read), or None."""
        if func in _READS:
            return "" if any(self._on_device(a) for a in args) else None
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            masks = [i for i in args[1] or [] if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
            return "with a boolean mask" if any(self._on_device(m) for m in masks) else None
        if func is aten._to_copy.default:
            source, target = args[0].device, torch.device(kwargs.get("device") or args[0].device)
            blocking = not kwargs.get("non_blocking", False)
        elif func is aten.copy_.default:
            source, target = args[1].device, args[0].device
            blocking = args[2:3] != (True,)
        else:
            return None
        if source.type == self.device.type and target.type == "cpu":
            return "to the host"
        if source.type == "cpu" and target.type == self.device.type and blocking:
            return "blocking, from the host"
        return None


TILE = 16


def abmil_acc(device: torch.device) -> tuple[Method[Any], Batch]:
    spec = ModelSpec("resnet18", num_classes=2, instance_loss="attention", instance_weight=0.5)
    method = ABMILACC(ABMILACCParams(chunk_size=3, forward_chunk_size=5, hidden=16), spec, device)
    labels = torch.full((7,), -1, dtype=torch.long)
    labels[[1, 4]] = torch.tensor([0, 2])  # a lesion tile and a "Not lesion" one
    return method, _bag_batch(device, 7, labels)


def abmil_acc_augmented(device: torch.device) -> tuple[Method[Any], Batch]:
    """Two bags in one batch, each with its own view (turns, mirror, tone) and stain perturbation: the
    colour maps move their per-bag tables to the device without waiting."""
    spec = ModelSpec("resnet18", num_classes=2)
    method = ABMILACC(ABMILACCParams(chunk_size=3, forward_chunk_size=5, hidden=16), spec, device)
    rng = np.random.default_rng(0)
    samples = [
        Sample(
            x=torch.randint(0, 256, (n, 3, TILE, TILE), dtype=torch.uint8),
            y=1,
            slide=f"s{n}",
            coords=np.zeros((n, 2), np.int64),
            stain=SampleStain(jitter=draw_stain_jitter(rng)),
            view=view,
        )
        for n, view in ((4, SampleView(1, True, 1.05, -0.01)), (3, SampleView(2, False, 0.95, 0.03)))
    ]
    x = torch.cat([s.x for s in samples])
    return method, Batch(_pinned(x, device), torch.tensor([1, 0]).to(device), samples, sizes=[4, 3])


def full_bag(device: torch.device) -> tuple[Method[Any], Batch]:
    method = FullBag(EndToEndParams(hidden=16), ModelSpec("resnet18", num_classes=2), device)
    return method, _bag_batch(device, 7, None)


def patchgd(device: torch.device, grad_chunk: int = 0) -> tuple[Method[Any], Batch]:
    # chunks of 3 of the 4 patches: exact with frozen encoder BatchNorm (and no batch of one to train on)
    frozen = "frozen" if grad_chunk else "train"
    params = PatchGDParams(
        patch_size=32, k=2, epsilon=2, latent_dim=8, head_width=8, grad_chunk=grad_chunk, encoder_bn=frozen
    )
    method = PatchGD(params, ModelSpec("resnet18", num_classes=2), device)
    x = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8)
    return method, Batch(_pinned(x, device), torch.tensor([0, 1]).to(device), [])


# name -> a method on a device and a batch as the engine collates it (pixels on the host, pinned on CUDA;
# targets on the device)
STEPS: dict[str, Callable[[torch.device], tuple[Method[Any], Batch]]] = {
    "abmil_acc": abmil_acc,
    "abmil_acc_augmented": abmil_acc_augmented,
    "full_bag": full_bag,
    "patchgd": patchgd,
    "patchgd_grad_chunk": lambda device: patchgd(device, grad_chunk=3),
}


def _pinned(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return x.pin_memory() if device.type == "cuda" else x


def _bag_batch(device: torch.device, n: int, labels: torch.Tensor | None) -> Batch:
    x = torch.randint(0, 256, (n, 3, TILE, TILE), dtype=torch.uint8)
    return Batch(_pinned(x, device), torch.tensor([1]).to(device), [], sizes=[n], instance_labels=labels)


def prepare(name: str, device: torch.device, amp: str | None = None) -> Callable[[], StepResult]:
    """One training step of method `name` on `device`, ready to run: method, batch and stepper are built
    here, the step (losses unread) when the returned function is called."""
    torch.manual_seed(0)
    method, batch = STEPS[name](device)
    method.model.train()
    fused = device.type == "cuda"  # the engine's optimizer there: skips an fp16 step on the device
    optimizer = torch.optim.AdamW(method.trainable_parameters(), lr=1e-4, fused=fused or None)
    stepper = OptimStepper(optimizer, grad_clip=1.0, amp=amp, device=device)
    return lambda: method.train_step(batch, stepper)


@pytest.mark.parametrize("name", list(STEPS))
def test_a_step_waits_for_the_device_only_when_its_loss_is_read(name: str) -> None:
    meta = torch.device("meta")
    step = prepare(name, meta)
    with DeviceWaits(meta) as recorder:
        results = [step(), step()]
    assert recorder.waits == []
    assert all(r.optimizer_steps >= 1 for r in results)


def test_the_recorder_sees_reads_in_forward_and_backward() -> None:
    """The check can fail: a value read in the forward pass, a boolean mask, a blocking copy from the host
    and a read inside backward are each recorded, or raise (a meta tensor holds no value to read)."""
    meta = torch.device("meta")
    x = torch.ones(4, device=meta, requires_grad=True)

    def caught(probe: Callable[[], object]) -> list[str]:
        with DeviceWaits(meta) as recorder:
            try:
                probe()
            except (RuntimeError, NotImplementedError) as err:  # in a step, this fails the test as well
                recorder.waits.append(f"raised {err}")
        return recorder.waits

    def read_in_backward() -> None:
        y = x * 2
        y.register_hook(lambda g: g.sum().item())  # type: ignore[func-returns-value]
        y.sum().backward()

    assert caught(lambda: float(x.sum()))
    assert caught(lambda: x[x.detach() > 0])
    assert caught(lambda: torch.ones(3).to(meta)) == ["aten._to_copy.default blocking, from the host"]
    assert caught(lambda: torch.empty(3, device=meta).copy_(torch.ones(3))) == [
        "aten.copy_.default blocking, from the host"
    ]
    assert caught(lambda: torch.ones(3).to(meta, non_blocking=True)) == []
    assert caught(read_in_backward)
    assert caught(lambda: x * 2) == []


def test_step_result_reads_its_loss_once_when_asked() -> None:
    loss = torch.tensor(0.25)
    result = StepResult(loss, torch.zeros(1, 2))
    assert result.loss == 0.25
    loss.fill_(9.0)  # read once: later changes to the tensor do not show
    assert result.loss == 0.25
    assert StepResult(1.5, torch.zeros(1, 2)).loss == 1.5
