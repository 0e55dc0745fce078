"""Cases of several slides: one bag over all of a case's slides, tiles that keep their slide and level-0
coordinates, one prediction row per case and a heatmap on each slide."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide.cli.main import main
from bigslide.data.bags import BagDataset
from bigslide.data.feature_bags import FeatureBagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.table import SlideTable
from bigslide.engine.inference import load_trained, predict_dataset
from bigslide.errors import DataError
from bigslide.explain.heatmap import ScoreGrid
from bigslide.synthetic.study import make_study_set


def without_cases(table: SlideTable) -> SlideTable:
    return table.like([dataclasses.replace(e, case=None) for e in table.entries])


@pytest.fixture(scope="module")
def cases_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("cases"), "cases", n=12, size=(512, 512), seed=3)


def test_a_case_is_one_bag_over_its_slides_with_every_tile_from_its_own_slide(cases_csv: Path) -> None:
    table = SlideTable.from_csv(cases_csv)
    cases = BagDataset(table, tile_size=32, bag_size=20, seed=1)
    slides = BagDataset(without_cases(table), tile_size=32, bag_size=0)
    assert len(slides) == 12
    assert len(cases) == 4
    for i, rows in enumerate(cases.items):
        assert len(rows) == 3
        bag = cases[i]
        assert bag.x.shape[0] == 20
        assert bag.coords is not None
        parts = bag.by_slide()
        assert {p.slide for p in parts} <= {str(table.entries[r].path) for r in rows}
        assert sorted(np.concatenate([p.tiles for p in parts]).tolist()) == list(range(20))
        for part in parts:
            row = next(r for r in rows if str(table.entries[r].path) == part.slide)
            # the same pixels as the slide's own bag of every tile, at the same level-0 coordinates
            whole = slides[row]
            assert whole.coords is not None
            where = {tuple(c): k for k, c in enumerate(whole.coords)}
            for t in part.tiles:
                assert torch.equal(bag.x[t], whole.x[where[tuple(bag.coords[t])]])
    every = BagDataset(table, tile_size=32, bag_size=0)
    assert every.tile_count(0) == sum(len(slides.grids[r]) for r in every.items[0])


def test_without_a_case_column_each_slide_is_its_own_bag_as_before(cases_csv: Path) -> None:
    table = SlideTable.from_csv(cases_csv)
    alone = without_cases(table)
    bags = BagDataset(alone, tile_size=32, bag_size=6, seed=4)
    assert bags.items == [[i] for i in range(12)]
    bag = bags[5]
    assert bag.parts == ()
    assert bag.slide == str(alone.entries[5].path)
    indices = np.sort(np.random.default_rng([4, 0, 5, 0]).choice(len(bags.grids[5]), 6, replace=False))
    np.testing.assert_array_equal(bag.coords, bags.grids[5].coords[indices])


def test_case_tables_refuse_split_disagreement_and_image_methods(cases_csv: Path, tmp_path: Path) -> None:
    lines = cases_csv.read_text().splitlines()
    header, first = lines[0].split(","), lines[1].split(",")
    first[header.index("split")] = "val" if first[header.index("split")] != "val" else "train"
    broken = tmp_path / "broken.csv"
    broken.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    for slide in cases_csv.parent.glob("*.svs"):
        (tmp_path / slide.name).symlink_to(slide)
    with pytest.raises(
        DataError, match=r"broken.csv, row 3: case 'case_000' is in split 'train' here but in 'val' at row 2"
    ):
        SlideTable.from_csv(broken)
    table = SlideTable.from_csv(cases_csv)
    with pytest.raises(DataError, match=r"case 'case_000' has 3 slides, and whole-image methods"):
        SlideImageDataset(table, image_size=64)
    assert without_cases(table).case_of_several() is None


def test_training_on_cases_from_stored_features_repeats_the_recomputing_run(
    cases_csv: Path, tmp_path: Path
) -> None:
    """A case's bag of stored features is its slides' rows one after the other, the tiles its pixel bag
    reads: the same losses and validation figures as encoding the pixels each step."""
    from bigslide.engine import Loss, Metrics, TrainConfig, train

    def run(out: Path, features: Path | None) -> list[object]:
        config = TrainConfig()
        config.data.csv, config.data.tile_size, config.data.bag_size = str(cases_csv), 32, 12
        config.data.augment, config.data.workers = False, 0
        config.data.features = None if features is None else str(features)
        config.model.backbone = "test_resnet"
        config.method.name = "frozen_abmil"
        config.method.params = {"hidden": 16, "attention_dim": 8, "inference_chunk_size": 1}
        config.optim.epochs, config.optim.lr = 2, 1e-2
        config.run.out_dir, config.run.device = str(out), "cpu"
        config.run.deterministic, config.run.tensorboard = True, False
        return list(train(config))

    stored = run(tmp_path / "stored", tmp_path / "features")
    recomputed = run(tmp_path / "recomputed", None)
    assert len(list((tmp_path / "features").glob("*.h5"))) == 12  # a file per slide

    def figures(events: list[object]) -> tuple[list[float], list[dict[str, float]]]:
        losses = [e.value for e in events if isinstance(e, Loss)]
        return losses, [e.values for e in events if isinstance(e, Metrics) and e.split == "val"]

    assert len(figures(stored)[0]) == 2 * 2  # two epochs of the two training cases
    assert figures(stored) == figures(recomputed)
    table = SlideTable.from_csv(cases_csv)
    bags = FeatureBagDataset(table, tmp_path / "features", tile_size=32, bag_size=0)
    assert bags.items == list(table.cases().values())


@pytest.fixture(scope="module")
def trained(cases_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("case-run")
    args = ["train", "--method", "abmil_acc", "--set", f"data.csv={cases_csv}", "--set", "data.tile_size=32"]
    args += ["--set", "data.bag_size=12", "--set", "model.backbone=test_resnet", "--epochs", "1"]
    assert main([*args, "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    return out / "checkpoints" / "last.pt"


def test_attention_over_a_case_lands_on_each_tile_of_each_slide(cases_csv: Path, trained: Path) -> None:
    method = load_trained(trained, device="cpu").method
    table = SlideTable.from_csv(cases_csv)
    bags = BagDataset(table, tile_size=32, bag_size=0)
    preds = predict_dataset(method, bags, repeats=0, with_grids=True, workers=0, items=[1])
    by_slide = preds.grids[0]
    assert set(by_slide) == {str(table.entries[r].path) for r in bags.items[1]}
    scores = method.predict(bags[1]).instance_scores
    assert scores is not None
    bag = bags[1]
    assert bag.coords is not None
    total = 0.0
    for part in bag.by_slide():
        grid = by_slide[part.slide]["attention"]
        cells = (bag.coords[part.tiles] - np.array(grid.origin)) / grid.cell_size_level0
        assert np.all(cells == np.round(cells))  # cells are this slide's tiles, where the tiles are
        got = grid.scores[cells[:, 1].astype(int), cells[:, 0].astype(int)]
        np.testing.assert_allclose(got, scores[part.tiles], rtol=1e-5)
        assert np.isfinite(grid.scores).sum() == len(part.tiles)
        total += float(np.nansum(grid.scores))
    assert total == pytest.approx(1.0, rel=1e-4)  # one softmax over the whole case


def test_predict_writes_one_row_per_case_and_a_heatmap_per_slide(
    cases_csv: Path, trained: Path, tmp_path: Path
) -> None:
    out = tmp_path / "p"
    assert main(["predict", "--slides", str(cases_csv), "--checkpoint", str(trained), "--out", str(out)]) == 0
    with (out / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    table = SlideTable.from_csv(cases_csv)
    assert [r["case"] for r in rows] == list(table.cases())
    assert list(rows[0])[:4] == ["case", "slides", "label", "predicted"]  # the table's label beside
    for row, slides in zip(rows, table.cases().values(), strict=True):
        assert row["slides"].split(";") == [str(table.entries[i].path) for i in slides]
        assert float(row["p_normal"]) + float(row["p_tumor"]) == pytest.approx(1.0, abs=1e-5)
    stems = {p.name.split(".")[0] for p in (out / "heatmaps").glob("*.attention.npz")}
    assert stems == {e.path.name.split(".")[0] for e in table.entries}
    # each slide's row counts the tiles read from that slide, not its case's under the first slide
    tiles = {
        Path(r["slide"]).name: r["tiles"]
        for r in map(json.loads, map(Path.read_text, (out / "slides").glob("*.json")))
    }
    for e in table.entries:
        scores = ScoreGrid.load_npz(out / "heatmaps" / f"{e.path.name.split('.')[0]}.attention.npz").scores
        assert tiles[e.path.name] == np.isfinite(scores).sum() > 0


def test_a_case_that_fails_says_its_error_once(tmp_path: Path) -> None:
    """Every slide of a case that cannot be read carries the case's error: the row said it twice."""
    from bigslide.cli.report import write_predictions
    from bigslide.data.endpoint import Endpoint
    from bigslide.data.table import SlideEntry
    from bigslide.engine.slide_prediction import SlideFailure

    entries = [SlideEntry(tmp_path / f"{n}.svs", "tumor", None, None, "p1") for n in "ab"]
    error = "b.svs: cannot decode file tile (row 0, col 0) of level 0"
    path = write_predictions(
        [SlideFailure(e.path, error) for e in entries],
        tmp_path / "out",
        heatmaps=False,
        table=SlideTable(entries, ["normal", "tumor"]),
        endpoint=Endpoint(classes=["normal", "tumor"]),
    )
    with path.open() as f:
        assert [(r["case"], r["error"]) for r in csv.DictReader(f)] == [("p1", error)]


def test_a_slide_moved_into_another_case_is_predicted_again_with_its_new_case(
    cases_csv: Path, trained: Path, tmp_path: Path
) -> None:
    """A rerun kept each slide's row of its old case: the grown case's prediction was still its old one."""
    out = tmp_path / "p"
    args = ["--checkpoint", str(trained), "--no-heatmaps", "--quiet"]
    assert main(["predict", "--slides", str(cases_csv), "--out", str(out), *args]) == 0
    with cases_csv.open() as f:
        rows = list(csv.DictReader(f))
    first = rows[0]
    moved = next(r for r in rows if r["case"] != first["case"] and r["label"] == first["label"])
    moved["case"], moved["split"] = first["case"], first["split"]
    table = cases_csv.parent / "moved.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["predict", "--slides", str(table), "--out", str(out), *args]) == 0
    assert main(["predict", "--slides", str(table), "--out", str(tmp_path / "fresh"), *args]) == 0
    assert (out / "predictions.csv").read_text() == (tmp_path / "fresh" / "predictions.csv").read_text()
