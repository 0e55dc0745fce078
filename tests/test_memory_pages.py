"""Tensors of a bag's size are mapped in 2 MiB pages: `import bigslide` turns on PyTorch's transparent huge
pages (`THP_MEM_ALLOC_ENABLE`) before torch is imported, unless the user chose otherwise."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

HUGE_KB = """
import re, bigslide, torch
pixels = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, every page written
rollup = open('/proc/self/smaps_rollup').read()
print(re.search(r'AnonHugePages:\\s+(\\d+) kB', rollup).group(1))
"""


def _huge_kb(env: dict[str, str]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", HUGE_KB], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def _thp_mode() -> str | None:
    if not THP.is_file():
        return None
    chosen = re.search(r"\[(\w+)\]", THP.read_text())
    return chosen.group(1) if chosen else None


@pytest.mark.skipif(
    _thp_mode() not in ("madvise", "always"), reason="the kernel offers no transparent huge pages"
)
def test_a_bag_sized_tensor_is_mapped_in_huge_pages_once_bigslide_is_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert _huge_kb(env) >= 32 << 10  # at least half of the 64 MiB
    if _thp_mode() == "madvise":  # only asked-for pages are huge: the user's choice of none is kept
        assert _huge_kb({**env, "THP_MEM_ALLOC_ENABLE": "0"}) == 0
