"""Aperio JPEG 2000 slides, both flavours scanners write: 33005 (RGB, the colour transform inside the
codestream, as Kakadu writes it) and 33003 (Y, Cb, Cr with no transform in the codestream, as Matrox
writes it: chroma at half width, or at full resolution, which OpenJPEG leaves unconverted). Read by
tiffslide's path, they must give the colours OpenSlide gives.

The 33003 tiles are encoded by OpenJPEG's `opj_compress` (Debian `libopenjp2-tools`, which `make test`
installs): no Python encoder writes subsampled components.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tifffile

from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide

TILE = 256
SIZE = (768, 1024)  # rows, columns at level 0 (what `synthesize_slide` takes as width, height)


@pytest.fixture(scope="module")
def tissue() -> np.ndarray:
    rgb = synthesize_slide(SIZE[::-1], lesions=1, seed=7).rgb
    assert rgb.shape[:2] == SIZE
    return rgb


SUBSAMPLING = {"4:2:2": (2, 1), "4:4:4": (1, 1)}
"""Chroma's subsampling (across, down) per flavour."""


def _ycbcr_codestream(rgb: np.ndarray, folder: Path, sampling: str) -> bytes:
    """One tile as Aperio 33003 stores it: JPEG 2000 of Y, Cb, Cr (ITU-R 601, full range), Cb and Cr
    averaged over `sampling`'s blocks, no multiple-component transform."""
    r, g, b = (rgb[..., c].astype(np.float64) for c in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    h, w = y.shape
    dx, dy = SUBSAMPLING[sampling]
    planes = [y, *(p.reshape(h // dy, dy, w // dx, dx).mean((1, 3)) for p in (cb, cr))]
    raw, out = folder / "tile.raw", folder / "tile.j2k"
    np.concatenate([np.clip(np.rint(p), 0, 255).astype(np.uint8).ravel() for p in planes]).tofile(raw)
    opj = shutil.which("opj_compress")
    assert opj, "opj_compress is missing: `make test` installs it (Debian libopenjp2-tools)"
    subprocess.run(
        [opj, "-i", str(raw), "-o", str(out), "-F", f"{w},{h},3,8,u@1x1:{dx}x{dy}:{dx}x{dy}", "-r", "12"],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


def _write_33003(path: Path, levels: list[np.ndarray], folder: Path, sampling: str) -> Path:
    h0, w0 = levels[0].shape[:2]
    with tifffile.TiffWriter(path) as tif:
        for i, level in enumerate(levels):
            h, w = level.shape[:2]
            tiles = []
            for y in range(0, h, TILE):
                for x in range(0, w, TILE):
                    tile = np.full((TILE, TILE, 3), 255, np.uint8)
                    part = level[y : y + TILE, x : x + TILE]
                    tile[: part.shape[0], : part.shape[1]] = part
                    tiles.append(_ycbcr_codestream(tile, folder, sampling))
            desc = (
                f"Aperio Image Library v11.2.1\r\n{w0}x{h0} [0,0 {w0}x{h0}] ({TILE}x{TILE}) J2K/YUV16 Q=70"
                f"|AppMag = 20|MPP = 0.4990"
                if i == 0
                else f"{w0}x{h0} -> {w}x{h}"
            )
            tif.write(
                iter(tiles),
                shape=(h, w, 3),
                dtype=np.uint8,
                tile=(TILE, TILE),
                photometric="rgb",
                compression=33003,
                description=desc,
                metadata=None,
            )
            if i == 0:  # Aperio's second page: a thumbnail in strips
                thumb = np.ascontiguousarray(levels[-1][::2, ::2])
                tif.write(thumb, photometric="rgb", metadata=None, description=f"{w0}x{h0} -> thumbnail")
    return path


@pytest.fixture(scope="module")
def jpeg2000_slides(tmp_path_factory: pytest.TempPathFactory, tissue: np.ndarray) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("j2k")
    levels = downsample_pyramid(tissue, 2, 2)
    return {
        "33005 RGB": write_pyramid(folder / "rgb.svs", levels, mpp=0.499, tile=TILE, compression="jpeg2000"),
        **{
            f"33003 YCbCr {sampling}": _write_33003(
                folder / f"ycbcr{sampling.replace(':', '')}.svs", levels, folder, sampling
            )
            for sampling in SUBSAMPLING
        },
    }


@pytest.mark.parametrize("flavour", ["33005 RGB", *(f"33003 YCbCr {s}" for s in SUBSAMPLING)])
def test_aperio_jpeg2000_reads_in_the_colours_openslide_gives(
    jpeg2000_slides: dict[str, Path], tissue: np.ndarray, flavour: str
) -> None:
    import openslide

    path = jpeg2000_slides[flavour]
    with tifffile.TiffFile(path) as tif:
        assert tif.pages[0].compression in (33003, 33005)
    with open_slide(path) as slide:
        assert slide.dimensions == (SIZE[1], SIZE[0])
        assert slide.mpp == pytest.approx((0.499, 0.499))
        assert len(slide.level_dimensions) == 2
        ours = slide.read_region((0, 0), 0, (SIZE[1], SIZE[0]))
        # the loader's path, a file tile decoded from the file's bytes, gives the same pixels
        assert np.array_equal(slide.read_file_tile(0, 1, 2), ours[TILE : 2 * TILE, 2 * TILE : 3 * TILE])
        grid = TileGrid.from_slide(slide, 128, target_mpp=0.5)
    reference = np.asarray(openslide.OpenSlide(str(path)).read_region((0, 0), 0, (SIZE[1], SIZE[0])))[..., :3]
    # the same codestream decoded by two builds of OpenJPEG; YCbCr converted by each reader's own rounding
    assert np.abs(ours.astype(int) - reference).max() <= 2
    assert np.abs(ours.astype(float) - tissue).mean() < 4  # and close to what was scanned (lossy)
    assert len(grid) > 0
    assert grid.check.tissue_fraction > 0.2
