"""The feature store (`data.features`): the h5 layout bigslide writes, training from it as from recomputed
features, refusal of files made otherwise, files of other tools (CLAM, TRIDENT), extraction done once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from bigslide.data.decode import read_squares
from bigslide.data.feature_store import (
    ExpectedTiles,
    StoreSettings,
    check_unique_names,
    open_feature_file,
)
from bigslide.data.table import SlideTable
from bigslide.data.tile_cache import slide_bytes
from bigslide.engine import Loss, Message, Metrics, TrainConfig, predict_slide, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint, save_checkpoint
from bigslide.engine.features import weights_fingerprint
from bigslide.errors import ConfigError, DataError
from bigslide.nn.backbones import create_encoder
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide

TILE = 64
BAG = 6


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: the one-tile encoder calls below cost a hundredth of their time on two threads
    of a busy machine (oneDNN), and the runs compared stay deterministic either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("store-slides"), n_slides=6, size=(512, 512), seed=3)


def small_config(csv: Path, out: Path, features: Path | None = None, **params: object) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = TILE
    config.data.bag_size = BAG
    config.data.augment = False  # stored features are of the tiles as read; compare like with like
    config.data.workers = 0
    config.data.features = None if features is None else str(features)
    config.model.backbone = "test_resnet"
    config.method.name = "frozen_abmil"
    config.method.params = {"hidden": 16, "attention_dim": 8, **params}
    config.optim.epochs = 2
    config.optim.lr = 1e-2
    config.run.out_dir = str(out)
    config.run.device = "cpu"
    config.run.deterministic = True
    config.run.tensorboard = False
    return config


def drain(config: TrainConfig) -> tuple[list[object], object]:
    events: list[object] = []
    gen = train(config)
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            return events, stop.value


def losses(events: list[object]) -> list[float]:
    return [e.value for e in events if isinstance(e, Loss)]


def encodings(events: list[object]) -> list[str]:
    return [e.text for e in events if isinstance(e, Message) and e.text.startswith("features: encoding")]


def slides_of(csv: Path) -> list[Path]:
    return [e.path for e in SlideTable.from_csv(csv).entries]


@dataclasses.dataclass(frozen=True)
class Store:
    folder: Path
    events: list[object]  # of the run that wrote it
    encoder: torch.nn.Module  # that run's frozen encoder


@pytest.fixture(scope="module")
def store(slide_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A store written by a first training run, which encoded one tile per encoder call."""
    folder = tmp_path_factory.mktemp("store")
    config = small_config(slide_csv, folder / "run", folder / "features", inference_chunk_size=1)
    events, result = drain(config)
    return Store(folder / "features", events, result.method.mil_model.encoder)  # type: ignore[attr-defined]


