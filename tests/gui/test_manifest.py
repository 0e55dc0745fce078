"""The plugin manifest is valid and every contribution it names imports (`npe2 validate --imports`)."""

from __future__ import annotations

from npe2 import PluginManifest


def test_manifest_validates_with_imports() -> None:
    # what `npe2 validate --imports bigslide` does, in-process (a subprocess re-imports torch: ~30 s)
    manifest = PluginManifest._from_package_or_name("bigslide")
    manifest.validate_imports()
    assert manifest.name == "bigslide"
    contributions = manifest.contributions
    widgets = {w.display_name for w in contributions.widgets or []}
    assert widgets == {"All panels (tabbed)", "Slides", "Sampling regions", "Train", "Results"}
    assert {s.key for s in contributions.sample_data or []} == {"slide", "training_set"}
    [reader] = contributions.readers or []
    assert {"*.svs", "*.ndpi", "*.ome.tif", "*.tiff"} <= set(reader.filename_patterns)
