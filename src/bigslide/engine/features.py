"""The feature store (`data.features`): a frozen encoder's tile features written once per slide, then read.

`attach_feature_store` is what a run does before its first step: for each slide without a feature file, one
extraction pass over every tile of the slide's grid, written atomically; then every file is opened and
checked against what this run would compute (encoder and a hash of its weights, tile size, µm/px, tiles).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bigslide.data.feature_bags import FeatureBagDataset
from bigslide.data.feature_store import StoreSettings, write_feature_file
from bigslide.data.loader import default_workers
from bigslide.data.processes import read_slide_squares
from bigslide.data.tile_cache import slide_bytes
from bigslide.engine.config import TrainConfig
from bigslide.engine.events import Event, Message
from bigslide.errors import ConfigError
from bigslide.methods.base import Method
from bigslide.methods.replay import encode_chunks
from bigslide.nn.backbone_args import encoder_identity


def weights_fingerprint(module: nn.Module) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes and bytes, in name order): other weights, or
    other BatchNorm statistics, give another fingerprint."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        value = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def frozen_encoder(config: TrainConfig, method: Method) -> nn.Module:
    """The method's frozen encoder, or a `ConfigError` saying that stored features do not apply to it."""
    encoder = method.frozen_encoder()
    if encoder is None:
        raise ConfigError(
            f"data.features: {method.name} trains its encoder, so its tile features change every step; "
            "stored features serve methods with a frozen encoder (frozen_abmil)"
        )
    return encoder


def store_settings(config: TrainConfig, method: Method) -> StoreSettings:
    """What this run's feature files must have been made with."""
    encoder = frozen_encoder(config, method)
    foreign = config.data.features_foreign
    return StoreSettings(
        encoder=None if foreign else encoder_identity(config.model.backbone, config.model.backbone_args),
        encoder_sha256=None if foreign else weights_fingerprint(encoder),
        tile_size=config.data.tile_size,
        target_mpp=config.data.read_mpp,
    )


def attach_feature_store(
    config: TrainConfig, method: Method, datasets: Iterable[object]
) -> Generator[Event, None, int]:
    """Write the missing feature files of the run's feature datasets, then open and check every file.
    Yields a message per file written; returns how many were written."""
    encoder = frozen_encoder(config, method)
    bags = [d for d in datasets if isinstance(d, FeatureBagDataset)]
    if not bags:
        return 0
    settings = store_settings(config, method)
    chunk = max(1, int(getattr(method.params, "inference_chunk_size", 128)))
    if config.data.features_foreign:
        yield Message(
            f"features: taking the files in {config.data.features} as they are "
            f"({config.data.feature_dim} wide); bigslide cannot check which encoder, tile size and µm/px "
            "made files without its attributes"
        )
    if config.data.augment:
        yield Message("features: data.augment does not apply to stored features (tiles are encoded as read)")
    written = 0
    for bags_of_split in bags:
        for i, entry in enumerate(bags_of_split.table.entries):
            path = bags_of_split.path(i)
            if not path.is_file() and not config.data.features_foreign:
                grid = bags_of_split.grid(i)
                yield Message(f"features: encoding {len(grid)} tiles of {entry.path.name} into {path}")
                extract_slide(bags_of_split, i, encoder, settings, chunk=chunk, device=method.device)
                written += 1
            bags_of_split.attach(i, settings)
    return written


def extract_slide(
    bags: FeatureBagDataset,
    i: int,
    encoder: nn.Module,
    settings: StoreSettings,
    *,
    chunk: int,
    device: torch.device,
    workers: int | None = None,
) -> Path:
    """Encode every tile of slide i's grid, `chunk` tiles per encoder call, and write its feature file.

    Tiles are read as training reads them (`read_slide_squares`, uint8, scaled on the device) and encoded by
    the eval-mode encoder without grad; the next chunk is decoded while this one is encoded, in the slides'
    decode workers when they have them, else on `workers` threads."""
    entry, grid = bags.table.entries[i], bags.grid(i)
    encoder.eval()
    starts = range(0, len(grid), chunk)
    rows: list[np.ndarray] = []
    n_workers = 0 if bags.slides.workers is not None else default_workers() if workers is None else workers
    with (
        ThreadPoolExecutor(n_workers) if n_workers else nullcontext() as pool,
        ThreadPoolExecutor(1) as ahead,
    ):

        def read(start: int) -> np.ndarray:
            coords = grid.coords[start : start + chunk]
            return read_slide_squares(bags.slides, Path(entry.path), grid.plan, coords, pool)

        pending = ahead.submit(read, starts[0]) if len(starts) else None
        for k in range(len(starts)):
            assert pending is not None
            squares = pending.result()
            pending = ahead.submit(read, starts[k + 1]) if k + 1 < len(starts) else None
            # one encoder call per chunk, as the recomputing path calls it on a bag
            x = torch.from_numpy(squares)
            z = encode_chunks(encoder, x, chunk, device=device)
            rows.append(z.float().cpu().numpy())
    mpp = grid.slide_mpp or (float("nan"), float("nan"))
    return write_feature_file(
        bags.path(i),
        np.concatenate(rows),
        grid.coords,
        settings,
        tile_size_level0=grid.tile_size_level0,
        slide_mpp=(float(mpp[0]), float(mpp[1])),
        slide_name=Path(entry.path).name,
        slide_bytes=slide_bytes(Path(entry.path)),
    )
