"""All four panels as tabs of one dock, so the window fits a 1600 × 1000 screen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qtpy.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from bigslide.napari._regions_widget import RegionsWidget
from bigslide.napari._results_widget import ResultsWidget
from bigslide.napari._slides_widget import SlidesWidget
from bigslide.napari._train_widget import TrainWidget

if TYPE_CHECKING:
    import napari


class BigslidePanels(QWidget):
    """Slides, Regions, Train and Results as tabs of one dock widget (they share the viewer's session)."""

    bigslide_dock = True  # a panel opened apart joins it as a tab (`bigslide.napari._panel`)

    def __init__(self, napari_viewer: napari.Viewer) -> None:
        # each panel shows at once and fills in when PyTorch is loaded, one per event-loop turn
        super().__init__()
        self.slides = SlidesWidget(napari_viewer)
        self.regions = RegionsWidget(napari_viewer)
        self.train = TrainWidget(napari_viewer)
        self.results = ResultsWidget(napari_viewer)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for title, panel in (
            ("Slides", self.slides),
            ("Regions", self.regions),
            ("Train", self.train),
            ("Results", self.results),
        ):
            self.tabs.addTab(panel, title)  # each panel scrolls on its own; Train keeps Start/Stop in view
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tabs)
        self.setMinimumHeight(0)

    @property
    def ready(self) -> bool:
        """Whether every panel is built (at once when PyTorch was loaded before they opened)."""
        return all(p.ready for p in (self.slides, self.regions, self.train, self.results))
