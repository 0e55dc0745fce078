"""The Results panel's line for a slide's prediction: what the model called it, how sure, how it decides,
and what the Slides table says of the slide."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bigslide.wsi.resolution import coarser_scan

if TYPE_CHECKING:
    from bigslide.napari._session import SlideRow

SPLIT_NOTES = {
    "train": " (a training slide: the model learnt from it)",
    "val": " (a validation slide: it chose the threshold)",
    "test": " (a test slide, held out)",
}


def prediction_line(
    prediction: Any, slide: str, scanned_mpp: float | None, row: SlideRow | None, case_slides: int = 1
) -> str:
    """`slide`'s prediction in rich text: its call and probabilities (or its context), the epochs trained,
    the decision rule, the Slides table's `row` beside it (`case_slides`: the slides of its case), and notes
    on a preview or a coarse scan."""
    if prediction.task == "classification":
        digits = _digits(prediction)
        detail = ", ".join(f"{c} {p:.{digits}f}" for c, p in zip(prediction.classes, prediction.probs))
    else:
        detail = prediction.context()
    trained = f" after {prediction.epochs} epoch{'s' * (prediction.epochs != 1)}" if prediction.epochs else ""
    coarse = (
        f"<br><i>Preview while training: one tile in {prediction.thinned} × {prediction.thinned} read; "
        "every tile is read when the run ends.</i>"
        if prediction.thinned > 1
        else ""
    )
    decision = f"<br>{prediction.decision.describe(prediction.classes)}" if prediction.decision else ""
    decision += _against_table(prediction, row, case_slides)
    scan = coarser_scan(scanned_mpp, prediction.read_mpp)
    scan = f"<br><i>This slide was {scan}.</i>" if scan else ""
    return f"{slide}{trained}: <b>{prediction.label}</b> ({detail}){decision}{coarse}{scan}"


def _digits(prediction: Any) -> int:
    """Decimals the probabilities are shown with: 2, or 4 where P(class 1) at 2 would read on the other
    side of the decision's threshold ("normal (normal 0.45, tumor 0.55)" beside "P(tumor) >= 0.5462")."""
    decision = prediction.decision
    if decision is None or decision.source == "argmax" or len(prediction.probs) != 2:
        return 2
    p = float(prediction.probs[1])
    return 4 if (round(p, 2) >= decision.threshold) != (p >= decision.threshold) else 2


def _against_table(prediction: Any, row: SlideRow | None, case_slides: int = 1) -> str:
    """A line setting the prediction beside what the Slides table says of the slide ('' when it says
    nothing the prediction can be set against). The label of a case of several slides is the case's: the
    slide alone may not show what its case does."""
    if row is None:
        return ""
    case = ""
    if row.case and case_slides > 1:
        case = (
            f"<br><i>Case '{row.case}' has {case_slides} slides: this is this slide alone; bigslide predict "
            "reads the case's slides together, as training did.</i>"
        )
    if prediction.task == "classification" and row.label in prediction.classes:
        called = "called right" if row.label == prediction.label else f"called {prediction.label} instead"
        # a slide the model learnt from proves little by being called right
        split = SPLIT_NOTES.get(row.split, "")
        whose = f" for case '{row.case}'" if case else ""
        return f"<br>Labelled <b>{row.label}</b>{whose} in the Slides table{split}: {called}.{case}"
    if prediction.task == "regression" and row.target is not None:
        return f"<br>The Slides table gives {row.target:g}.{case}"
    return case
