import re
from collections.abc import Callable
from pathlib import Path

import pytest

from bigslide.engine.config import DataConfig, OptimConfig, TrainConfig
from bigslide.errors import ConfigError
from bigslide.methods import make_params


def test_yaml_round_trip_keeps_every_value(tmp_path: Path) -> None:
    config = TrainConfig()
    config.method.name = "patchgd"
    config.method.params = {"patch_size": 64, "epsilon": 3}
    config.optim.lr = 3e-5
    config.optim.max_steps = 7
    config.run.amp = "bf16"
    config.data.target_mpp = 0.25
    path = config.to_yaml(tmp_path / "c.yaml")
    again = TrainConfig.from_yaml(path)
    assert again == config


def test_relative_csv_is_resolved_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "c.yaml"
    path.write_text("data:\n  csv: ../slides.csv\n")
    assert TrainConfig.from_yaml(path).data.csv == str((tmp_path / "slides.csv").resolve())


def test_paths_starting_with_a_tilde_are_in_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-written config naming ~/... was read (and its run folder made) under a folder named ~."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "c.yaml"
    path.write_text(
        "data: {csv: ~/slides.csv, features: ~/features}\n"
        "model: {weights: ~/uni.safetensors, init_from: ~/first/last.pt}\n"
        "run: {out_dir: ~/runs/second}\n"
    )
    config = TrainConfig.from_yaml(path)
    home = tmp_path / "home"
    assert config.data.csv == str(home / "slides.csv")
    assert config.data.features == str(home / "features")
    assert config.model.weights == str(home / "uni.safetensors")
    assert config.model.init_from == str(home / "first" / "last.pt")
    assert config.run.out_dir == str(home / "runs" / "second")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optim:\n  lr: fast\n", "optim.lr: expected float"),
        ("optim:\n  lr: nan\n", "optim.lr: expected float"),
        ("optim:\n  epochs: 1.5\n", "optim.epochs: expected int"),
        ("run:\n  device: tpu\n", "run.device: 'tpu' is not one of"),
        ("data:\n  tile: 3\n", "unknown key(s) ['tile']"),
        ("bogus: 1\n", "unknown key(s) ['bogus']"),
        ("data: [1, 2]\n", "data: expected a mapping"),
        ("data: {augment: 1}\n", "data.augment: expected true/false"),
        ("[1, 2]\n", "expected a mapping at the top level"),
        ("data: {csv: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_parameter(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_yaml(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_config_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")


def test_exponent_floats_without_a_dot_are_read_as_floats(tmp_path: Path) -> None:
    # YAML 1.1 loads 1e-3 (no dot) as a string; a learning rate is written that way more often than not
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  weight_decay: 5E-2\n")
    config = TrainConfig.from_yaml(path)
    assert config.optim.lr == 1e-3
    assert config.optim.weight_decay == 0.05


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: make_params("abmil_acc", {"chunk_size": 0}), "method.params.chunk_size: must be >= 1"),
        (lambda: make_params("patchgd", {"sampling": 1.5}), "method.params.sampling: must be <= 1.0"),
        (lambda: DataConfig(bag_size=-5), "data.bag_size: must be >= 0"),
        (lambda: OptimConfig(epochs=0), "optim.epochs: must be >= 1"),
    ],
)
def test_values_out_of_their_range_are_refused_naming_the_field(
    make: Callable[[], object], message: str
) -> None:
    # the same bounds the napari forms put on their spin boxes (field metadata "min" / "max")
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


@pytest.mark.parametrize(
    ("choice", "method", "bag_size", "device", "deterministic", "expected"),
    [
        ("auto", "abmil_acc", 32, "cuda", False, True),  # bags of a fixed size: shapes repeat
        ("auto", "abmil_acc", 0, "cuda", False, False),  # every slide's whole bag: a new shape per bag
        ("auto", "patchgd", 0, "cuda", False, True),  # images of data.image_size
        ("auto", "abmil_acc", 32, "cpu", False, False),
        ("auto", "abmil_acc", 32, "cuda", True, False),
        ("on", "abmil_acc", 0, "cuda", False, True),
        ("off", "patchgd", 32, "cuda", False, False),
    ],
)
def test_cudnn_benchmark_is_on_where_input_shapes_repeat_on_cuda(
    choice: str, method: str, bag_size: int, device: str, deterministic: bool, expected: bool
) -> None:
    import torch

    from bigslide.engine.setup import cudnn_benchmark
    from bigslide.methods.base import get_method

    config = TrainConfig.from_dict(
        {
            "method": {"name": method},
            "data": {"bag_size": bag_size},
            "run": {"cudnn_benchmark": choice, "deterministic": deterministic},
        }
    )
    assert cudnn_benchmark(config, get_method(method).kind, torch.device(device)) is expected


def test_cudnn_benchmark_on_with_deterministic_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"run.cudnn_benchmark: on .* run.deterministic"):
        TrainConfig.from_dict({"run": {"cudnn_benchmark": "on", "deterministic": True}})
