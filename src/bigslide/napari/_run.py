"""Turn the panels' choices into a run folder the CLI can replay, and drive the engine in a worker.

A run folder holds `slides.csv`, the drawn regions as GeoJSON (`regions/`), `config.yaml` and, once
training has started, `checkpoints/last.pt`. `bigslide train <out>/config.yaml` repeats the run.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigslide.engine.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from bigslide.errors import TrainingError

if TYPE_CHECKING:
    import napari

    from bigslide.engine.events import Event
    from bigslide.napari._session import Session


def write_run_folder(
    viewer: napari.Viewer,
    session: Session,
    out_dir: str | Path,
    *,
    method: str,
    method_params: dict[str, Any],
    data_values: dict[str, Any],
    model: ModelConfig,
    optim: OptimConfig,
    device: str,
) -> Path:
    """Write slides.csv (+ regions) and config.yaml into `out_dir`; returns the config path."""
    from bigslide.methods.base import make_params
    from bigslide.napari._regions import write_run_regions

    out = Path(out_dir).expanduser().resolve()
    make_params(method, method_params)  # a wrong parameter fails here, naming it
    table = session.table()
    write_run_regions(viewer, session, out / "regions")
    table = session.table()  # again: rows now point at the saved regions
    table.to_csv(out / "slides.csv")
    data = DataConfig(
        csv="slides.csv",
        tile_size=session.tile_size,
        mpp=session.target_mpp,
        slide_mpp=session.slide_mpp,
        min_tissue=session.min_tissue,
        **data_values,
    )
    config = TrainConfig(
        data=data,
        model=model,
        method=MethodConfig(method, dict(method_params)),
        optim=optim,
        run=RunConfig(out_dir=str(out), device=device),  # type: ignore[arg-type]
    )
    return config.to_yaml(out / "config.yaml")


def drive(run: Generator[Event, None, Any]) -> Generator[Event, None, Any]:
    """The engine's events, passed through for a napari worker.

    The worker reports a RuntimeError from the generator only as a warning, so (torch) runtime errors
    are re-raised as `TrainingError`, which reaches the worker's `errored` signal and the user.
    """
    try:
        return (yield from run)
    except RuntimeError as err:
        raise TrainingError(f"training failed: {err}") from err
