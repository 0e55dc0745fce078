"""Follow `bigslide predict` through the code: the bigslide modules its main thread enters, in order, and
how often the path goes back up to a higher layer of the import contracts (a room it left for a lower one).

    python docs/trace_predict.py            # a small synthetic cohort and checkpoint, made in a temp folder

Prints the rooms (modules) entered, the stops (entries into a module other than the one before), the
climbs (stops on a higher layer than the stop before: most are a call down made after the call before it
returned) and the calls up (a function calling one on a higher layer than its own: a callback or a
protocol method a higher layer handed down), each call up by caller and callee.
"""

from __future__ import annotations

import collections
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


Call = tuple[str, str]  # module, function


def follow(argv: list[str]) -> tuple[list[str], list[tuple[Call, Call]]]:
    """The bigslide modules the main thread enters while `bigslide <argv>` runs, one per stop; and each
    call from a bigslide function into another bigslide module, as (caller, callee)."""
    from bigslide.cli.main import main

    stops: list[str] = []
    calls: list[tuple[Call, Call]] = []
    main_thread = threading.get_ident()
    here = sys._getframe()  # frames below this one (a test runner's own imports) are not the command's

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call" or threading.get_ident() != main_thread:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("bigslide.") or not frame.f_code.co_flags & NEW_LOCALS:
            return  # outside bigslide, or a module or class body (an import), not a call
        caller, by = frame.f_back, None
        while caller is not None and caller is not here:  # code run by an import is not on its path
            name = caller.f_globals.get("__name__", "")
            if caller.f_code.co_name == "<module>" and name != "__main__":
                return
            if by is None and name.startswith("bigslide.") and caller.f_code.co_flags & NEW_LOCALS:
                by = (name, caller.f_code.co_name)  # the nearest bigslide function below it
            caller = caller.f_back
        if by is not None and by[0] != module:
            calls.append((by, (module, frame.f_code.co_name)))
        if not stops or stops[-1] != module:
            stops.append(module)

    sys.setprofile(profile)
    try:
        main(argv)
    finally:
        sys.setprofile(None)
    return stops, calls


def main() -> None:
    from tests.test_predict_cohort import make_checkpoint

    from bigslide.synthetic.slide_set import make_slide_set

    work = Path(tempfile.mkdtemp(prefix="bigslide-trace-"))
    cohort = make_slide_set(work / "slides", n_slides=2, size=(512, 512), seed=8)
    checkpoint = make_checkpoint(work, "abmil_acc")
    argv = ["predict", "--slides", str(cohort), "--checkpoint", str(checkpoint), "--out", str(work / "out")]
    stops, calls = follow([*argv, "--workers", "0", "--quiet", "--no-heatmaps"])
    climbs = sum(floor(b) < floor(a) for a, b in itertools.pairwise(stops))
    up = collections.Counter((a, b) for a, b in calls if floor(b[0]) < floor(a[0]))
    first = stops.index(next(s for s in stops if s.endswith("checkpoint")))
    print(
        f"rooms entered: {len(set(stops))}; stops: {len(stops)}; climbs back to a higher layer: {climbs}; "
        f"calls up: {sum(up.values())} of {len(calls)} calls between modules"
    )
    for (by, to), n in up.most_common():
        print(f"  call up x{n}: {by[0]}.{by[1]} -> {to[0]}.{to[1]}")
    print(f"rooms entered before the checkpoint is read: {', '.join(dict.fromkeys(stops[:first]))}")
    for stop in stops:
        print(f"  {'  ' * floor(stop)}{stop}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
