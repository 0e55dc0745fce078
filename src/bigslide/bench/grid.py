"""Tissue mask and tile grid of a 100,000 x 80,000 px slide, and a JPEG SVS's grid against decoding it.

On a 100,000 x 80,000 px sparse slide (mostly glass with a few tissue islands, written once, tile by
tile, and cached), the tissue mask and tile grid are timed against a level-0 tile scan. The scan reads a
random sample of tiles and is extrapolated to the whole grid: running it in full would take far longer
than the benchmark itself. The steps and the scan alternate, repeat by repeat, so load on a shared
machine hits all of them. On an H&E JPEG SVS, the tile grid is timed against decoding its level 0 once
(`bigslide.bench.grid_svs`). Targets: tissue mask + grid <= 2 s (median) on the sparse slide; the SVS's
grid (tissue, ink and focus measured) <= 10 % of decoding its level 0, on one core. Exits 1 when one is
missed (`--no-targets`: report only).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bigslide.bench import grid_svs
from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median
from bigslide.synthetic.pyramid import LazyLevel, write_pyramid
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.tissue import tile_tissue_fraction, tissue_mask
from bigslide.tiling.tissue_measure import measure_raster
from bigslide.wsi.slide import Slide, open_slide

TILE = 256
FACTOR = 4
TARGET_SECONDS = 2.0  # tissue_mask + TileGrid.from_slide, median
# (centre x, centre y, radius) as fractions of the slide width
ISLANDS = [
    (0.20, 0.25, 0.030),
    (0.55, 0.30, 0.045),
    (0.80, 0.60, 0.025),
    (0.35, 0.70, 0.040),
    (0.62, 0.78, 0.02),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=100_000, help="level-0 width in pixels")
    parser.add_argument("--height", type=int, default=80_000, help="level-0 height in pixels")
    parser.add_argument("--tile-size", type=int, default=256, help="grid tile size at level 0")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each step")
    parser.add_argument("--sample", type=int, default=300, help="level-0 tiles read to time the naive scan")
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slides"
    )
    parser.add_argument("--svs-width", type=int, default=20_480, help="H&E SVS level-0 width (0: skip it)")
    parser.add_argument("--svs-height", type=int, default=16_384, help="H&E SVS level-0 height")
    parser.add_argument(
        "--svs-tile-size", type=int, default=224, help="grid tile size on the SVS, at 0.5 µm/px"
    )
    add_target_argument(parser)


def run(args: argparse.Namespace) -> int:
    path = ensure_slide(Path(args.cache), args.width, args.height)
    print(machine_line())
    size = args.tile_size
    with open_slide(path) as slide:
        dims = " / ".join(f"{w}x{h}" for w, h in slide.level_dimensions)
        print(f"slide {path} ({path.stat().st_size / 1e6:.1f} MB), levels {dims}")
        grid_box: list[TileGrid] = []

        def make_grid() -> None:
            grid_box.append(TileGrid.from_slide(slide, size))

        steps: dict[str, Callable[[], object]] = {
            "tissue_mask": lambda: tissue_mask(slide),
            f"TileGrid.from_slide({size})": make_grid,
            f"TileGrid.from_slide({size}, filter='otsu')": lambda: TileGrid.from_slide(
                slide, size, filter="otsu"
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        levels: dict[str, str] = {}
        naive: list[float] = []
        n_all = 0
        for _ in range(max(1, args.repeats)):
            for name, step in steps.items():
                slide.pixels_read.clear()
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
                levels[name] = ", ".join(
                    f"{lvl} ({px / 1e6:.2f} Mpx)" for lvl, px in sorted(slide.pixels_read.items())
                )
            seconds, n_all = _naive_scan(slide, size, args.sample)
            naive.append(seconds)
    names = list(steps)
    total = [a + b for a, b in zip(times[names[0]], times[names[1]])]
    rows = [(name, times[name], levels[name]) for name in names]
    rows.append(("tissue_mask + TileGrid (total)", total, ""))
    rows.append((f"level-0 rule scan, {n_all} tiles (extrapolated)", naive, "0"))
    grid = grid_box[-1]
    level, block = measure_raster(slide, size)
    blocks = f" in blocks of {block} x {block}" if block > 1 else ""
    print(f"grid: {len(grid)} tissue tiles of {n_all}; tissue measured on level {level}{blocks}")
    print(f"{'step':<48} {'min s':>9} {'median s':>9} {'x faster (median)':>18}  levels read per run")
    reference = statistics.median(naive)
    for name, values, read in rows:
        low, mid = min_median(values)
        print(f"{name:<48} {low:>9.3f} {mid:>9.3f} {reference / mid:>18.1f}  {read}")
    targets = Targets.from_args(args)
    targets.check("tissue_mask + TileGrid seconds (median)", statistics.median(total), TARGET_SECONDS)
    if args.svs_width:
        svs = grid_svs.ensure_he_slide(Path(args.cache), args.svs_width, args.svs_height)
        grid_svs.compare(svs, args.svs_tile_size, args.repeats, targets)
    return targets.exit_code()


def _naive_scan(slide: Slide, size: int, sample: int) -> tuple[float, int]:
    """Seconds to read every level-0 tile and apply the rule, extrapolated from `sample` tiles."""
    w, h = slide.dimensions
    cols, rows = w // size, h // size
    n_all = cols * rows
    rng = np.random.default_rng(0)
    picks = rng.choice(n_all, size=min(sample, n_all), replace=False)
    start = time.perf_counter()
    for index in picks:
        y, x = divmod(int(index), cols)
        tile_tissue_fraction(slide.read_region((x * size, y * size), 0, (size, size)))
    return (time.perf_counter() - start) * n_all / len(picks), n_all


def ensure_slide(folder: Path, width: int, height: int) -> Path:
    """Write the sparse benchmark slide unless a complete copy is already cached."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sparse_{width}x{height}.svs"
    if path.exists():
        return path
    levels: list[LazyLevel] = []
    ds = 1
    while True:
        levels.append(LazyLevel(height // ds, width // ds, _tile_source(ds, width)))
        if max(width // ds, height // ds) < 2000:
            break
        ds *= FACTOR
    print(f"writing {path} ({len(levels)} levels, once) ...", flush=True)
    partial = path.with_suffix(".partial.svs")
    write_pyramid(partial, levels, mpp=0.25, tile=TILE, flavour="svs", compression="zlib")
    partial.rename(path)
    return path


def _tile_source(ds: int, width: int) -> Callable[[int, int], np.ndarray]:
    white = np.full((TILE, TILE, 3), 255, np.uint8)
    islands = [(cx * width, cy * width, r * width) for cx, cy, r in ISLANDS]

    def tile(ty: int, tx: int) -> np.ndarray:
        x0, y0 = tx * TILE * ds, ty * TILE * ds
        x1, y1 = x0 + TILE * ds, y0 + TILE * ds
        near = [
            (cx, cy, r)
            for cx, cy, r in islands
            if x0 < cx + r and cx - r < x1 and y0 < cy + r and cy - r < y1
        ]
        if not near:
            return white
        xs = (x0 + (np.arange(TILE) + 0.5) * ds)[None, :]
        ys = (y0 + (np.arange(TILE) + 0.5) * ds)[:, None]
        inside = np.zeros((TILE, TILE), bool)
        for cx, cy, r in near:
            inside |= (xs - cx) ** 2 + (ys - cy) ** 2 < r * r
        nuclei = ((xs // 24 + ys // 24) % 5 == 0) & inside
        out = white.copy()
        out[inside] = (222, 150, 190)
        out[nuclei] = (120, 60, 140)
        return out

    return tile
