"""Stain settings through the engine: the reference travels in the checkpoint and prediction normalises
as training did; stain-augmented training resumes exactly; every method accepts the stain maps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide.data.colour import RowColour, SampleStain
from bigslide.data.sample import Sample, collate
from bigslide.data.stain import draw_stain_jitter
from bigslide.data.stain_norm import BUNDLED_REFERENCES, fit_stain
from bigslide.data.table import SlideTable
from bigslide.engine import Loss, TrainConfig, load_trained, predict_slides, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.inference import predict_dataset, predict_sample
from bigslide.engine.setup import build_dataset, build_method
from bigslide.memory.stepper import OptimStepper
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.synthetic.slides import synthesize_slide


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stain-training")
    sets = {lab: make_slide_set(folder / lab, n_slides=4, size=(384, 384), seed=6, lab=lab) for lab in "AB"}
    # the second lab's set is the same tissue: same table, same lesions
    assert sets["A"].read_text() == sets["B"].read_text()
    assert (folder / "A" / "lesions.json").read_text() == (folder / "B" / "lesions.json").read_text()
    return sets


def config_for(csv: Path, out: Path, method: str = "abmil_acc", **data: object) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 4
    config.data.image_size = 64
    for key, value in data.items():
        setattr(config.data, key, value)
    config.model.backbone = "test_resnet"
    config.method.name = method
    if method == "patchgd":
        config.method.params = {"patch_size": 32, "k": 4, "latent_dim": 8, "head_norm": "group"}
    config.optim.epochs = 1
    config.run.out_dir = str(out)
    config.run.device = "cpu"
    config.run.tensorboard = False
    config.data.workers = 0
    return config


@pytest.mark.slow
def test_reference_is_saved_and_prediction_normalises_as_training(
    sets: dict[str, Path], tmp_path: Path
) -> None:
    reference_slide = SlideTable.from_csv(sets["A"]).entries[0].path
    config = config_for(
        sets["A"],
        tmp_path,
        stain_normalise="macenko",
        stain_reference=str(reference_slide),
        stain_augment=True,
    )
    result = run_to_end(train(config))
    assert result.method is not None
    assert result.checkpoint is not None
    trained = result.method.stain_reference
    assert trained is not None
    assert trained.method == "macenko"
    saved = load_checkpoint(result.checkpoint)["stain"]
    np.testing.assert_allclose(saved["vectors"], trained.values["vectors"])
    # the reference slide moves away: prediction must use the checkpoint's copy, not refit
    reference_slide.rename(reference_slide.with_name("moved.svs"))
    try:
        loaded = load_trained(result.checkpoint, device="cpu")
        assert loaded.method.stain_reference is not None
        np.testing.assert_allclose(loaded.method.stain_reference.values["amounts"], trained.values["amounts"])
        table = SlideTable.from_csv(sets["B"])
        _, raw = predict_slides(result.checkpoint, table, device="cpu", repeats=0)
        dataset = build_dataset(config, "bag", table, train=False, slides=_cache())
        direct = predict_dataset(result.method, dataset, repeats=0, workers=0)
        np.testing.assert_allclose(raw.probs, direct.probs, rtol=1e-5, atol=1e-6)
    finally:
        reference_slide.with_name("moved.svs").rename(reference_slide)


def _cache():  # type: ignore[no-untyped-def]
    from bigslide.data.slides import SlideCache

    return SlideCache()


@pytest.mark.slow
def test_stain_augmented_training_resumes_exactly(sets: dict[str, Path], tmp_path: Path) -> None:
    def losses(out: Path, *, stop_after: int = 0, resume: bool = False) -> list[float]:
        config = config_for(sets["A"], out, stain_augment=True)
        config.optim.epochs = 2
        config.run.deterministic = True
        gen = train(config, resume=resume)
        seen = []
        for event in gen:
            if isinstance(event, Loss):
                seen.append(event.value)
                if stop_after and len(seen) == stop_after:
                    gen.close()  # a stop: saves a checkpoint mid-epoch
                    break
        return seen

    whole = losses(tmp_path / "whole")
    first = losses(tmp_path / "stopped", stop_after=3)
    rest = losses(tmp_path / "stopped", resume=True)
    assert len(whole) == 4
    assert first + rest == pytest.approx(whole, rel=1e-5)


@pytest.mark.parametrize(
    "method",
    ["abmil_acc", "full_bag", "frozen_abmil", "biglayer_mil", "patchgd", "full_image", "biglayer_image"],
)
def test_every_method_maps_its_pixels(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training steps see each slide's normalised and perturbed pixels, prediction the normalised ones."""
    mapped: list[tuple[int, bool]] = []  # (rows, with a random perturbation) of every map applied
    apply = RowColour.__call__

    def spy(self: RowColour, x: torch.Tensor) -> torch.Tensor:
        mapped.append((x.shape[0] if x.ndim == 4 else 1, self.random))
        return apply(self, x)

    monkeypatch.setattr(RowColour, "__call__", spy)
    config = config_for(Path("unused.csv"), Path("unused"), method)
    if method.startswith("biglayer"):
        config.method.params = {"stages": 1, "budget_mb": 64.0}
    torch.manual_seed(0)
    built = build_method(config, ["a", "b"], torch.device("cpu"), stain=BUNDLED_REFERENCES["reinhard"])
    source = fit_stain("reinhard", synthesize_slide((128, 128), lesions=0, seed=1, lab="B").rgb)
    rng = np.random.default_rng(0)
    bag = built.kind == "bag"
    samples = [
        Sample(
            x=torch.randint(0, 256, (4, 3, 32, 32) if bag else (3, 64, 64), dtype=torch.uint8),
            y=k,
            slide=f"s{k}",
            coords=np.zeros((4, 2)) if bag else None,
            tile_size_level0=32,
            stain=SampleStain(source, draw_stain_jitter(rng)),
        )
        for k in range(2)
    ]
    batch = collate(samples[: built.batch_size(2)], torch.device("cpu"), uint8=built.takes_uint8)
    stepper = OptimStepper(torch.optim.SGD(list(built.trainable_parameters()), lr=0.01))
    built.model.train()
    built.train_step(batch, stepper)
    rows_per_item = 4 if bag else 1
    assert sum(rows for rows, random in mapped if random) >= len(batch.samples) * rows_per_item
    mapped.clear()
    plain = replace(samples[0], stain=SampleStain(source, None))
    predict_sample(built, plain)
    assert sum(rows for rows, _ in mapped) >= rows_per_item
    assert not any(r for _, r in mapped)


