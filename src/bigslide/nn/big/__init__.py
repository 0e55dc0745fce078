"""Big-Layers: CNN layers that keep their activations in host memory and compute in device-sized partitions.

The first layers of a CNN hold most of its activation memory. `make_big` runs them on row partitions of
a tensor that does not fit on the device (BatchNorm with exact whole-tensor statistics), keeps their
activations in host RAM and runs the rest of the network normally on the device.
"""

from __future__ import annotations

from bigslide.nn.big.cheap import HostMaxPool2d, HostNormalize, HostReLU
from bigslide.nn.big.conv import BigConv2d
from bigslide.nn.big.convert import make_big, set_budget
from bigslide.nn.big.norm import BigBatchNorm2d
from bigslide.nn.big.partition import DeviceMeter, Partition, plan_partitions, track_device_memory

__all__ = [
    "BigBatchNorm2d",
    "BigConv2d",
    "DeviceMeter",
    "HostMaxPool2d",
    "HostNormalize",
    "HostReLU",
    "Partition",
    "make_big",
    "plan_partitions",
    "set_budget",
    "track_device_memory",
]
