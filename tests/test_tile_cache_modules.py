"""The tile cache makes a slide's grid anew when the code that decides it changes: every module of
`bigslide.tiling` and `bigslide.wsi` that the grid's code imports, directly or not, is one it watches."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from bigslide.data.tile_cache import TILING_MODULES

WATCHED_PACKAGES = ("bigslide.tiling.", "bigslide.wsi.")


def _imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith(WATCHED_PACKAGES)}


def test_every_module_the_grid_is_made_by_is_watched() -> None:
    seen, todo = set(), ["bigslide.tiling.grid"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imports(module))
    assert seen - set(TILING_MODULES) == set()
