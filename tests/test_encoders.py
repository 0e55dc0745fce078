"""Encoders users bring: a timm model from the Hugging Face cache (`hf-hub:org/name`, no network), a plain
`nn.Module` of their own (`package.module:factory`), state dicts as other tools save them; and a checkpoint
that predicts without any of them (no hub, no cache, no `model.weights` file)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import SwiGLUPacked
from torch import nn

from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import ModelConfig
from bigslide.engine.inference import load_trained, predict_slide
from bigslide.errors import ConfigError
from bigslide.methods.base import ModelSpec
from bigslide.nn.backbone_args import backbone_arguments
from bigslide.nn.backbones import create_encoder
from bigslide.nn.hub_models import cached_hub_models, hub_recipe
from bigslide.synthetic.slide_set import make_slide_set

HUB_ID = "bigslide-test/tiny-encoder"
HUB_MEAN, HUB_STD = [0.6, 0.5, 0.7], [0.2, 0.25, 0.15]


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("encoder-slides"), n_slides=4, size=(512, 512), seed=5)


def put_in_cache(cache: Path, hub_id: str, architecture: str, model_args: dict, model: nn.Module) -> None:
    """`model` as `huggingface-cli download` leaves a timm model in the cache: its weights and a
    config.json naming its architecture and the arguments it is built with."""
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, snapshot / "model.safetensors")
    config = {
        "architecture": architecture,
        "num_classes": 0,
        "model_args": model_args,
        "pretrained_cfg": {"input_size": [3, 64, 64], "mean": HUB_MEAN, "std": HUB_STD, "num_classes": 0},
    }
    (snapshot / "config.json").write_text(json.dumps(config))


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache holding one timm model, laid out as `huggingface-cli download` leaves it, and
    the hub offline (`HF_HUB_OFFLINE=1`): only the cache can answer."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    torch.manual_seed(1)
    put_in_cache(cache, HUB_ID, "test_resnet", {}, timm.create_model("test_resnet", num_classes=0))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_recipe.cache_clear()
    yield cache
    hub_recipe.cache_clear()


def test_a_hub_model_of_another_library_in_the_cache_is_named_as_such(
    hub_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = hub_cache / "models--owkin--phikon" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (hub_cache / "models--owkin--phikon" / "refs").mkdir()
    (hub_cache / "models--owkin--phikon" / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["ViTModel"], "model_type": "vit"}))
    with pytest.raises(
        ConfigError,
        match=r"hf-hub:owkin/phikon: it is in the Hugging Face cache, but it is not a timm model"
        r".*ViTModel.*package\.module:factory",
    ):
        create_encoder("hf-hub:owkin/phikon", pretrained=True)
    # what can be chosen without a network: the cache's timm models, not the other library's
    assert cached_hub_models() == [f"hf-hub:{HUB_ID}"]
    from bigslide.cli.main import main

    assert main(["encoders"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"hf-hub:{HUB_ID}"]
    assert f"1 timm model in the Hugging Face cache, {hub_cache}" in err


def small_config(csv: Path, out: Path, backbone: str, method: str = "abmil_acc") -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 6
    config.data.image_size = 64
    config.model.backbone = backbone
    config.method.name = method
    config.optim.epochs = 1
    config.optim.max_steps = 2
    config.run.out_dir = str(out)
    config.run.device = "cpu"
    return config


def test_a_hub_encoder_trains_from_the_local_cache_and_its_checkpoint_predicts_without_it(
    hub_cache: Path, slide_csv: Path, tmp_path: Path
) -> None:
    encoder = create_encoder(f"hf-hub:{HUB_ID}", pretrained=True)
    # the repository's own weights and normalisation, not timm's defaults for the architecture
    torch.manual_seed(1)
    reference = timm.create_model("test_resnet", num_classes=0)
    for name, value in reference.state_dict().items():
        assert torch.equal(encoder.backbone.state_dict()[name], value), name
    assert encoder.normalize.mean.flatten().tolist() == pytest.approx(HUB_MEAN)
    assert encoder.normalize.std.flatten().tolist() == pytest.approx(HUB_STD)

    config = small_config(slide_csv, tmp_path / "run", f"hf-hub:{HUB_ID}")
    config.model.pretrained = True
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    saved = load_checkpoint(result.checkpoint)
    assert saved["encoder"]["architecture"] == "test_resnet"
    slide = slide_csv.parent / "slide_000.svs"
    with_cache = predict_slide(result.checkpoint, slide, device="cpu")

    shutil.rmtree(hub_cache)  # another machine: no network, nothing cached
    hub_recipe.cache_clear()
    with pytest.raises(ConfigError, match=r"model.backbone: hf-hub:.*Hugging Face cache"):
        create_encoder(f"hf-hub:{HUB_ID}")
    trained = load_trained(result.checkpoint, device="cpu")
    assert trained.method.model.encoder.normalize.mean.flatten().tolist() == pytest.approx(HUB_MEAN)
    without = predict_slide(result.checkpoint, slide, device="cpu")
    np.testing.assert_allclose(without.probs, with_cache.probs, rtol=1e-6)
    np.testing.assert_allclose(
        without.grids["attention"].scores, with_cache.grids["attention"].scores, rtol=1e-5, equal_nan=True
    )
    # and trained on from it (napari's Retrain with annotations), still without the hub's cache
    retrain = small_config(slide_csv, tmp_path / "retrain", f"hf-hub:{HUB_ID}")
    retrain.model.pretrained = True
    retrain.model.init_from = str(result.checkpoint)
    again = run_to_end(train(retrain))
    assert again.checkpoint is not None
    assert load_checkpoint(again.checkpoint)["encoder"] == saved["encoder"]


def test_a_hub_encoder_missing_from_the_cache_offline_is_a_config_error(hub_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.backbone: hf-hub:bigslide-test/absent: .*HF_HOME"):
        create_encoder("hf-hub:bigslide-test/absent", pretrained=True)
    # its configuration cached but not its weights: random weights are fine, the published ones are named
    next(hub_cache.rglob("model.safetensors")).unlink()
    assert create_encoder(f"hf-hub:{HUB_ID}").dim > 0
    with pytest.raises(ConfigError, match=rf"model.pretrained: hf-hub:{HUB_ID}: .*Hugging Face cache"):
        create_encoder(f"hf-hub:{HUB_ID}", pretrained=True)


# as Virchow's config.json asks: a ViT returning every token (class, 4 registers, patches), unpooled
TOKENS_ARGS = {"img_size": 64, "num_classes": 0, "global_pool": "", "reg_tokens": 4}
CARD_ARGS = {"mlp_layer": "timm.layers.SwiGLUPacked", "act_layer": "torch.nn.SiLU"}
"""What Virchow2's and UNI2-h's model cards pass to timm.create_model beside the name: layers that their
config.json cannot hold."""


def test_a_hub_vit_returning_its_tokens_embeds_a_tile_as_its_class_token_beside_its_patch_mean(
    hub_cache: Path, slide_csv: Path, tmp_path: Path
) -> None:
    torch.manual_seed(3)
    vit = timm.create_model("test_vit", **TOKENS_ARGS).eval()
    put_in_cache(hub_cache, "lab/tokens", "test_vit", TOKENS_ARGS, vit)
    encoder = create_encoder("hf-hub:lab/tokens", pretrained=True).eval()
    tiles = torch.rand(3, 3, 64, 64)
    with torch.no_grad():
        tokens = vit(encoder.normalize(tiles))
        assert tokens.shape == (3, 1 + 4 + 16, vit.num_features)  # what the model itself returns
        expected = torch.cat([tokens[:, 0], tokens[:, 5:].mean(dim=1)], dim=1)
        torch.testing.assert_close(encoder(tiles), expected)
    assert encoder.dim == 2 * vit.num_features
    # a projection (PatchGD's latent) comes after the pooling
    assert create_encoder("hf-hub:lab/tokens", out_dim=7)(tiles).shape == (3, 7)

    config = small_config(slide_csv, tmp_path / "run", "hf-hub:lab/tokens")
    config.model.pretrained = True
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    slide = slide_csv.parent / "slide_000.svs"
    with_cache = predict_slide(result.checkpoint, slide, device="cpu")
    shutil.rmtree(hub_cache)  # the checkpoint rebuilds it without the hub
    hub_recipe.cache_clear()
    without = predict_slide(result.checkpoint, slide, device="cpu")
    np.testing.assert_allclose(without.probs, with_cache.probs, rtol=1e-6)


def test_layers_a_model_card_passes_to_timm_are_backbone_args_and_travel_with_the_checkpoint(
    hub_cache: Path, slide_csv: Path, tmp_path: Path
) -> None:
    torch.manual_seed(4)
    card = backbone_arguments(CARD_ARGS)
    assert card == {"mlp_layer": SwiGLUPacked, "act_layer": nn.SiLU}
    published = timm.create_model("test_vit", **TOKENS_ARGS, **card)
    put_in_cache(hub_cache, "lab/card", "test_vit", TOKENS_ARGS, published)
    # its config.json alone builds another MLP: the published weights do not fit, and the cure is named
    with pytest.raises(ConfigError, match=r"hf-hub:lab/card: its weights do not fit .*model.backbone_args"):
        create_encoder("hf-hub:lab/card", pretrained=True)
    with pytest.raises(ConfigError, match=r"model.backbone_args.act_layer: torch.nn.Silu names no object"):
        TrainConfig.from_dict({"model": {"backbone_args": {**CARD_ARGS, "act_layer": "torch.nn.Silu"}}})

    with pytest.raises(ConfigError, match=r"model.backbone_args: test_vit failed with them .*mlp_layers"):
        ModelSpec(backbone="test_vit", backbone_args={"mlp_layers": "timm.layers.SwiGLUPacked"}).encoder()

    config = small_config(slide_csv, tmp_path / "run", "hf-hub:lab/card")
    config.model.pretrained = True
    config.model.backbone_args = dict(CARD_ARGS)
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    slide = slide_csv.parent / "slide_000.svs"
    with_cache = predict_slide(result.checkpoint, slide, device="cpu")
    shutil.rmtree(hub_cache)
    hub_recipe.cache_clear()
    without = predict_slide(result.checkpoint, slide, device="cpu")
    np.testing.assert_allclose(without.probs, with_cache.probs, rtol=1e-6)


def test_virchow2_by_its_name_alone_is_built_as_its_card_builds_it(hub_cache: Path) -> None:
    torch.manual_seed(5)
    published = timm.create_model("test_vit", **TOKENS_ARGS, **backbone_arguments(CARD_ARGS))
    put_in_cache(hub_cache, "paige-ai/Virchow2", "test_vit", TOKENS_ARGS, published)
    encoder = ModelSpec(backbone="hf-hub:paige-ai/Virchow2", pretrained=True).encoder().eval()
    for name, value in published.state_dict().items():  # the published weights, every one of them fitting
        assert torch.equal(encoder.backbone.vit.state_dict()[name], value), name
    assert encoder.dim == 2 * published.num_features  # class token beside the patch tokens' mean


PLAIN_MODULES = """
import torch
from torch import nn


