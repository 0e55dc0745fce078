"""What a person sees first: the words labels painted (on screen) and the layers napari inserted, in order."""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import QEvent, QObject


class PaintOrder(QObject):
    """Records each paint of `labels` (with the text then shown) and each layer inserted into `viewer`."""

    def __init__(self, viewer: Any, labels: list[Any]) -> None:
        super().__init__()
        self.viewer = viewer
        self.labels = labels
        self.seen: list[tuple[str, str]] = []
        for label in labels:
            label.installEventFilter(self)
        viewer.layers.events.inserted.connect(self._inserted)

    def eventFilter(self, obj: Any, event: Any) -> bool:
        if event.type() == QEvent.Type.Paint:
            self.seen.append(("painted", obj.text()))
        return False

    def _inserted(self, event: Any) -> None:
        self.seen.append(("layer", event.value.name))

    def stop(self) -> None:
        for label in self.labels:
            label.removeEventFilter(self)
        self.viewer.layers.events.inserted.disconnect(self._inserted)

    def layers(self) -> list[str]:
        return [name for kind, name in self.seen if kind == "layer"]

    def painted_before_the_first_layer(self) -> list[str]:
        first = next(n for n, (kind, _) in enumerate(self.seen) if kind == "layer")
        return [text for kind, text in self.seen[:first] if kind == "painted"]
