"""`bigslide plan`: which method and settings fit a GPU (calibrations live beside the methods)."""
