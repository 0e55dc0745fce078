"""A screenshot of a damaged slide (run under `xvfb-run -a -s "-screen 0 1600x1000x24"`):

- `damaged_slide.png`: the napari window, 1600 x 1000, with a slide three of whose JPEG tiles per level
  will not decode (their data overwritten): those tiles drawn as grey stripes, the warning naming the
  slide, the Slides table's row and status line marking it damaged.

    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_damaged_screenshot.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from make_screenshots import process, save, wait_until


def damaged_slide(work: Path) -> Path:
    """A synthetic H&E slide as a JPEG SVS, three tiles of each level with their JPEG data overwritten."""
    import tifffile

    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.synthetic.slides import synthesize_slide

    image = synthesize_slide((2048, 1536), lesions=1, seed=3).rgb
    path = write_pyramid(
        work / "damaged.svs", downsample_pyramid(image, 3), mpp=0.5, tile=128, compression="jpeg"
    )
    with tifffile.TiffFile(path) as tif:
        spots = [
            (page.dataoffsets[k], page.databytecounts[k])
            for page in tif.pages
            if page.is_tiled  # type: ignore[union-attr]
            for k in (5, 6, 13)
            if k < len(page.dataoffsets)  # type: ignore[union-attr]
        ]
    with path.open("r+b") as f:
        for offset, count in spots:
            f.seek(offset + 2)
            f.write(bytes([0xFF, 0xC4, 0x00, 0x01]) * ((count - 4) // 4))
    return path


def main() -> None:
    import napari

    work = Path(tempfile.mkdtemp(prefix="bigslide-damaged-shot-"))
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1600, 1000)
    _dock, slides = viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    wait_until(lambda: slides.ready)  # its content is built once the warm-up has loaded PyTorch
    viewer.open(damaged_slide(work), plugin="bigslide")
    wait_until(lambda: "damaged" in slides.status.text())
    viewer.reset_view()
    process(500)
    save(viewer.screenshot(canvas_only=False), "damaged_slide.png")
    viewer.close()


if __name__ == "__main__":
    main()
