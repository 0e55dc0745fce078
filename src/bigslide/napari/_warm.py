"""Load PyTorch, timm and the engine off the GUI thread, and build the panels once they are in.

Importing them takes seconds, and a module's code runs with the interpreter lock held: imported on the
GUI thread, the viewer froze for 4-6 s when the panels opened. Imported on a thread, Python hands the
lock to the GUI thread every few milliseconds, except while the dynamic loader maps torch's libraries
(0.2-0.4 s in one call that keeps the lock). So those libraries are mapped first through `dlopen` called
by ctypes, which lets the lock go for the duration of a foreign call; importing torch then finds them
loaded. Two more calls keep the lock long: a full garbage collection (paused while the imports run) and
torch's C extension setting itself up (begun once the docked panel is drawn, START_DELAY_MS later). Panels
register with `when_ready`: each is built on the GUI thread, one per event-loop turn.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from qtpy.QtCore import QObject, Qt, QTimer, Signal

from bigslide.napari._gc import settle_imports

HEAVY_MODULES = (
    "torch",
    "timm",
    "bigslide.methods",
    "bigslide.engine.loop",
    "bigslide.engine.inference",
    "bigslide.data.processes",
    "bigslide.explain.heatmap",
    "bigslide.tiling.regions",
    "bigslide.tiling.grid",
    "sklearn.model_selection",
    "sklearn.metrics",
    "sklearn.decomposition",
)
"""What the panels use as they are built and as they run (a module imported on the GUI thread while the
warm-up thread imports it would wait for it there). The engine imports sklearn only where it splits a
table, scores or projects Z-blocks, so that a prediction starts without it: the panels check a run's
split on the GUI thread."""
VIEWER_MODULES = ("tiffslide", "imagecodecs", "scipy.ndimage")
"""What opening the first slide needs besides (the TIFF reader, its decoders, napari's thumbnails)."""
TORCH_LIBRARIES = ("libtorch_global_deps.so", "libtorch_python.so")
START_DELAY_MS = 300
"""The imports start this long after the first panel asks for them, once the viewer has drawn the panel:
torch's C extension sets itself up with the lock held (about 215 ms on two cores), and begun at once it
fell in the frame that docks the panel (290-350 ms together)."""


class _Signals(QObject):
    """Lives on the GUI thread: the warm-up thread's `ready` reaches `drain` there, queued."""

    ready = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.ready.connect(self.drain, Qt.ConnectionType.QueuedConnection)

    def drain(self) -> None:
        _drain()


_signals: _Signals | None = None
_thread: threading.Thread | None = None
_scheduled = False
_error: str | None = None
_waiting: list[Callable[[], None]] = []
_draining = False


def imports_ready() -> bool:
    """Whether the warm-up is over (then panels are built at once): every module the panels need was
    imported before it was asked for, or its thread has finished (successfully or not)."""
    if _thread is not None:
        return not _thread.is_alive()
    return all(name in sys.modules for name in HEAVY_MODULES)


def when_ready(callback: Callable[[], None]) -> None:
    """Call `callback` on the GUI thread once the heavy modules are imported: now when they are, else on
    a later event-loop turn, one waiting callback per turn."""
    if imports_ready() and not _waiting:
        callback()
        return
    _waiting.append(callback)
    start()
    if imports_ready():
        _drain()


def import_error() -> str | None:
    """Why the warm-up failed to import a module (the panels then name it), or None."""
    return _error


def start() -> _Signals:
    """Start importing the heavy modules on a thread (once, START_DELAY_MS from now); returns the object
    that signals the end."""
    global _signals, _scheduled
    signals = _signals = _signals or _Signals()
    if not _scheduled and not all(name in sys.modules for name in HEAVY_MODULES):
        _scheduled = True
        QTimer.singleShot(START_DELAY_MS, lambda: _start_thread(signals))
    return signals


def _start_thread(signals: _Signals) -> None:
    global _thread
    _thread = threading.Thread(target=_warm, args=(signals,), name="bigslide-imports", daemon=True)
    _thread.start()


def _warm(signals: _Signals) -> None:
    global _error
    collecting = gc.isenabled()
    # a full collection walks every object alive with the lock held: during these imports one came as
    # timm and one as scikit-learn loaded, 150 and 195 ms each over a heap of napari's, Qt's and torch's
    # objects; the objects the imports make live as long as the process (`settle_imports`)
    gc.disable()
    try:
        _map_torch_libraries()
        for name in (*HEAVY_MODULES, *VIEWER_MODULES):
            importlib.import_module(name)
        _units_ready()
        from bigslide.data.processes import fork_from_server
        from bigslide.methods.base import available_methods

        available_methods()  # reads installed packages' entry points once
        fork_from_server()
    except Exception as err:  # the panels show it; the viewer must not go down with it
        _error = f"{type(err).__name__}: {err}"
    finally:
        settle_imports()
        if collecting:
            gc.enable()
    signals.ready.emit()


def _map_torch_libraries() -> None:
    """Map torch's shared libraries with the interpreter lock released (see the module's docstring)."""
    if "torch" in sys.modules or not hasattr(os, "RTLD_GLOBAL"):
        return
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return
    folder = Path(spec.origin).parent / "lib"
    try:
        libc = ctypes.CDLL(None)
        dlopen = libc.dlopen
    except (OSError, AttributeError):  # no dlopen here: torch maps them itself, lock held
        return
    dlopen.restype = ctypes.c_void_p
    dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    for name in TORCH_LIBRARIES:
        if (folder / name).is_file():
            dlopen(str(folder / name).encode(), os.RTLD_NOW | os.RTLD_GLOBAL)


def _units_ready() -> None:
    """Build napari's unit registry (pint's), which its first layer otherwise builds on the GUI thread
    (0.3-0.45 s on two cores)."""
    import pint

    _ = pint.get_application_registry().pixel


def _drain() -> None:
    """Run the waiting callbacks, one per event-loop turn, so building panels never freezes the viewer
    for the time of all of them."""
    global _draining
    if _draining or not _waiting:
        return
    _draining = True

    def next_one() -> None:
        global _draining
        if not _waiting:
            _draining = False
            return
        callback = _waiting.pop(0)
        try:
            callback()
        finally:
            QTimer.singleShot(0, next_one)

    QTimer.singleShot(0, next_one)
