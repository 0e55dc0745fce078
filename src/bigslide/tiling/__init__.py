"""Where tiles come from: which pixels of a slide are tissue, pen ink or glass (`pixel_classes`,
`tissue`, `ink`, `tissue_measure`), how sharp each tile is (`blur`), the areas to sample from or leave
out (`regions`), the teaching annotations a pathologist draws (`annotations`), and the grid of tiles that
holds all of it (`grid`).

Imports `bigslide.wsi` (to read slides), `bigslide.errors`, `bigslide.files`, `bigslide.coerce`,
`bigslide.hue` and libraries; never the data, engine, methods or GUI layers built on it.
"""