def pooled():  # no num_features: its width is measured
    torch.manual_seed(2)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )


class Stated(nn.Module):
    num_features = 5

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))


def unpooled():  # a feature map, as a torchvision trunk returns: averaged over its height and width
    torch.manual_seed(4)
    return nn.Conv2d(3, 4, 3)


def with_classifier():  # timm's default: num_features states the width before the classifier
    import timm

    return timm.create_model("test_resnet", num_classes=7)


def tokens():
    return nn.Sequential(nn.Conv2d(3, 4, 16, stride=16), nn.Flatten(2))


def vit_tokens(reg_tokens=0):  # a timm ViT built unpooled, its arguments from model.backbone_args
    import timm

    return timm.create_model("test_vit", img_size=32, num_classes=0, global_pool="", reg_tokens=reg_tokens)


def not_a_module():
    return "a string"


def broken():  # a factory of the user's that fails, e.g. on a weights file it expects
    raise FileNotFoundError("weights/encoder.pth")


def mistyped():  # a bug of the user's own that raises a TypeError, though it takes no arguments
    return nn.Conv2d(3, "four", 3)


def lazy():  # sized by the first tiles it sees: the run's, not some other size
    return nn.Sequential(nn.Conv2d(3, 2, 3, padding=1), nn.Flatten(), nn.LazyLinear(6))


