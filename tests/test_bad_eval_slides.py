"""A validation or test slide that opens and tiles but whose tiles cannot be decoded: the run saves what
it trained and says where, or (data.skip_bad_slides) leaves that slide out of the split and goes on."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from bigslide.engine import TrainConfig, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.events import Message
from bigslide.errors import SlideError
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide
from tests.test_workers import config_for as worker_config
from tests.test_workers import drive


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("eval-slides")
    table = make_slide_set(folder, n_slides=8, size=(1024, 1024), seed=11)
    with table.open() as f:
        rows = list(csv.DictReader(f))
    return [table.parent / r["slide"] for r in sorted(rows, key=lambda r: r["label"])]


def level0_damaged(slide: Path, out: Path) -> Path:
    """A copy of `slide` whose level-0 file tiles are overwritten: it opens and its grid is made from the
    coarser levels, but no tile of it can be read for the model."""
    import tifffile

    out.write_bytes(slide.read_bytes())
    with tifffile.TiffFile(out) as tif:
        page = tif.pages[0]
        spots = list(zip(page.dataoffsets, page.databytecounts))
    with out.open("r+b") as f:
        for offset, count in spots:
            f.seek(offset + 2)
            f.write(bytes([0xFF, 0xC4, 0x00, 0x01]) * ((count - 4) // 4))
    with open_slide(out) as opened:
        assert len(TileGrid.from_slide(opened, 32, target_mpp=0.5)) > 0  # tiled, not left out when tiling
    return out


def config_for(rows: list[tuple[Path, str, str]], out: Path, workers: int, skip: bool) -> TrainConfig:
    table = out.parent / f"{out.name}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with table.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["slide", "label", "split"])
        writer.writerows(rows)
    config = worker_config(table, out, workers, skip_bad_slides=skip)
    config.optim.epochs = 1
    return config


def table_rows(slides: list[Path], bad: Path, split: str) -> list[tuple[Path, str, str]]:
    """Four training slides, two validation and two test slides, `bad` in place of the first of
    `split`'s (labels of each split balanced)."""
    labels = ["normal"] * 4 + ["tumor"] * 4
    splits = ["train", "train", "val", "test"] * 2
    rows = [(s, label, sp) for s, label, sp in zip(slides, labels, splits)]
    at = splits.index(split)
    rows[at] = (bad, labels[at], split)
    return rows


# validation read by decode worker processes, the test split on this process's threads
@pytest.mark.parametrize(("split", "workers"), [("val", 1), ("test", 0)])
def test_a_slide_that_cannot_be_read_in_validation_or_test_keeps_the_trained_steps(
    slides: list[Path], tmp_path: Path, split: str, workers: int
) -> None:
    which = slides[2] if split == "val" else slides[3]
    bad = level0_damaged(which, tmp_path / "damaged.svs")
    rows = table_rows(slides, bad, split)

    stopped = config_for(rows, tmp_path / "stopped", workers, skip=False)
    with pytest.raises(SlideError) as caught:
        drive(train(stopped))
    message = str(caught.value)
    doing = "validating" if split == "val" else "scoring the test split"
    assert message.startswith(f"{bad}: cannot decode file tile")
    epoch = 0 if split == "val" else 1  # the test split is scored once the epoch is counted done
    assert f"the run stopped while {doing} at step 4 (epoch {epoch})" in message
    ckpt = tmp_path / "stopped" / "checkpoints" / "last.pt"
    assert f"its last checkpoint is {ckpt} (step 4)" in message
    assert "data.skip_bad_slides: true" in message
    assert load_checkpoint(ckpt)["position"]["step"] == 4  # the four steps trained are kept
    if split == "test":  # the epoch's validation metrics are kept too
        assert (tmp_path / "stopped" / "metrics.json").is_file()
    shutil.rmtree(tmp_path / "stopped")

    skipping = config_for(rows, tmp_path / "skipping", workers, skip=True)
    events, result = drive(train(skipping))
    where = "validation" if split == "val" else "the test split"
    said = [e for e in events if isinstance(e, Message) and "left out of" in e.text]
    left_out = [e.text for e in said]
    assert left_out == [left_out[0]]
    assert left_out[0].startswith(f"left out of {where} (data.skip_bad_slides): ")
    assert str(bad) in left_out[0]
    assert said[0].left_out == (str(bad),)  # named as a file too, for napari's last words
    assert result.steps == 4
    if split == "val":
        assert result.history[-1]["val"]  # scored on the validation slide that could be read
    else:
        assert result.test is not None
