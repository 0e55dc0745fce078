"""State shared by the dock widgets of one viewer: the training set and the tiling settings.

napari builds each dock widget on its own; they meet here, one `Session` per viewer.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from psygnal import Signal

from bigslide.data.config import DataConfig
from bigslide.errors import DataError
from bigslide.words import counted

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    import napari

    from bigslide.data.processes import DecodeProcesses
    from bigslide.data.slides import SlideCache
    from bigslide.data.table import SlideTable
    from bigslide.engine.config import TrainConfig
    from bigslide.engine.events import Event
    from bigslide.engine.loop import RunResult

T = TypeVar("T")


@dataclass
class SlideRow:
    path: Path
    label: str = ""
    split: str = ""
    regions: Path | None = None
    tiles: int | None = None
    from_layer: bool = False
    case: str | None = None
    time: float | None = None  # survival: time to event or censoring
    event: int | None = None  # survival: 1 observed, 0 censored
    target: float | None = None  # regression
    annotations: Path | None = None  # teaching annotations (QuPath GeoJSON)
    annotated: int | None = None  # tiles inside them, once counted
    damaged: str | None = None  # why some of its tiles will not decode (seen while drawing it)
    untiled: str | None = None  # why it could not be tiled (seen while counting its tiles)
    mpp: float | None = None  # level-0 µm/px of a file that states none: its table's mpp, or typed in its row


class Session:
    changed = Signal()
    """Rows were added, removed or edited."""
    slide_mpp_changed = Signal(object)
    """The fallback level-0 µm/px (float or None) changed."""
    tiling_changed = Signal()
    """How tiles are made changed (tile size, resolution, slide µm/px if unstated, min tissue, pen marks)."""
    checkpoint_saved = Signal(object)
    """A training run of this viewer saved a checkpoint (its Path)."""
    run_finished = Signal(object)
    """A training run of this viewer finished; its final checkpoint (Path), test split scored."""

    def __init__(self) -> None:
        defaults = DataConfig()
        self.rows: list[SlideRow] = []
        self.tile_size = defaults.tile_size
        self.target_mpp = defaults.read_mpp  # µm/px tiles are read at
        self._slide_mpp = defaults.slide_mpp  # level-0 µm/px of files that state none
        self.min_tissue = defaults.min_tissue
        self.tissue = defaults.tissue  # how tissue is told from glass, ink and dust (data.* settings)
        self.columns: list[str] = []  # of the last slide table loaded
        self.task = "classification"  # what those columns imply (data.task)
        self.table_name = ""  # the file they were read from
        self.table_path: Path | None = None  # and where it is (teaching annotations are saved beside it)
        self._problems: dict[str, str] = {}  # refused inputs of the panels, by field
        self._processes: DecodeProcesses | None = None
        self._processes_lock = threading.Lock()  # runs start them on their own thread
        # the Train panel's run under way, and its folder: a Train panel opened again while it trains
        # (its dock was closed) shows that run, with its Stop button, and starts no second one
        self.training: tuple[Any, Path] | None = None

    def decode_processes(self) -> DecodeProcesses:
        """The decode worker processes this viewer's runs, maps, tile previews and counts share: started
        (from the fork server) on first use and kept while the viewer lives, so no run or map waits for
        workers to start, and the viewer's process never decodes a tile. A run asks for them on its own
        thread (`run_processes`): the first start waits for the fork server, which may still be importing
        torch a moment after the viewer opened."""
        with self._processes_lock:
            if self._processes is None:
                from bigslide.data.loader import default_workers
                from bigslide.data.processes import DecodeProcesses

                n = default_workers()
                self._processes = DecodeProcesses(n, buffers=n + 1)
            return self._processes

    def close_processes(self) -> None:
        """Stop the decode workers (the viewer's window is gone); a later use starts new ones."""
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.close()

    def run_processes(self, config: TrainConfig) -> DecodeProcesses | None:
        """The decode workers a run of `config` shares with the viewer (none when it reads in-process)."""
        return None if config.data.workers == 0 else self.decode_processes()

    def train(self, config: TrainConfig) -> Generator[Event, None, RunResult]:
        """`bigslide.engine.loop.train` on this viewer's decode workers, started (on first use) by the
        thread that runs the generator, never the viewer's."""
        from bigslide.engine.loop import train

        return (yield from train(config, processes=self.run_processes(config)))

    def slides(self) -> SlideCache:
        """Slides read as the panels say (the fallback µm/px), tiled in the decode workers, which the
        first read starts: on the thread of the work that reads, never the viewer's."""
        from bigslide.data.slides import SlideCache

        slides = SlideCache(slide_mpp=self.slide_mpp, workers=_StartedOnFirstCall(self))
        slides.state(self.row_mpps())
        return slides

    def fallback_mpp(self, path: str | Path) -> float | None:
        """The µm/px the slide at `path` is read at if its file states none: its row's, else the fallback."""
        row = self.row(path)
        return row.mpp if row is not None and row.mpp is not None else self.slide_mpp

    def row_mpps(self) -> dict[Path, float]:
        """The level-0 µm/px the rows give (a table's mpp, or typed in the row): files that state none are
        read at it."""
        return {r.path: r.mpp for r in self.rows if r.mpp is not None}

    def set_problem(self, field: str, refusal: str | None) -> None:
        """Record (or clear, with None) the refusal of a number typed into a panel field: no run starts
        and no tile is counted while one stands."""
        if refusal is None:
            self._problems.pop(field, None)
        else:
            self._problems[field] = refusal

    def problems(self) -> list[str]:
        """The refusals standing in the panels' fields, each naming its field."""
        return list(self._problems.values())

    @property
    def slide_mpp(self) -> float | None:
        return self._slide_mpp

    @slide_mpp.setter
    def slide_mpp(self, value: float | None) -> None:
        value = float(value) if value else None
        if value != self._slide_mpp:
            self._slide_mpp = value
            self.slide_mpp_changed.emit(value)

    def mark_damaged(self, path: str | Path, why: str) -> None:
        """A slide of the table has tiles that will not decode: its row says so."""
        row = self.row(path)
        if row is not None and row.damaged is None:
            row.damaged = why
            self.changed.emit()

    def row(self, path: str | Path) -> SlideRow | None:
        key = Path(path).resolve()
        return next((r for r in self.rows if r.path == key), None)

    def add(
        self,
        path: str | Path,
        *,
        label: str = "",
        split: str = "",
        regions: Path | None = None,
        from_layer: bool = False,
        emit: bool = True,
    ) -> SlideRow:
        """Add a slide, or update the known one (non-empty values win); `changed` fires unless `emit` is
        False (a table adds its rows, then says so once)."""
        row = self.row(path)
        if row is None:
            row = SlideRow(Path(path).resolve(), from_layer=from_layer)
            self.rows.append(row)
        row.label = label or row.label
        row.split = split or row.split
        row.regions = regions or row.regions
        if emit:
            self.changed.emit()
        return row

    def remove(self, path: str | Path) -> None:
        row = self.row(path)
        if row is not None:
            self.rows.remove(row)
            self.changed.emit()

    def update(self, path: str | Path, **values: Any) -> None:
        row = self.row(path)
        if row is None:
            return
        for key, value in values.items():
            setattr(row, key, value)
        self.changed.emit()

    def load_csv(self, path: str | Path) -> int:
        """Add every row of a slide table, with the endpoint its columns imply (time,event: survival;
        target: regression; else classes); returns how many were read."""
        from bigslide.data.table import SlideTable, implied_task
        from bigslide.data.table_text import read_table_text

        columns = read_table_text(Path(path))[0]
        task = implied_task(columns)
        table = SlideTable.from_csv(path, task=task)
        self.columns, self.task, self.table_name = columns, task, Path(path).name
        self.table_path = Path(path).resolve()
        for entry in table.entries:
            row = self.add(
                entry.path, label=entry.label, split=entry.split or "", regions=entry.regions, emit=False
            )
            row.case, row.time, row.event, row.target = entry.case, entry.time, entry.event, entry.target
            row.annotations = entry.annotations or row.annotations
            row.mpp = entry.mpp
        self.changed.emit()
        return len(table.entries)

    def table(self) -> SlideTable:
        """The rows as a slide table of the session's task; a slide without what the task learns from (a
        label; a time and event; a target) is a `DataError` naming it."""
        from bigslide.data.table import TASK_COLUMNS, SlideEntry, SlideTable

        if not self.rows:
            raise DataError("the training set is empty: open slides or load a slide table (CSV) first")
        missing = {
            "classification": lambda r: not r.label.strip(),
            "survival": lambda r: r.time is None or r.event is None,
            "regression": lambda r: r.target is None,
        }[self.task]
        lacking = [r.path.name for r in self.rows if missing(r)]
        if lacking and self.task == "classification":
            raise DataError(
                f"slide(s) without a label: {', '.join(lacking)}; type a label in the Slides panel"
            )
        if lacking:
            raise DataError(
                f"slide(s) without {' and '.join(TASK_COLUMNS[self.task])} for {self.task}: "
                f"{', '.join(lacking)}; load a slide table that gives them"
            )
        entries = [
            SlideEntry(
                r.path,
                r.label.strip(),
                r.split or None,
                r.regions,
                r.case,
                r.time,
                r.event,
                r.target,
                r.annotations,
                r.mpp,
            )
            for r in self.rows
        ]
        return SlideTable(entries, task=self.task)

    def describe(self) -> str:
        """What the training set holds, in words: slides, cases, the columns read and the task."""
        n_cases = len({r.case or str(r.path) for r in self.rows})
        cases = f" in {counted(n_cases, 'case')}" if any(r.case for r in self.rows) else ""
        read = f"columns {', '.join(self.columns)} of {self.table_name}; " if self.columns else ""
        what = {
            "classification": "classes",
            "survival": "survival (time to event, censored)",
            "regression": "regression (a number per slide)",
        }[self.task]
        return f"{counted(len(self.rows), 'slide')}{cases}; {read}task: {what}"

    def save_csv(self, path: str | Path) -> Path:
        return self.table().to_csv(path)


_SESSIONS: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()


def session_for(viewer: napari.Viewer) -> Session:
    """The viewer's session; the first call also makes the viewer keep every overlay on its slide and
    give the session's fallback µm/px to slides whose files state none, now and as they are opened, and
    starts the process that runs and predicts will start their decode workers from."""
    session = _SESSIONS.get(viewer)
    if session is None:
        from bigslide.data.processes import fork_from_server
        from bigslide.napari._gc import settle_imports

        fork_from_server()  # a no-op when the panels' warm-up has started it
        settle_imports()
        session = _SESSIONS[viewer] = Session()
        _wire(viewer, session)
    return session


SCALE_BAR_DELAY_MS = 300
"""The canvas's letters start being drawn this long after the panels open; the scale bar is switched on
once its own are (`warm_glyphs`)."""


def scale_bar_of(viewer: napari.Viewer) -> Any:
    """The viewer's scale bar (`viewer.canvas.overlays` from napari 0.9, `viewer.scale_bar` before)."""
    canvas = getattr(viewer, "canvas", None)
    return canvas.overlays.scale_bar if canvas is not None else viewer.scale_bar


def _wire(viewer: napari.Viewer, session: Session) -> None:
    from bigslide.napari._glyphs import warm_glyphs
    from bigslide.napari._placement import set_fallback_mpp, set_row_mpps
    from bigslide.napari._qt import window_part
    from bigslide.napari._reader import prefer_this_reader
    from bigslide.napari._tile_errors import on_damaged

    prefer_this_reader()
    on_damaged(session.mark_damaged)  # its rows say which slides have tiles that will not decode
    ref = weakref.ref(viewer)

    def scale_bar() -> None:  # slides are laid out in µm: sizes read off the bar
        view = ref()
        if view is not None:
            scale_bar_of(view).visible = True

    # once its letters are drawn, one per turn: its first draw would add theirs to the freeze of its
    # shaders' (about 200 ms together on two cores without a GPU)
    warm_glyphs(viewer, SCALE_BAR_DELAY_MS, scale_bar_ready=scale_bar)
    window = window_part(viewer, "_qt_window")
    if window is not None:  # the viewer's decode workers end with its window
        window.destroyed.connect(lambda *_: session.close_processes())

    def apply(mpp: float | None) -> None:
        view = ref()
        if view is not None:
            set_fallback_mpp(view, mpp)

    def apply_rows() -> None:
        view = ref()
        if view is not None:
            set_row_mpps(view, {p.resolve(): v for p, v in session.row_mpps().items()})

    apply_rows()
    apply(session.slide_mpp)
    session.slide_mpp_changed.connect(apply)
    session.changed.connect(apply_rows)


class _StartedOnFirstCall:
    """A session's decode workers as a `SlideCache` uses them: started by the first call, so a panel can
    hand the cache to its worker thread without waiting a second for the fork server."""

    def __init__(self, session: Session) -> None:
        from bigslide.data.loader import default_workers

        self._session = session
        self.workers = default_workers()  # what `decode_processes` starts

    def call(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        return self._session.decode_processes().call(fn, *args, what=what)
