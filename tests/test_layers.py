"""The package's import graph: each layer imports only the layers below it, no cycles between packages,
Qt only in bigslide.napari (the contracts in .importlinter, checked with import-linter)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(config: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """lint-imports on `config`, run in `cwd` (where the root package is importable)."""
    return subprocess.run(
        [str(LINT), "--no-cache", str(config)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_import_contract_is_kept() -> None:
    result = lint(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # the same layers upside down must break: the engine imports the methods, the methods the data
    upside_down = tmp_path / ".importlinter"
    upside_down.write_text(
        "[importlinter]\nroot_package = bigslide\n\n[importlinter:contract:reversed]\n"
        "name = reversed\ntype = layers\nlayers =\n"
        "    bigslide.data\n    bigslide.methods\n    bigslide.engine\n"
    )
    result = lint(upside_down)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "bigslide.engine" in result.stdout


def test_the_checker_sees_a_cycle(tmp_path: Path) -> None:
    # two sibling modules importing each other (one only for type checking) break the acyclic contract
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic import a\n"
    )
    config = tmp_path / ".importlinter"
    acyclic = (ROOT / ".importlinter").read_text().split("[importlinter:contract:acyclic]")[1]
    config.write_text(
        "[importlinter]\nroot_package = cyclic\n\n[importlinter:contract:acyclic]"
        + acyclic.replace("bigslide", "cyclic")
    )
    result = lint(config, cwd=tmp_path)
    assert result.returncode != 0
    assert "No cycles are allowed in cyclic" in result.stdout


def _trace_module() -> Any:
    spec = importlib.util.spec_from_file_location("trace_predict", ROOT / "docs" / "trace_predict.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# what a higher floor hands down on `bigslide predict`'s path: configuration types built by `coerce`, the
# loader calling a dataset's own `load`, and the tissue check's drawing run by the decode workers
CALLS_UP = {
    ("bigslide.coerce", "bigslide.engine.config"),
    ("bigslide.coerce", "bigslide.methods.abmil_acc"),
    ("bigslide.coerce", "bigslide.data.config"),
    ("bigslide.data.loader", "bigslide.engine.cohort"),
    ("bigslide.data.slides", "bigslide.engine.tissue_report"),
    ("bigslide.data.tile_cache", "bigslide.explain.tissue_check"),
}


def test_prediction_reads_the_checkpoint_first_and_calls_up_only_to_hand_work_down(tmp_path: Path) -> None:
    from bigslide.synthetic.slide_set import make_slide_set
    from tests.test_predict_cohort import make_checkpoint

    trace = _trace_module()
    cohort = make_slide_set(tmp_path / "slides", n_slides=2, size=(512, 512), seed=8)
    checkpoint = make_checkpoint(tmp_path, "abmil_acc")
    argv = ["predict", "--slides", str(cohort), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "o")]
    stops, calls = trace.follow([*argv, "--workers", "0", "--quiet", "--no-heatmaps"])
    assert (tmp_path / "o" / "predictions.csv").is_file()
    rooms_before = list(dict.fromkeys(stops[: stops.index("bigslide.engine.checkpoint")]))
    # the command line read (a run's folder standing for its checkpoint), then the checkpoint
    rooms = [
        "bigslide.cli.main",
        "bigslide.cli.train",  # the flags predict shares with train (--slide-mpp)
        "bigslide.plan.arguments",
        "bigslide.engine.run_folder",
        "bigslide.cli.predict",
    ]
    assert rooms_before == rooms
    up = {(by[0], to[0]) for by, to in calls if trace.floor(to[0]) < trace.floor(by[0])}
    assert up <= CALLS_UP, sorted(up - CALLS_UP)
    assert any(trace.floor(to[0]) < trace.floor(by[0]) for by, to in calls)  # the trace sees a call up
