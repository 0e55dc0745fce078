"""What the stain maps cost per bag: 64 tiles of 224 px (a lab-B synthetic slide), uint8 to float on the
CPU, median of 7, with the one-off fit of a slide's stain on 32 tiles.

    PYTHONPATH=src python docs/measure_stain.py
"""

import time

import numpy as np
import torch

from bigslide.data.colour import SampleStain, row_colour
from bigslide.data.sample import Sample, as_float
from bigslide.data.stain import draw_stain_jitter
from bigslide.data.stain_norm import BUNDLED_REFERENCES, fit_stain
from bigslide.synthetic.slides import synthesize_slide

rgb = synthesize_slide((1024, 1024), lesions=1, seed=3, lab="B").rgb
tiles = np.stack([rgb[r : r + 224, c : c + 224] for r in range(0, 800, 112) for c in range(0, 800, 112)][:64])
x = torch.from_numpy(tiles).permute(0, 3, 1, 2).contiguous()
print("threads", torch.get_num_threads(), "bag", tuple(x.shape))
t = time.perf_counter()
fits = {m: fit_stain(m, tiles[:32]) for m in ("macenko", "reinhard")}
print(f"fit one slide's stain on 32 tiles (both methods): {time.perf_counter() - t:.3f} s")
jitter = draw_stain_jitter(np.random.default_rng(0))
cases = {
    "none (uint8 -> float only)": (None, None),
    "stain_augment": (None, jitter),
    "macenko": ("macenko", None),
    "reinhard": ("reinhard", None),
    "macenko + stain_augment": ("macenko", jitter),
    "reinhard + stain_augment": ("reinhard", jitter),
}
for name, (norm, jit) in cases.items():
    s = Sample(x=x, y=0, slide="s", coords=np.zeros((64, 2)), stain=SampleStain(fits.get(norm), jit))
    best = []
    for _ in range(7):
        t = time.perf_counter()
        colour = row_colour([s], BUNDLED_REFERENCES[norm] if norm else None)
        as_float(x, colour)
        best.append(time.perf_counter() - t)
    print(f"{name}: median {np.median(best) * 1000:.0f} ms per bag")