@pytest.mark.parametrize("augment", [False, True], ids=["normalised", "normalised_and_perturbed"])
def test_a_case_over_two_labs_normalises_each_slide_from_its_own_stain(
    sets: dict[str, Path], augment: bool
) -> None:
    """A case whose slides were stained in two labs: each slide's tiles in the case's bag get the map that
    slide alone would get (its own stain fit; the case's one perturbation), not one fit for the mixture."""
    from bigslide.data.bags import BagDataset
    from bigslide.data.colour import row_colour

    pair = [SlideTable.from_csv(sets[lab]).entries[0] for lab in "AB"]
    table = SlideTable([replace(e, case="c1", split="train") for e in pair], ["normal", "tumor"])
    reference = BUNDLED_REFERENCES["reinhard"]
    bags = BagDataset(
        table, tile_size=32, bag_size=0, stain_normalise="reinhard", stain_augment=float(augment)
    )
    case = bags[0]
    assert case.stain is not None
    assert len(case.stain.parts) == 2
    assert case.stain.source is None
    colour = row_colour([case], reference)
    assert colour is not None
    mapped = colour(case.x.float() / 255)
    for part, fit in zip(case.parts, case.stain.parts):
        alone = replace(case, x=case.x[part.tiles], parts=(), stain=SampleStain(fit, case.stain.jitter))
        truth = row_colour([alone], reference)
        assert truth is not None
        torch.testing.assert_close(mapped[part.tiles], truth(alone.x.float() / 255))
    # the two labs' renders of one tissue (the tiles at the same place) come closer normalised than scanned
    assert case.coords is not None
    at = [{tuple(case.coords[t]): t for t in part.tiles} for part in case.parts]
    both = sorted(set(at[0]) & set(at[1]))
    a, b = (torch.as_tensor([at[k][c] for c in both]) for k in (0, 1))
    assert len(both) > 20
    raw = (case.x[a].float() - case.x[b].float()).abs().mean() / 255
    if not augment:
        assert (mapped[a] - mapped[b]).abs().mean() < 0.6 * raw  # 0.42 here
