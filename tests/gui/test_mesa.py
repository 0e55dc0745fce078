"""napari with Mesa's OpenGL (Xvfb, VMs, remote desktops) survives torch being imported after the
viewer has drawn, even when a script imported the plugin first: triton's LLVM beside Mesa's crashes."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_torch_imports_after_the_viewer_draws() -> None:
    script = textwrap.dedent(
        """
        import time
        import bigslide.napari._roles  # the plugin before any viewer, as a script may import it
        import napari
        from qtpy.QtWidgets import QApplication

        viewer = napari.Viewer(show=True)
        for _ in range(20):
            QApplication.processEvents()
            time.sleep(0.01)
        import bigslide.napari._train_widget  # imports torch, torchvision and torch._dynamo
        import torch

        print("trained on", torch.ones(2).sum().item())
        viewer.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained on 2.0" in done.stdout