def test_the_file_layout_is_clam_and_trident_s_with_bigslide_s_attributes(
    slide_csv: Path, store: Store
) -> None:
    folder, encoder = store.folder, store.encoder.eval()
    slide = slides_of(slide_csv)[0]
    path = folder / f"{slide.stem}.h5"
    with open_slide(slide) as s:
        grid = TileGrid.from_slide(s, TILE, min_tissue=0.6, target_mpp=0.5)
    with h5py.File(path, "r") as f:
        assert set(f) == {"features", "coords"}
        features, coords = f["features"], f["coords"]
        assert features.dtype == np.float32
        assert features.shape == (len(grid), encoder.dim)
        assert coords.dtype == np.int64
        np.testing.assert_array_equal(coords[()], grid.coords)  # every tile of the grid, level-0 (x, y)
        assert f.attrs["format"] == "bigslide-features"
        assert f.attrs["format_version"] == 1
        assert features.attrs["encoder"] == "test_resnet"
        assert features.attrs["encoder_sha256"] == weights_fingerprint(encoder)
        assert coords.attrs["patch_size"] == TILE
        assert coords.attrs["patch_size_level0"] == grid.tile_size_level0
        assert coords.attrs["target_mpp"] == 0.5
        assert grid.slide_mpp is not None
        np.testing.assert_allclose(coords.attrs["slide_mpp"], np.array(grid.slide_mpp))
        assert coords.attrs["target_magnification"] == pytest.approx(20.0)  # TRIDENT's readers want these
        rows = features[[0, len(grid) - 1]]
    # The rows are the frozen encoder's features of those tiles, read as training reads them.
    with open_slide(slide) as s:
        tiles = read_squares(s, grid.plan, grid.coords[[0, len(grid) - 1]])
    with torch.no_grad():
        expected = encoder(torch.from_numpy(tiles).float().div(255))
    np.testing.assert_allclose(rows, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert not list(folder.glob(".*.tmp"))  # written through a temporary file, renamed whole


def test_training_from_the_store_repeats_the_recomputing_run(
    slide_csv: Path, tmp_path: Path, store: Store
) -> None:
    stored_events = store.events
    # Exactly equal when the recomputing run also encodes one tile per call: each tile's features come from
    # the same computation, and the rows sampled are the recomputing run's tiles, in the same order.
    exact, _ = drain(small_config(slide_csv, tmp_path / "r1", None, inference_chunk_size=1))
    assert losses(stored_events) == losses(exact)
    val = [e.values for e in stored_events if isinstance(e, Metrics) and e.split == "val"]
    assert val == [e.values for e in exact if isinstance(e, Metrics) and e.split == "val"]
    # Encoding a whole bag per call (the default) may change a feature in its last bits, as a convolution's
    # result can depend on how many tiles share the call: equal to float32 rounding.
    batched, _ = drain(small_config(slide_csv, tmp_path / "r128"))
    np.testing.assert_allclose(losses(stored_events), losses(batched), rtol=1e-5)
    assert len(losses(stored_events)) == 2 * len(SlideTable.from_csv(slide_csv).subset("train"))


def test_a_missing_file_is_extracted_once_and_then_reused(
    slide_csv: Path, tmp_path: Path, store: Store
) -> None:
    folder, first = store.folder, store.events
    names = {p.stem for p in slides_of(slide_csv)}
    assert {f.stem for f in folder.glob("*.h5")} == names
    assert len(encodings(first)) == len(names)  # one pass per slide: train, val and test slides
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*.h5")}
    missing = folder / f"{sorted(names)[0]}.h5"
    copy = tmp_path / "features"
    copy.mkdir()
    for p in folder.glob("*.h5"):
        if p != missing:
            (copy / p.name).write_bytes(p.read_bytes())
    kept = {p.name: p.stat().st_mtime_ns for p in copy.glob("*.h5")}

    one = {"inference_chunk_size": 1}  # as the store was made: the file written again is the same
    again, _ = drain(small_config(slide_csv, tmp_path / "again", folder, **one))
    assert encodings(again) == []
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*.h5")} == stamps

    partly, _ = drain(small_config(slide_csv, tmp_path / "partly", copy, **one))
    assert [m.split(" into ")[1] for m in encodings(partly)] == [str(copy / missing.name)]
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("*.h5") if p.name != missing.name} == kept
    with h5py.File(copy / missing.name) as a, h5py.File(missing) as b:
        np.testing.assert_array_equal(a["features"][()], b["features"][()])


def _settings(store: Store) -> StoreSettings:
    return StoreSettings("test_resnet", weights_fingerprint(store.encoder), TILE, 0.5)


@pytest.mark.parametrize(
    ("change", "attribute"),
    [
        ({"encoder": "resnet18"}, "encoder"),
        ({"encoder_sha256": "0" * 64}, "encoder_sha256"),
        ({"tile_size": 2 * TILE}, "patch_size"),
        ({"target_mpp": 1.0}, "target_mpp"),
    ],
)
def test_a_file_made_with_other_settings_is_refused_by_name(
    slide_csv: Path, store: Store, change: dict[str, object], attribute: str
) -> None:
    folder = store.folder
    path = folder / f"{slides_of(slide_csv)[0].stem}.h5"
    open_feature_file(path, _settings(store))  # the settings it was made with pass
    with pytest.raises(DataError, match=rf"{path}: made with {attribute}="):
        open_feature_file(path, dataclasses.replace(_settings(store), **change))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "attribute"),
    [
        ({"slide_mpp": (0.25, 0.25)}, "slide_mpp"),
        ({"tile_size_level0": 2 * TILE}, "patch_size_level0"),
        ("drop-last-tile", "coords"),
        ({"slide_bytes": 12345}, "another slide of the same name"),  # a slide of its name elsewhere
    ],
)
def test_a_file_of_other_tiles_is_refused_by_name(
    slide_csv: Path, store: Store, change: object, attribute: str
) -> None:
    folder = store.folder
    slide = slides_of(slide_csv)[0]
    path = folder / f"{slide.stem}.h5"
    with open_slide(slide) as s:
        grid = TileGrid.from_slide(s, TILE, min_tissue=0.6, target_mpp=0.5)
    assert grid.slide_mpp is not None
    tiles = ExpectedTiles(grid.coords, grid.tile_size_level0, grid.slide_mpp, slide_bytes(slide))
    file = open_feature_file(path, _settings(store))
    tiles.check(file)
    other = (
        dataclasses.replace(tiles, coords=grid.coords[:-1])
        if change == "drop-last-tile"
        else dataclasses.replace(tiles, **change)  # type: ignore[arg-type]
    )
    with pytest.raises(DataError, match=rf"{path}: .*{attribute}"):
        other.check(file)


