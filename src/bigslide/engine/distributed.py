"""Data-parallel training under torchrun: each rank takes its share of the bags / images, and gradients are
averaged across ranks at every optimizer step.

Averaging at the step (one flat all-reduce of every gradient) is what DDP does, with its `no_sync()` during
accumulation built in: ε inner iterations of PatchGD, ACC's chunk replays and `optim.accumulate` batches
all communicate once. It needs no wrapper around the method's modules, so every method runs unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from bigslide.errors import ConfigError, TrainingError

T = TypeVar("T")


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    device: torch.device | None = None
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, order: np.ndarray) -> np.ndarray:
        """This rank's share of an epoch, padded by wrapping so that every rank takes as many steps."""
        if not self.active:
            return order
        per_rank = -(-len(order) // self.world)
        padded = np.resize(order, per_rank * self.world)
        return padded[self.rank :: self.world]

    def broadcast_module(self, module: nn.Module) -> None:
        """Start every rank from rank 0's parameters and buffers."""
        if self.active:
            with self.collective("broadcasting the model"):
                for tensor in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(tensor.data, src=0)

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Average every gradient over the ranks in one all-reduce. A parameter no rank has a gradient
        for keeps `grad = None`, as in a single process, so weight decay and momentum leave it alone;
        one with a gradient on some ranks only counts zeros for the others (as DDP does)."""
        if not self.active or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype)
        flat = torch.cat([*(g.reshape(-1) for g in grads), has_grad.to(grads[0].device)])
        with self.collective("averaging gradients"):
            dist.all_reduce(flat)
        ranks_with_grad = flat[-len(params) :].tolist()
        flat /= self.world
        offset = 0
        for p, count in zip(params, ranks_with_grad, strict=True):
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone() if count > 0 else None
            offset += n

    def share(self, n: int) -> np.ndarray:
        """This rank's items of `n` (every world-th from its rank; none repeated, unlike `shard`)."""
        return np.arange(n)[self.rank :: self.world] if self.active else np.arange(n)

    def gather(self, value: T, what: str) -> list[T] | None:
        """Every rank's `value` (picklable), in rank order, on rank 0; None on the others."""
        if not self.active:
            return [value]
        gathered: list[T] = [value] * self.world
        with self.collective(what):
            dist.all_gather_object(gathered, value)
        return gathered if self.is_main else None

    def barrier(self) -> None:
        if self.active:
            with self.collective("waiting for the other ranks"):
                dist.barrier()

    @contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """A collective that fails because another rank ended (its error is its own message) or timed out
        becomes one line naming this rank, instead of a backend traceback."""
        try:
            yield
        except (RuntimeError, OSError) as err:
            # the backend's first sentence, without its source path ("[.../pair.cc:561] Connection closed")
            text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip())
            detail = text.split(". ")[0].splitlines()[0] if text else type(err).__name__
            raise TrainingError(
                f"rank {self.rank}: stopped while {what}: another rank failed or stopped responding "
                f"(its own error says why) [{detail[:200]}]"
            ) from None

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


@dataclass
class EpochOutputs:
    """A rank's training targets and outputs over an epoch, by item, scored as one process scores them."""

    items: list[int] = field(default_factory=list)
    targets: list[Any] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)

    def add(self, items: Sequence[int], targets: list[Any], outputs: np.ndarray) -> None:
        self.items.extend(int(i) for i in items)
        self.targets.extend(targets)
        self.outputs.extend(outputs)

    def everyone(self, ranks: DistContext) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's targets and outputs on rank 0, each item once (rank 0's alone are half an epoch, and
        shares are padded by wrapping: the few items trained on two ranks would count twice); this rank's
        own on the others."""
        parts = ranks.gather((self.items, self.targets, self.outputs), "scoring the epoch's training")
        if not ranks.active or parts is None:
            return np.array(self.targets), np.array(self.outputs)
        first: dict[int, tuple[Any, np.ndarray]] = {}
        for items, targets, outputs in parts:
            for i, y, p in zip(items, targets, outputs, strict=True):
                first.setdefault(i, (y, p))
        return np.array([y for y, _ in first.values()]), np.array([p for _, p in first.values()])


def from_environment(device: str, *, timeout_s: float = 1800.0) -> DistContext:
    """Join the process group torchrun describes in the environment; a plain run gets a one-rank context.

    A collective that waits longer than `timeout_s` for another rank fails on every rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        raise ConfigError("run.device: cuda was asked for but no CUDA device is available; use auto or cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return DistContext(
        rank=rank,
        world=world,
        device=torch.device("cuda", local_rank) if use_cuda else torch.device("cpu"),
        owns_group=owns,
    )
