"""The tissue check a person can see: per slide, a thumbnail with the kept tiles outlined and the tiles
left out for ink (magenta) or blur (yellow) shaded, and a CSV line with what was kept.

`bigslide train` writes them for every slide of a run (`<out>/tissue_check/`), `bigslide predict` for
every slide it predicts. A slide where no tile is kept is named in a warning (the tissue was missed), and so
is one where nearly every tile is kept and most of what was kept is flat, without the texture cells give
(glass, ink or a dark scan passed for tissue); a slide cut to its tissue, a TMA core or a region crop is
legitimately full of textured tissue and is not named. So is a slide whose tissue mostly measures out of
focus (its median sharpness below `data.min_sharpness`): tiles are flagged only where far softer than the
rest of their slide (`bigslide.tiling.blur.out_of_focus`), so most of such a slide is not, and it may want
scanning again.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

from bigslide.data.tile_cache import TileCache, code_digest, grid_digest
from bigslide.files import atomic_path, atomic_write_text, link_or_copy
from bigslide.tiling.grid import BLUR, INK, TileGrid
from bigslide.wsi.names import slide_stem
from bigslide.wsi.resolution import coarser_scan
from bigslide.wsi.slide import Slide

FOLDER = "tissue_check"
CSV_NAME = "tissue_check.csv"
COLUMNS = (
    "slide",
    "tiles_kept",
    "tiles",
    "tissue_fraction",
    "ink_fraction",
    "blurred_fraction",
    "ink_tiles",
    "blurred_tiles",
    "blurred_left_out",
)
KEPT_COLOUR = (0, 200, 70)
INK_COLOUR = (230, 0, 200)
BLUR_COLOUR = (255, 210, 0)
THUMBNAIL_SIZE = 512
"""Longer side of a slide's thumbnail, px: enough to see the tissue, the ink and the kept tiles; a cohort's
first run draws one per slide (at 768 px they took 75 ms each, at 512 px 37 ms)."""
THUMBNAIL_MODULES = (__name__,)
"""The code that draws a thumbnail: a change to it draws the cached ones anew."""
MOSTLY_KEPT = 0.95
FLAT_KEPT = 0.5
"""A slide with at least MOSTLY_KEPT of its tiles kept, and less than FLAT_KEPT of the kept tissue textured
(`TissueCheck.textured_fraction`), is named in a warning (glass or ink taken for tissue?)."""


def check_row(slide: str | Path, grid: TileGrid) -> dict[str, Any]:
    """The slide's line of `tissue_check.csv`."""
    c = grid.check
    return {
        "slide": str(slide),
        "tiles_kept": c.kept,
        "tiles": c.tiles,
        "tissue_fraction": round(c.tissue_fraction, 4),
        "ink_fraction": round(c.ink_fraction, 4),
        "blurred_fraction": round(c.blurred_fraction, 4),
        "ink_tiles": c.ink,
        "blurred_tiles": c.blurred,
        "blurred_left_out": c.blur_excluded,
    }


def warnings_for(slide: str | Path, grid: TileGrid) -> list[str]:
    """The slide's one-line warnings: its resolution's, then its tissue check's."""
    return [text for text in (resolution_warning(slide, grid), warning(slide, grid)) if text is not None]


def resolution_warning(slide: str | Path, grid: TileGrid) -> str | None:
    """A warning when the slide was scanned coarser than the model reads (`coarser_scan`)."""
    text = coarser_scan(grid.slide_mpp[0] if grid.slide_mpp else None, grid.target_mpp)
    return f"{slide}: {text}" if text else None


def warning(slide: str | Path, grid: TileGrid) -> str | None:
    """A one-line warning when the slide is greyscale (no ink rule), no tile of it is kept, or nearly every
    tile is and what was kept is mostly flat (no cell texture), or most of its tissue is out of focus."""
    c = grid.check
    if c.greyscale:
        return (
            f"{slide}: a greyscale slide: without colour, pen ink and marker cannot be told from tissue, "
            f"and none was left out ({c.kept} of {c.tiles} tiles kept by the greyscale rule). Look at its "
            "thumbnail"
        )
    if c.tiles and c.kept == 0:
        return f"{slide}: tissue check kept no tile of {c.tiles} (no tissue found: look at its thumbnail)"
    if c.tiles >= 20 and c.kept >= MOSTLY_KEPT * c.tiles and c.textured_fraction < FLAT_KEPT:
        return (
            f"{slide}: tissue check kept {c.kept} of {c.tiles} tiles ({100 * c.kept_fraction:.0f} %), "
            f"and only {100 * c.textured_fraction:.0f} % of what it kept shows cell texture: is glass, ink "
            "or a dark background taken for tissue? Look at its thumbnail"
        )
    reference, least = c.focus_reference, grid.tissue_settings.min_sharpness
    if reference is not None and reference < least and c.tissue_tiles >= 20:
        return (
            f"{slide}: most of its tissue measures out of focus (median sharpness {reference:.3f}, below "
            f"data.min_sharpness {least:g}); only the {c.blurred} tiles far softer than the rest are "
            "flagged. Scan it again? Look at its thumbnail"
        )
    return None


