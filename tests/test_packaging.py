"""The wheel carries the napari manifest inside the package, and napari's validator accepts it when
bigslide is imported from the installed wheel rather than from the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(ROOT),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (path,) = out.glob("bigslide-*.whl")
    return path


def test_wheel_holds_the_manifest_and_its_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "bigslide/napari.yaml" in names
    assert "[napari.manifest]\nbigslide = bigslide:napari.yaml" in entry_points
    assert "bigslide = bigslide.cli.main:main" in entry_points
    assert (ROOT / "napari.yaml").is_symlink()
    assert (ROOT / "napari.yaml").resolve() == ROOT / "src" / "bigslide" / "napari.yaml"


def test_npe2_validates_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path)  # what `pip install --no-deps` lays out in site-packages
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    where = subprocess.run(
        [sys.executable, "-c", "import bigslide; print(bigslide.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip().startswith(str(tmp_path))
    npe2 = Path(sys.executable).parent / "npe2"
    done = subprocess.run(
        [str(npe2), "validate", "--imports", "bigslide"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid" in (done.stdout + done.stderr).lower()
