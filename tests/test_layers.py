"""The package's import graph: each layer imports only the layers below it, no cycles between packages,
Qt only in bigslide.napari (the contracts in .importlinter, checked with import-linter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(config: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """lint-imports on `config`, run in `cwd` (where the root package is importable)."""
    return subprocess.run(
        [str(LINT), "--no-cache", str(config)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_import_contract_is_kept() -> None:
    result = lint(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # the same layers upside down must break: the engine imports the methods, the methods the data
    upside_down = tmp_path / ".importlinter"
    upside_down.write_text(
        "[importlinter]\nroot_package = bigslide\n\n[importlinter:contract:reversed]\n"
        "name = reversed\ntype = layers\nlayers =\n"
        "    bigslide.data\n    bigslide.methods\n    bigslide.engine\n"
    )
    result = lint(upside_down)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "bigslide.engine" in result.stdout


def test_the_checker_sees_a_cycle(tmp_path: Path) -> None:
    # two sibling modules importing each other (one only for type checking) break the acyclic contract
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic import a\n"
    )
    config = tmp_path / ".importlinter"
    acyclic = (ROOT / ".importlinter").read_text().split("[importlinter:contract:acyclic]")[1]
    config.write_text(
        "[importlinter]\nroot_package = cyclic\n\n[importlinter:contract:acyclic]"
        + acyclic.replace("bigslide", "cyclic")
    )
    result = lint(config, cwd=tmp_path)
    assert result.returncode != 0
    assert "No cycles are allowed in cyclic" in result.stdout
