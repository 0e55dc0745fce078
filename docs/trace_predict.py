"""Follow `bigslide predict` through the code: the bigslide modules its main thread enters, in order, and
how often the path goes back up to a higher layer of the import contracts (a room it left for a lower one).

    python docs/trace_predict.py            # a small synthetic cohort and checkpoint, made in a temp folder

Prints the rooms (modules) entered, the stops (entries into a module other than the one before) and the
climbs (stops on a higher layer than the stop before).
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import threading
from pathlib import Path

NEW_LOCALS = 0x02  # inspect.CO_NEWLOCALS: a function's frame
LAYERS = (
    ("bigslide.napari", "bigslide.bench"),
    ("bigslide.cli",),
    ("bigslide.engine",),
    ("bigslide.plan",),
    ("bigslide.methods",),
    ("bigslide.nn", "bigslide.memory"),
    ("bigslide.explain",),
    ("bigslide.data",),
    ("bigslide.synthetic",),
)


def floor(module: str) -> int:
    """0 for the top layer; slide reading, tiling and the root modules (errors, files, ...) are the bottom,
    as in the import contracts' base."""
    for index, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    return len(LAYERS)


def follow(argv: list[str]) -> list[str]:
    """The bigslide modules the main thread enters while `bigslide <argv>` runs, one per stop."""
    from bigslide.cli.main import main

    stops: list[str] = []
    main_thread = threading.get_ident()

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call" or threading.get_ident() != main_thread:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("bigslide.") or not frame.f_code.co_flags & NEW_LOCALS:
            return  # outside bigslide, or a module or class body (an import), not a call
        caller = frame.f_back
        while caller is not None:  # code run by an import is not on the command's path
            if caller.f_code.co_name == "<module>" and caller.f_globals.get("__name__") != "__main__":
                return
            caller = caller.f_back
        if not stops or stops[-1] != module:
            stops.append(module)

    sys.setprofile(profile)
    try:
        main(argv)
    finally:
        sys.setprofile(None)
    return stops


def main() -> None:
    from tests.test_predict_cohort import make_checkpoint

    from bigslide.synthetic.slide_set import make_slide_set

    work = Path(tempfile.mkdtemp(prefix="bigslide-trace-"))
    cohort = make_slide_set(work / "slides", n_slides=2, size=(512, 512), seed=8)
    checkpoint = make_checkpoint(work, "abmil_acc")
    argv = ["predict", "--slides", str(cohort), "--checkpoint", str(checkpoint), "--out", str(work / "out")]
    stops = follow([*argv, "--workers", "0", "--quiet", "--no-heatmaps"])
    climbs = sum(floor(b) < floor(a) for a, b in itertools.pairwise(stops))
    first = stops.index(next(s for s in stops if s.endswith("checkpoint")))
    print(f"rooms entered: {len(set(stops))}; stops: {len(stops)}; climbs back to a higher layer: {climbs}")
    print(f"rooms entered before the checkpoint is read: {', '.join(dict.fromkeys(stops[:first]))}")
    for stop in stops:
        print(f"  {'  ' * floor(stop)}{stop}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
