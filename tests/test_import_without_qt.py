import subprocess
import sys

BLOCK_GUI = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        gui = {'napari', 'qtpy', 'magicgui', 'PyQt5', 'PyQt6', 'PySide2', 'PySide6', 'superqt'}
        if name.split('.')[0] in gui:
            raise ImportError(f'{name} is blocked in this test')
        return None
sys.meta_path.insert(0, Block())
import bigslide, bigslide.engine, bigslide.methods, bigslide.cli.main
from bigslide.methods import available_methods
assert available_methods(), 'no method registered'
bigslide.cli.main.build_parser()
print('ok', len(available_methods()))
"""


def test_core_imports_and_cli_work_with_gui_libraries_unimportable() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCK_GUI], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
