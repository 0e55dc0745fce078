"""Write the package's rooms into docs/architecture.md (between its layout markers): every package of
`src/bigslide` with the first sentence of its docstring, and every module with its line count.

    python docs/gen_layout.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bigslide"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- layout: begin -->", "<!-- layout: end -->"


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    return text.split(". ")[0].rstrip(".") if text else ""


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def layout() -> str:
    """The Markdown block: one heading line per package, its modules' line counts below it."""
    out = ["```text"]
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    width = 44
    for package in packages:
        name = package.relative_to(PACKAGE.parent).as_posix() + "/"
        out.append(f"{name:<{width}} {first_sentence(package / '__init__.py')}")
        for module in sorted(package.glob("*.py")):
            if module.name != "__init__.py":
                out.append(f"  {module.name:<{width - 2}} {lines(module):4d} lines")
        init = lines(package / "__init__.py")
        if init > 20:  # a package whose __init__ holds code (bench/learning/)
            out.append(f"  {'__init__.py':<{width - 2}} {init:4d} lines")
    modules = [m for p in packages for m in p.glob("*.py")]
    largest = max(modules, key=lines)
    out += [
        "```",
        "",
        f"Largest module: `{largest.relative_to(PACKAGE.parent).as_posix()}`, {lines(largest)} lines.",
    ]
    return "\n".join(out)


def main() -> int:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{layout()}\n{END}{tail}"
    if "--check" in sys.argv:
        return 0 if new == text else 1
    PAGE.write_text(new)
    print(f"wrote the layout into {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