def test_a_run_with_other_weights_or_tiles_refuses_the_store(
    slide_csv: Path, tmp_path: Path, store: Store
) -> None:
    folder = store.folder
    torch.manual_seed(1)
    weights = tmp_path / "other.pt"
    torch.save(create_encoder("test_resnet").backbone.state_dict(), weights)
    config = small_config(slide_csv, tmp_path / "w", folder)
    config.model.weights = str(weights)
    with pytest.raises(DataError, match=r"\.h5: made with encoder_sha256="):
        run_to_end(train(config))
    config = small_config(slide_csv, tmp_path / "m", folder)
    config.data.min_tissue = 0.9  # fewer tiles than the store holds
    with pytest.raises(DataError, match=r"\.h5: its coords .* not this run's tile grid"):
        run_to_end(train(config))
    config = small_config(slide_csv, tmp_path / "m", folder)
    config.method.name = "abmil_acc"
    config.method.params = {"hidden": 16}
    with pytest.raises(ConfigError, match=r"data\.features: abmil_acc trains its encoder"):
        run_to_end(train(config))


def write_foreign(folder: Path, csv: Path, layout: str, dim: int) -> None:
    """Feature files as CLAM's extract_features_fp.py writes them (no attributes, int32 coords) or as
    TRIDENT does (attributes on coords), with plain h5py: tumour slides' features are shifted."""
    folder.mkdir(parents=True, exist_ok=True)
    table = {e.path: e.label for e in SlideTable.from_csv(csv).entries}
    rng = np.random.default_rng(0)
    for slide in table:
        n = 40
        xy = np.stack(np.meshgrid(np.arange(8) * 256, np.arange(5) * 256), -1).reshape(-1, 2)[:n]
        rows = rng.normal(size=(n, dim)).astype(np.float32)
        if table[slide] == "tumor":
            rows[:10] += 2.0  # a few "lesion" tiles
        with h5py.File(folder / f"{slide.stem}.h5", "w") as f:
            feats = f.create_dataset("features", data=rows, chunks=(1, dim), maxshape=(None, dim))
            coords = f.create_dataset("coords", data=xy.astype(np.int32 if layout == "clam" else np.int64))
            if layout == "trident":
                coords.attrs.update(
                    {
                        "patch_size": 256,
                        "patch_size_level0": 256,
                        "level0_magnification": 20,
                        "target_magnification": 20,
                        "overlap": 0,
                        "name": slide.stem,
                    }
                )
                feats.attrs.update({"name": slide.stem, "savetodir": str(folder)})