def check_image(slide: Slide, grid: TileGrid, *, max_size: int = THUMBNAIL_SIZE) -> np.ndarray:
    """RGB thumbnail: kept tiles outlined in green, tiles left out for ink shaded magenta, out-of-focus
    tiles (left out, or only flagged) shaded yellow, and a one-line legend below."""
    thumb = slide.thumbnail(max_size)[..., :3].astype(np.float32)
    h, w = thumb.shape[:2]
    scale = (w / slide.dimensions[0] + h / slide.dimensions[1]) / 2
    kept = _paint(grid.coords, grid.tile_size_level0, scale, (h, w))
    flagged = grid.out_of_focus
    blurred = _paint(grid.coords[flagged], grid.tile_size_level0, scale, (h, w))
    for reason, colour in ((INK, INK_COLOUR), (BLUR, BLUR_COLOUR)):
        rows = grid.rejected[grid.rejected_reason == reason]
        area = _paint(rows, grid.tile_size_level0, scale, (h, w))
        thumb[area] = 0.45 * thumb[area] + 0.55 * np.array(colour, np.float32)
    thumb[blurred] = 0.6 * thumb[blurred] + 0.4 * np.array(BLUR_COLOUR, np.float32)
    edge = kept & ~ndimage.binary_erosion(kept, iterations=max(1, round(max(h, w) / 400)))
    thumb[edge] = KEPT_COLOUR
    return _legend(np.rint(thumb).astype(np.uint8), grid)


def _paint(coords: np.ndarray, size0: int, scale: float, shape: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(shape, bool)
    for x, y in np.asarray(coords).reshape(-1, 2):
        x0, y0 = int(np.floor(x * scale)), int(np.floor(y * scale))
        x1, y1 = int(np.ceil((x + size0) * scale)), int(np.ceil((y + size0) * scale))
        mask[max(0, y0) : max(0, y1), max(0, x0) : max(0, x1)] = True
    return mask


def _legend(image: np.ndarray, grid: TileGrid) -> np.ndarray:
    c = grid.check
    strip = Image.new("RGB", (image.shape[1], 30), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    x = 6
    for colour, text in (
        (KEPT_COLOUR, f"kept {c.kept}/{c.tiles}"),
        (INK_COLOUR, f"ink {c.ink}"),
        (BLUR_COLOUR, f"out of focus {c.blurred}" + (" (left out)" if c.blur_excluded else "")),
    ):
        draw.rectangle([x, 8, x + 14, 22], fill=colour)
        draw.text((x + 19, 9), text, fill=(0, 0, 0))
        x += 24 + int(draw.textlength(text)) + 14
    return np.concatenate([image, np.asarray(strip)], axis=0)


def save_check_png(slide: Slide, grid: TileGrid, path: Path) -> None:
    """The thumbnail as a PNG at `path` (light compression: zlib's default level took twice as long for the
    same size)."""
    Image.fromarray(check_image(slide, grid)).save(path, format="PNG", compress_level=1)


def write_check_png(
    opened: Callable[[], AbstractContextManager[Slide]],
    slide: str | Path,
    grid: TileGrid,
    folder: Path,
    tiles: TileCache | None = None,
    name: str | None = None,
) -> Path:
    """`<folder>/<name>.png` (by default the slide's stem), the thumbnail of `slide` (opened by `opened()`
    when it is drawn),
    written under a temporary name and renamed. With a tile cache `tiles` it is drawn once into the cache
    and linked from there (a second run, or a second prediction, over the same slides draws none)."""

    def draw(target: Path) -> None:
        with opened() as open_slide:
            save_check_png(open_slide, grid, target)

    path = Path(folder) / f"{name or slide_stem(slide)}.png"
    key = {"grid": grid_digest(grid), "code": code_digest(THUMBNAIL_MODULES)}
    kept = tiles.file("check", ".png", Path(slide), key, draw) if tiles is not None else None
    if kept is not None:
        return link_or_copy(kept, path)
    with atomic_path(path) as tmp:
        draw(tmp)
    return path


def write_check_csv(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, text.getvalue())
