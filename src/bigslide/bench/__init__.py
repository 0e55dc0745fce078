"""Benchmarks run by `bigslide bench <name>`: side-by-side timings and memory."""
