"""A user's script that reads tiles through decode workers started from a fork server (as the napari
plugin starts them), written without an `if __name__ == "__main__":` guard: it runs once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

SCRIPT = """
from bigslide.data.processes import DecodeProcesses, fork_from_server
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide

print("the script ran", flush=True)
fork_from_server()
with open_slide({path!r}) as slide:
    grid = TileGrid.from_slide(slide, 128, min_tissue=0.0)
pool = DecodeProcesses(2)
squares = pool.read(grid.slide_path, None, grid.plan, grid.coords[:5])
pool.close()
print("read", tuple(squares.shape), flush=True)
"""


def test_a_script_without_a_main_guard_runs_once(svs_slide: Any, tmp_path: Path) -> None:
    script = tmp_path / "train_my_slides.py"
    script.write_text(textwrap.dedent(SCRIPT.format(path=str(svs_slide.path))))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("the script ran") == 1, done.stdout
    assert "read (5, 3, 128, 128)" in done.stdout
