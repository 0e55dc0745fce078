"""A full garbage collection walks only what was made since bigslide's panels opened, not the
million objects napari, Qt and torch keep for the life of the process."""

from __future__ import annotations

import gc
from typing import Any


def test_long_lived_objects_are_left_out_of_collections(viewer: Any, dock: Any) -> None:
    dock("Train")
    collectable = sum(len(gc.get_objects(generation)) for generation in range(3))
    assert gc.get_freeze_count() > 5 * collectable, (gc.get_freeze_count(), collectable)
