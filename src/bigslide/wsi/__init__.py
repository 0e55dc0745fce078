"""Reading whole-slide images at a physical resolution: `open_slide` opens a file (TIFF/SVS/OME-TIFF
through tiffslide, a DICOM series, OpenSlide's formats when it is installed) as a `Slide` that reads any
region at any µm per pixel (`slide`, `slide_view`, `tiff_levels`, `dicom_series`, `openslide_backend`,
`resolution`).

Imports only `bigslide.errors`, `bigslide.files`, `bigslide.coerce` and libraries: everything else in
bigslide builds on it.
"""
