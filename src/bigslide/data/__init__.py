"""What a model reads: slide tables, bags of tiles and whole images at a resolution, the decode worker
processes that tile and read slides off the main process, the tile cache, stain fits and augmentation."""