def stated_norm(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)):  # its normalisation from model.backbone_args
    module = nn.Sequential(nn.Conv2d(3, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    module.pretrained_cfg = {"mean": mean, "std": std}
    return module


class Float64(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3)).double()


def by_side():  # its width depends on the side of what it encodes: 2 x (side / 8) ** 2
    return nn.Sequential(nn.Conv2d(3, 2, 8, stride=8), nn.Flatten())


class OnlySmall(nn.Module):  # takes tiles of at most 48 px, and says its width
    num_features = 4

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        assert x.shape[-1] <= 48, "tiles of at most 48 px"
        return self.conv(x)  # a feature map, to be averaged
"""


@pytest.fixture
def plain_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_encoders.py").write_text(textwrap.dedent(PLAIN_MODULES))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_encoders"


def test_a_plain_module_is_an_encoder_by_its_import_path(plain_modules: str) -> None:
    pooled = create_encoder(f"{plain_modules}:pooled")
    assert pooled.dim == 8  # measured on blank tiles
    assert pooled.backbone.training  # the measurement leaves its mode as it was
    assert pooled.normalize.mean.flatten().tolist() == pytest.approx([0.485, 0.456, 0.406])
    assert pooled(torch.rand(3, 3, 32, 32)).shape == (3, 8)
    stated = create_encoder(f"{plain_modules}:Stated")
    assert stated.dim == 5
    assert stated.normalize.mean.flatten().tolist() == pytest.approx([0.5, 0.5, 0.5])
    projected = create_encoder(f"{plain_modules}:pooled", out_dim=3)  # PatchGD's latent projection
    assert projected.dim == 3
    assert projected(torch.rand(2, 3, 32, 32)).shape == (2, 3)
    unpooled = create_encoder(f"{plain_modules}:unpooled")
    assert unpooled.dim == 4
    x = torch.rand(3, 3, 32, 32)
    conv = nn.Conv2d(3, 4, 3)
    conv.load_state_dict(unpooled.backbone[0].state_dict())
    assert torch.allclose(unpooled(x), conv(unpooled.normalize(x)).mean(dim=(2, 3)), atol=1e-6)
    assert create_encoder(f"{plain_modules}:unpooled", out_dim=3)(x).shape == (3, 3)
    with pytest.warns(UserWarning, match=r"states num_features \d+ but returns 7 values per tile"):
        assert create_encoder(f"{plain_modules}:with_classifier").dim == 7
    with pytest.raises(ConfigError, match=r"returns \(2, 4, 196\).*class token"):
        create_encoder(f"{plain_modules}:tokens")
    vit = create_encoder(f"{plain_modules}:vit_tokens", reg_tokens=2)  # as model.backbone_args gives it
    assert vit.dim == 2 * vit.backbone.vit.num_features
    assert vit.backbone.prefix == 3
    assert vit(torch.rand(2, 3, 32, 32)).shape == (2, vit.dim)
    with pytest.raises(ConfigError, match=r"returned a str, not a torch nn\.Module"):
        create_encoder(f"{plain_modules}:not_a_module")
    with pytest.raises(ConfigError, match=r"my_encoders:broken failed: FileNotFoundError: weights/encoder"):
        create_encoder(f"{plain_modules}:broken")
    with pytest.raises(ConfigError, match=r"my_encoders:mistyped failed: TypeError: "):
        create_encoder(f"{plain_modules}:mistyped")
    with pytest.raises(
        ConfigError, match=r"model\.backbone: no_such_package\.encoders:f: ModuleNotFoundError"
    ):
        create_encoder("no_such_package.encoders:f")


@pytest.mark.parametrize(
    ("method", "factory"), [("abmil_acc", "pooled"), ("patchgd", "pooled"), ("abmil_acc", "unpooled")]
)
def test_a_plain_module_trains_and_predicts(
    method: str, factory: str, plain_modules: str, slide_csv: Path, tmp_path: Path
) -> None:
    config = small_config(slide_csv, tmp_path / method, f"{plain_modules}:{factory}", method)
    if method == "patchgd":
        config.method.params = {"patch_size": 32, "latent_dim": 8, "epsilon": 2, "encoder_bn": "frozen"}
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    pred = predict_slide(result.checkpoint, slide_csv.parent / "slide_001.svs", device="cpu")
    assert pred.probs.sum() == pytest.approx(1.0, abs=1e-5)


WEIGHT_FORMS = ["safetensors", "state_dict_key", "model_key", "ddp_prefix", "backbone_prefix", "lightning"]


@pytest.mark.parametrize("form", [*WEIGHT_FORMS, "bigslide_checkpoint", "dino_teacher"])
def test_weights_load_as_other_tools_save_them(form: str, tmp_path: Path) -> None:
    torch.manual_seed(3)
    source = timm.create_model("test_resnet", num_classes=0)
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    path = tmp_path / ("w.safetensors" if form == "safetensors" else "w.pt")
    if form == "safetensors":
        save_file(state, path)
    else:
        saved: dict[str, object] = {
            "state_dict_key": {"state_dict": state, "epoch": 3},
            "model_key": {"model": state, "optimizer": {}},
            "ddp_prefix": {f"module.{k}": v for k, v in state.items()},
            "backbone_prefix": {f"backbone.{k}": v for k, v in state.items()},
            # a Lightning module holding it as model.backbone, beside its head
            "lightning": {
                "state_dict": {**{f"model.backbone.{k}": v for k, v in state.items()}, "head.w": 0}
            },
            "bigslide_checkpoint": {"model": {f"encoder.backbone.{k}": v for k, v in state.items()}},
            "dino_teacher": {"teacher": {f"backbone.{k}": v for k, v in state.items()}, "student": {}},
        }[form]
        torch.save(saved, path)
    encoder = create_encoder("test_resnet", weights=path)
    for name, value in state.items():
        assert torch.equal(encoder.backbone.state_dict()[name], value), name


def test_weights_that_are_not_a_state_dict_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    path.write_text("not weights")
    with pytest.raises(ConfigError, match=r"model.weights: .*notes.pt is not a state dict"):
        create_encoder("test_resnet", weights=path)
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "other.pt")
    with pytest.raises(ConfigError, match=r"model.weights: .*other.pt does not fit test_resnet"):
        create_encoder("test_resnet", weights=tmp_path / "other.pt")


def test_a_checkpoint_predicts_without_the_weights_file_it_started_from(
    slide_csv: Path, tmp_path: Path
) -> None:
    weights = tmp_path / "start.pt"
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), weights)
    config = small_config(slide_csv, tmp_path / "run", "test_resnet")
    config.model.weights = str(weights)
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    slide = slide_csv.parent / "slide_002.svs"
    before = predict_slide(result.checkpoint, slide, device="cpu")
    weights.unlink()  # the checkpoint holds every weight: predicting elsewhere needs no copy of the file
    after = predict_slide(result.checkpoint, slide, device="cpu")
    np.testing.assert_allclose(after.probs, before.probs, rtol=1e-6)


def test_a_vit_of_a_fixed_input_size_takes_tiles_of_any_size_and_is_unchanged_at_its_own() -> None:
    torch.manual_seed(4)
    fixed = timm.create_model("vit_tiny_patch16_224", num_classes=0).eval()
    encoder = create_encoder("vit_tiny_patch16_224").eval()
    encoder.backbone.load_state_dict(fixed.state_dict())
    tiles = torch.rand(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(encoder(tiles), fixed(encoder.normalize(tiles)), rtol=1e-5, atol=1e-5)
        assert encoder(torch.rand(2, 3, 256, 256)).shape == (2, encoder.dim)  # a foundation model's tiles
        assert encoder(torch.rand(2, 3, 64, 64)).shape == (2, encoder.dim)
    with pytest.raises(AssertionError, match="doesn't match model"):
        fixed(torch.rand(1, 3, 256, 256))  # what timm's model alone does


def test_a_hub_vit_sized_by_its_pretrained_cfg_alone_is_rebuilt_at_that_size_without_the_hub(
    hub_cache: Path,
) -> None:
    """A ViT whose config.json gives its size only as pretrained_cfg's input_size (no model_args): timm
    builds it at that size from the hub, and a checkpoint's recipe must too (its position embeddings did
    not fit before)."""
    hub_id = "bigslide-test/vit-112"
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=112)
    put_in_cache(hub_cache, hub_id, "vit_tiny_patch16_224", {}, vit)
    written = next(hub_cache.glob("models--bigslide-test--vit-112/snapshots/*/config.json"))
    config = json.loads(written.read_text())
    # as timm's save_for_hf writes a ViT's: its size is fixed, and timm builds the model at it
    config["pretrained_cfg"].update(input_size=[3, 112, 112], fixed_input_size=True)
    written.write_text(json.dumps(config))
    hub_recipe.cache_clear()
    live = create_encoder(f"hf-hub:{hub_id}", pretrained=True)
    recipe = hub_recipe(f"hf-hub:{hub_id}")
    assert recipe is not None
    shutil.rmtree(hub_cache / "models--bigslide-test--vit-112")  # the checkpoint's machine has no cache
    rebuilt = create_encoder(f"hf-hub:{hub_id}", recipe=recipe)
    assert live.backbone.pos_embed.shape == (1, 50, 192)  # 7 x 7 patches and a class token
    rebuilt.load_state_dict(live.state_dict())  # the same shapes
    tiles = torch.rand(2, 3, 112, 112)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(tiles), live.eval()(tiles))


@pytest.mark.parametrize(
    ("name", "side"),
    [
        ("mobilenetv3_small_050", 64),  # its head convolution widens the pooled 288 values to 1,024
        ("vit_small_patch14_dinov2", 64),  # 64 px is no whole number of its 14 px patches
        ("vit_tiny_patch16_224", 40),
    ],
)
def test_a_timm_encoder_gives_dim_values_per_tile_of_any_size(name: str, side: int) -> None:
    encoder = create_encoder(name)
    with torch.no_grad():
        out = encoder.eval()(torch.rand(2, 3, side, side))
    assert out.shape == (2, encoder.dim)


def test_local_weights_saved_with_their_classifier_load_and_a_misfit_is_named(tmp_path: Path) -> None:
    torch.manual_seed(3)
    source = timm.create_model("resnet18")  # saved as trained: its 1,000-class fc included
    path = tmp_path / "resnet18.pt"
    torch.save(source.state_dict(), path)
    for out_dim in (None, 256):  # the MIL methods' encoder; PatchGD's, projected to its latent size
        encoder = create_encoder("resnet18", weights=path, out_dim=out_dim)
        assert torch.equal(encoder.backbone.conv1.weight, source.conv1.weight)
    misfit = {**source.state_dict(), "conv1.weight": torch.zeros(32, 3, 7, 7)}
    torch.save(misfit, tmp_path / "misfit.pt")
    with pytest.raises(
        ConfigError,
        match=r"misfit\.pt does not fit resnet18: shapes differ for conv1\.weight \(32, 3, 7, 7\) "
        r"\(the model's \(64, 3, 7, 7\)\)",
    ):
        create_encoder("resnet18", weights=tmp_path / "misfit.pt")


def test_an_encoder_object_as_the_backbone_is_refused_with_how_to_name_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.backbone: a name is needed, not a Linear object.*factory"):
        ModelConfig(backbone=nn.Linear(3, 2))  # type: ignore[arg-type]
    config = small_config(tmp_path / "slides.csv", tmp_path / "run", "resnet18")
    config.model.backbone = nn.Linear(3, 2)  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"model\.backbone: a name is needed"):
        run_to_end(train(config))
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_a_plain_module_is_measured_on_the_runs_own_tiles(plain_modules: str) -> None:
    lazy = create_encoder(f"{plain_modules}:lazy", tile_side=32)
    assert lazy.dim == 6
    assert lazy(torch.rand(3, 3, 32, 32)).shape == (3, 6)  # sized for 32 px tiles, not for 224 px ones
    small = create_encoder(f"{plain_modules}:OnlySmall", tile_side=32)
    assert small.dim == 4
    assert small(torch.rand(3, 3, 32, 32)).shape == (3, 4)  # its feature map seen, and averaged
    with pytest.raises(
        ConfigError,
        match=r"OnlySmall failed on a \(2, 3, 64, 64\) batch of tiles .*at most 48 px.*"
        r"choose a data\.tile_size",
    ):
        create_encoder(f"{plain_modules}:OnlySmall", tile_side=64)


@pytest.mark.parametrize(
    ("mean", "std", "words"),
    [
        ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375), r"0\.\.255.*divide them by 255"),
        ((0.5, 0.5, 0.5, 0.5), (0.2, 0.2, 0.2, 0.2), r"3 values each"),
        ((0.5, 0.5, 0.5), (0.0, 0.2, 0.2), r"a std must be positive"),
    ],
)
def test_a_normalisation_that_cannot_be_for_rgb_in_unit_range_is_named(
    mean: tuple[float, ...], std: tuple[float, ...], words: str, plain_modules: str
) -> None:
    with pytest.raises(ConfigError, match=rf"model\.backbone: my_encoders:stated_norm states mean .*{words}"):
        create_encoder(f"{plain_modules}:stated_norm", mean=mean, std=std)
    assert create_encoder(f"{plain_modules}:stated_norm", mean=(0.5,), std=(0.2,)).dim == 2  # one for all


def test_float64_features_are_named(plain_modules: str) -> None:
    with pytest.raises(
        ConfigError, match=r"my_encoders:Float64 returns float64 features; end it with \.float"
    ):
        create_encoder(f"{plain_modules}:Float64")


def test_patchgd_measures_a_plain_module_on_its_patches(plain_modules: str) -> None:
    from bigslide.methods.patchgd import _patch_encoder

    encoder = _patch_encoder(ModelSpec(backbone=f"{plain_modules}:by_side"), 3, 32)
    assert encoder(torch.rand(2, 3, 32, 32)).shape == (2, 3)  # 2 x 4 x 4 values projected, not 2 x 28 x 28


def test_a_class_of_the_script_itself_is_warned_about_and_named_when_it_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.modules["__main__"], "ScriptEncoder", lambda: nn.Flatten(), raising=False)
    with pytest.warns(
        UserWarning, match=r"__main__:ScriptEncoder is defined in this script.*move it into a module"
    ):
        assert create_encoder("__main__:ScriptEncoder", tile_side=4).dim == 48
    monkeypatch.delattr(sys.modules["__main__"], "ScriptEncoder")
    with pytest.raises(ConfigError, match=r"__main__:ScriptEncoder: AttributeError.*move it into a module"):
        create_encoder("__main__:ScriptEncoder")


def test_a_projected_hub_encoder_loads_its_weights_when_its_config_names_no_classifier(
    hub_cache: Path,
) -> None:
    """PatchGD's projection (timm's num_classes) beside published weights that hold none: timm leaves it
    out only when the configuration names the classifier, which put_in_cache's, like some labs', does not."""
    encoder = create_encoder(f"hf-hub:{HUB_ID}", pretrained=True, out_dim=8)
    torch.manual_seed(1)
    published = timm.create_model("test_resnet", num_classes=0)
    assert torch.equal(encoder.backbone.conv1[0].weight, published.conv1[0].weight)
    assert encoder(torch.rand(2, 3, 32, 32)).shape == (2, 8)


def test_hub_errors_name_the_cache_folder_and_an_architecture_timm_lacks(hub_cache: Path) -> None:
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(hub_cache))} here.*download bigslide-test/absent"
    ):
        create_encoder("hf-hub:bigslide-test/absent", pretrained=True)
    put_in_cache(hub_cache, "lab/newer", "not_in_this_timm", {}, timm.create_model("test_resnet"))
    with pytest.raises(
        ConfigError,
        match=r"hf-hub:lab/newer: its config.json names the architecture 'not_in_this_timm', which timm",
    ):
        create_encoder("hf-hub:lab/newer")


def test_a_timm_model_of_one_input_size_timm_cannot_resize_names_the_tile_size() -> None:
    with pytest.raises(
        ConfigError,
        match=r"test_maxvit is built for 160 px inputs and fails on the 32 px tiles.*img_size: 32",
    ):
        create_encoder("test_maxvit", tile_side=32)
    assert create_encoder("test_maxvit", tile_side=32, img_size=32)(torch.rand(2, 3, 32, 32)).shape[0] == 2
