"""PyTorch's threads beside the decode workers when the model runs on the CPU.

PyTorch starts one intra-op thread per core, and its threads spin while they wait for work: beside decode
worker processes on the same cores, the model's threads and the workers take turns on them. Measured with
`bigslide bench predict`'s cohort on two cores (8 slides, 10,215 tiles): one decode worker and one torch
thread predicted it in 6.5-6.9 s, against 8.7-9.6 s with two torch threads; two workers, 6.4 s against
7.3-7.6 s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from bigslide.data.loader import usable_cores


@contextmanager
def threads_beside_workers(device: torch.device, workers: int) -> Iterator[None]:
    """Within: torch's intra-op threads no more than the cores `workers` decode processes leave (one at
    least) when the model runs on the CPU, unless the user chose a number (OMP_NUM_THREADS); as before
    after."""
    before = torch.get_num_threads()
    wanted = max(1, usable_cores() - workers)
    if device.type != "cpu" or workers < 1 or "OMP_NUM_THREADS" in os.environ or wanted >= before:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(before)