@pytest.mark.parametrize("layout", ["clam", "trident"])
def test_the_aggregator_trains_on_foreign_clam_and_trident_files(
    slide_csv: Path, tmp_path: Path, layout: str
) -> None:
    csv = slide_csv
    folder = tmp_path / "features"
    write_foreign(folder, csv, layout, dim=24)
    config = small_config(csv, tmp_path / "run", folder)
    with pytest.raises(DataError, match=r"\.h5: has no bigslide attributes .* data.feature_dim: 24"):
        run_to_end(train(config))
    config.data.features_foreign = True
    config.data.feature_dim = 24
    config.optim.epochs = 4
    events, result = drain(config)
    assert any("as they are (24 wide)" in e.text for e in events if isinstance(e, Message))
    assert encodings(events) == []  # nothing of bigslide's was written beside them
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{p.stem}.h5" for p in slides_of(csv))
    trained = losses(events)
    n = len(trained) // 4
    assert np.mean(trained[-n:]) < np.mean(trained[:n])  # the head learns the shift
    state = load_checkpoint(result.checkpoint)  # type: ignore[attr-defined]
    assert not any(k.startswith("encoder.") for k in state["model"])  # no encoder of its own
    pred = predict_slide(result.checkpoint, slides_of(csv)[0])  # type: ignore[attr-defined]
    grid = pred.grids["attention"]
    assert grid.cell_size_level0 == 256  # the files' tile step
    assert grid.scores.shape == (5, 8)
    assert np.isfinite(grid.scores).all()

    config.data.feature_dim = 32
    with pytest.raises(DataError, match=r"\.h5: features are 24 wide, data.feature_dim says 32"):
        run_to_end(train(config))


def test_attention_maps_from_the_store_land_where_recomputed_ones_do(
    slide_csv: Path, tmp_path: Path, store: Store
) -> None:
    folder = store.folder
    config = small_config(slide_csv, tmp_path / "run", folder)
    config.optim.epochs = 1
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    recompute = load_checkpoint(result.checkpoint)
    recompute["config"]["data"]["features"] = None
    plain = save_checkpoint(recompute, tmp_path / "plain.pt")
    slide = slides_of(slide_csv)[1]
    stored, computed = predict_slide(result.checkpoint, slide), predict_slide(plain, slide)
    a, b = stored.grids["attention"], computed.grids["attention"]
    assert (a.cell_size_level0, a.origin, a.mpp) == (b.cell_size_level0, b.origin, b.mpp)
    assert a.scores.shape == b.scores.shape
    np.testing.assert_array_equal(np.isnan(a.scores), np.isnan(b.scores))
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(stored.probs, computed.probs, rtol=1e-5)


def test_a_run_from_the_store_draws_its_board_and_its_checkpoint_predicts_a_cohort(
    slide_csv: Path, tmp_path: Path, store: Store
) -> None:
    """With TensorBoard on (the default), as `bigslide predict` reads a cohort: bags of stored features
    have no tile grids, and both once failed on that (an IndexError at the first epoch's end; every slide
    "feature file not attached")."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bigslide.cli.main import main

    config = small_config(slide_csv, tmp_path / "run", store.folder)
    config.optim.epochs = 1
    config.run.tensorboard = True
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    events = EventAccumulator(str(result.out_dir), size_guidance={"images": 0})
    events.Reload()
    assert [t for t in events.Tags()["images"] if "attention" in t]  # the first validation slide's map

    out = tmp_path / "predicted"
    argv = ["predict", "--slides", str(slide_csv), "--checkpoint", str(result.checkpoint)]
    assert main([*argv, "--out", str(out), "--workers", "0", "--device", "cpu"]) == 0
    rows = {Path(r.split(",")[0]).name: r for r in (out / "predictions.csv").read_text().splitlines()[1:]}
    slides = slides_of(slide_csv)
    assert len(rows) == len(slides)
    for slide in slides[:2]:  # each as one slide's own prediction gives it
        own = predict_slide(result.checkpoint, slide, device="cpu")
        assert f"{own.probs[1]:.6f}" in rows[slide.name], rows[slide.name]


def test_feature_settings_are_checked_in_the_config() -> None:
    with pytest.raises(ConfigError, match=r"data\.feature_dim: give the width"):
        TrainConfig.from_dict({"data": {"features": "f", "features_foreign": True}})
    with pytest.raises(ConfigError, match=r"data\.features_foreign: give the folder"):
        TrainConfig.from_dict({"data": {"features_foreign": True, "feature_dim": 8}})
    with pytest.raises(ConfigError, match=r"data\.feature_dim: only for foreign"):
        TrainConfig.from_dict({"data": {"features": "f", "feature_dim": 8}})


def test_slides_that_would_share_a_feature_file_are_an_error(tmp_path: Path) -> None:
    check_unique_names(tmp_path, [Path("a/s1.svs"), Path("a/s2.svs")])
    with pytest.raises(DataError, match=r"a/s1\.svs and b/s1\.tif would share the feature file .*s1\.h5"):
        check_unique_names(tmp_path, [Path("a/s1.svs"), Path("b/s1.tif")])
