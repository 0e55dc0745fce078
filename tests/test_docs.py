"""The documentation: its reference tables match the code, and the site builds with no warning."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def gen_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_matches_the_code(
    gen_reference: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = gen_reference.main(["--check"])
    err = capsys.readouterr().err
    assert code == 0, f"docs reference is stale; run `python docs/gen_reference.py`:\n{err}"


def test_a_stale_params_table_is_rewritten(gen_reference: ModuleType) -> None:
    stale = (
        "<!-- reference:params patchgd -->\n| `method.params.k` | int | `99` | old |\n<!-- end reference -->"
    )
    fresh = gen_reference.refresh(stale, "page.md")
    assert "`99`" not in fresh
    assert "| `method.params.k` | int | `0` |" in fresh
    assert fresh.startswith("<!-- reference:params patchgd -->\n")
    assert fresh.endswith("<!-- end reference -->")


def test_every_method_section_and_command_needs_a_block(gen_reference: ModuleType) -> None:
    from bigslide.methods import available_methods

    missing = gen_reference.missing_blocks([])
    assert len([m for m in missing if "reference:params" in m]) == len(available_methods())
    assert {"<!-- reference:config optim -->", "<!-- reference:cli bench grid -->"} <= set(missing)
    pages = [p.read_text(encoding="utf-8") for p in gen_reference.markdown_files()]
    assert gen_reference.missing_blocks(pages) == []


def test_site_builds_strictly(tmp_path: Path) -> None:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.perf_counter() - start < 60
    api = (tmp_path / "site" / "api.html").read_text(encoding="utf-8")
    for anchor in (
        "bigslide.open_slide",
        "bigslide.TileGrid.from_slide",
        "bigslide.engine.train",
        "bigslide.engine.TrainConfig.from_yaml",
        "bigslide.methods.base.Method.train_step",
        "bigslide.methods.abmil_acc.bag_backward",
        "bigslide.methods.zblock.fill_z",
        "bigslide.nn.big.make_big",
        "bigslide.explain.heatmap.ScoreGrid.layer_transform",
    ):
        assert f'id="{anchor}"' in api, f"{anchor} missing from the API reference"
    for page in ("quickstart", "user-guide", "config", "cli", "benchmarks", "methods/patchgd"):
        assert (tmp_path / "site" / f"{page}.html").is_file()


def test_the_architecture_page_lists_the_modules_as_they_are() -> None:
    """docs/architecture.md's rooms are generated from the source: run `python docs/gen_layout.py` after
    adding, moving or growing a module."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_layout.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, "docs/architecture.md is stale: run python docs/gen_layout.py"
