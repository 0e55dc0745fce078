"""State shared by the dock widgets of one viewer: the training set and the tiling settings.

napari builds each dock widget on its own; they meet here, one `Session` per viewer.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psygnal import Signal

from bigslide.engine.config import DataConfig
from bigslide.errors import DataError

if TYPE_CHECKING:
    import napari

    from bigslide.data.table import SlideTable

SPLIT_CHOICES = ("", "train", "val", "test")  # "" = decided at training time (stratified)


@dataclass
class SlideRow:
    path: Path
    label: str = ""
    split: str = ""
    regions: Path | None = None
    tiles: int | None = None
    from_layer: bool = False


class Session:
    changed = Signal()
    """Rows were added, removed or edited."""
    slide_mpp_changed = Signal(object)
    """The fallback level-0 µm/px (float or None) changed."""
    checkpoint_saved = Signal(object)
    """A training run of this viewer saved a checkpoint (its Path)."""

    def __init__(self) -> None:
        defaults = DataConfig()
        self.rows: list[SlideRow] = []
        self.tile_size = defaults.tile_size
        self.target_mpp = defaults.read_mpp  # µm/px tiles are read at
        self._slide_mpp = defaults.slide_mpp  # level-0 µm/px of files that state none
        self.min_tissue = defaults.min_tissue

    @property
    def slide_mpp(self) -> float | None:
        return self._slide_mpp

    @slide_mpp.setter
    def slide_mpp(self, value: float | None) -> None:
        value = float(value) if value else None
        if value != self._slide_mpp:
            self._slide_mpp = value
            self.slide_mpp_changed.emit(value)

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
    ) -> SlideRow:
        """Add a slide, or update the known one (non-empty values win)."""
        row = self.row(path)
        if row is None:
            row = SlideRow(Path(path).resolve(), from_layer=from_layer)
            self.rows.append(row)
        row.label = label or row.label
        row.split = split or row.split
        row.regions = regions or row.regions
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
        """Add every row of a slide table; returns how many were read."""
        from bigslide.data.table import SlideTable

        table = SlideTable.from_csv(path)
        for entry in table.entries:
            self.add(entry.path, label=entry.label, split=entry.split or "", regions=entry.regions)
        return len(table.entries)

    def table(self) -> SlideTable:
        """The rows as a slide table; a slide without a label is a `DataError` naming it."""
        from bigslide.data.table import SlideEntry, SlideTable

        if not self.rows:
            raise DataError("the training set is empty: open slides or load a slide table (CSV) first")
        unlabelled = [r.path.name for r in self.rows if not r.label.strip()]
        if unlabelled:
            raise DataError(
                f"slide(s) without a label: {', '.join(unlabelled)}; type a label in the Slides panel"
            )
        return SlideTable(
            [SlideEntry(r.path, r.label.strip(), r.split or None, r.regions) for r in self.rows]
        )

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

        fork_from_server()
        session = _SESSIONS[viewer] = Session()
        _wire(viewer, session)
    return session


def _wire(viewer: napari.Viewer, session: Session) -> None:
    from bigslide.napari._placement import keep_in_place, set_slide_mpp
    from bigslide.napari._roles import ROLE, slide_layers

    keep_in_place(viewer)
    ref = weakref.ref(viewer)

    def apply(mpp: float | None) -> None:
        view = ref()
        for layer in slide_layers(view) if view is not None else []:
            set_slide_mpp(view, layer, mpp)

    def on_inserted(event: Any) -> None:
        view = ref()
        if view is not None and event.value.metadata.get(ROLE) == "slide":
            set_slide_mpp(view, event.value, session.slide_mpp)

    session.slide_mpp_changed.connect(apply)
    viewer.layers.events.inserted.connect(on_inserted)
