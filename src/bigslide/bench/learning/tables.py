"""The learning bench's tables, rendered from its results file (`--docs` writes them into the docs)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.bench.learning.annotations import AUC_GOAL, LESION_SHARE, NORMAL_SIDE
from bigslide.bench.learning.runs import BEGIN, END, SUBTLE_LR, ULTRAMNIST_DIGITS, ULTRAMNIST_PATCH
from bigslide.bench.learning.stain import HELD_OUT_RUNS
from bigslide.explain.suggest import HIGH


def mean_sd(values: list[float]) -> str:
    values = [v for v in values if np.isfinite(v)]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.3f} ± {sd:.3f}" if len(values) > 1 else f"{values[0]:.3f} (1 seed)"


def _table(runs: dict[str, dict[str, float]], part: str, columns: dict[str, str]) -> list[str]:
    names: dict[str, list[dict[str, float]]] = {}
    for key, value in runs.items():
        p, name, _seed = key.split("/")
        if p == part:
            names.setdefault(name, []).append(value)
    if not names:
        return ["(not measured)", ""]
    lines = ["| run | seeds | " + " | ".join(columns.values()) + " |", "|---|---:|" + "---:|" * len(columns)]
    for name, rows in names.items():
        cells = [mean_sd([r.get(k, float("nan")) for r in rows]) for k in columns]
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _annotation_table(runs: dict[str, dict[str, float]]) -> list[str]:
    """The annotations part: the slide columns, and the epochs to the AUC goal with how many seeds get
    there."""
    columns = {"auc": "test AUC", "balanced_accuracy": "balanced accuracy", "cell_auc": "attention cell AUC"}
    lines = _table(runs, "annotations", columns)
    if len(lines) < 3:
        return lines
    goal = (("epochs_to_goal", "reaches"), ("epochs_to_stay", "stays at"))
    lines[0] += "".join(f" epochs until val AUC {what} {AUC_GOAL} |" for _, what in goal)
    lines[1] += "---:|" * len(goal)
    for i, line in enumerate(lines[2:-1], start=2):
        name = line.split("|")[1].strip()
        rows = [r for k, r in runs.items() if k.split("/")[:2] == ["annotations", name]]
        for key, _ in goal:
            got = [r[key] for r in rows if np.isfinite(r.get(key, float("nan")))]
            line += f" {mean_sd(got)} ({len(got)}/{len(rows)} seeds) |"
        lines[i] = line
    return lines


def _retrain(meta: dict[str, Any]) -> str:
    """How the suggest part's retrains were trained (results from before the choice continued)."""
    start, more = meta.get("suggest_start_epochs"), meta.get("suggest_epochs")
    if meta.get("suggest_retrain", "continue") == "continue":
        return f"from that checkpoint {more} more epochs"
    total = start + more if isinstance(start, int) and isinstance(more, int) else None
    return f"from the same initial weights for {total} epochs, as 'train anew'"


def _suggest_table(runs: dict[str, dict[str, float]]) -> list[str]:
    """The suggest part: the slide columns and the answers each arm got, then suggested against random
    and top attention, seed by seed, at each k."""
    columns = {
        "auc": "test AUC",
        "balanced_accuracy": "balanced accuracy",
        "cell_auc": "attention cell AUC",
        "answered_lesion": "lesion answers",
        "answered_not_lesion": "Not-lesion answers",
        "skipped": "skipped (mixed)",
        "peak_attention": "strongest place asked (x its slide's mean)",
    }
    lines = _table(runs, "suggest", columns)
    if len(lines) < 3:
        return lines
    by_seed: dict[str, dict[str, float]] = {}
    for key, value in runs.items():
        part, name, seed = key.split("/")
        if part == "suggest" and "cell_auc" in value:
            by_seed.setdefault(name, {})[seed] = value["cell_auc"]
    ks = sorted({int(n.rsplit("-k", 1)[1]) for n in by_seed if n.startswith("suggested-k")})
    for k in ks:
        for other in ("random", "top_attention"):
            mine, theirs = by_seed.get(f"suggested-k{k}", {}), by_seed.get(f"{other}-k{k}", {})
            seeds = sorted(set(mine) & set(theirs))
            if seeds:
                gaps = [mine[s] - theirs[s] for s in seeds]
                lines.append(
                    f"- k = {k}: suggested − {other}, attention cell AUC, seed by seed: "
                    + ", ".join(f"{g:+.3f}" for g in gaps)
                    + f" (mean {statistics.mean(gaps):+.3f})"
                )
    return [*lines, ""]


def _stain_runs(runs: dict[str, dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    names: dict[str, list[dict[str, float]]] = {}
    for key, value in runs.items():
        part, name, _seed = key.split("/")
        if part == "stain":
            names.setdefault(name, []).append(value)
    return names


def _over_labs(rows: list[dict[str, float]], metric: str, labs: list[str]) -> list[float]:
    """Per seed: the mean of `metric` over `labs` (NaN where a lab was not scored)."""
    return [float(np.mean([r.get(f"{metric}_{lab}", float("nan")) for lab in labs])) for r in rows]


def _worst_lab(rows: list[dict[str, float]], labs: list[str]) -> str:
    """The lab of lowest balanced accuracy (mean over seeds) and that mean."""
    means = {lab: float(np.mean([r.get(f"balanced_accuracy_{lab}", np.nan) for r in rows])) for lab in labs}
    lab = min(means, key=lambda k: means[k] if np.isfinite(means[k]) else np.inf)
    return f"{means[lab]:.3f} ({lab})" if np.isfinite(means[lab]) else "—"


def _stain_tables(runs: dict[str, dict[str, float]], labs: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The stain part: every run on labs A, B, C and the tuning labs; then each lab, before and after."""
    names = _stain_runs(runs)
    if not names:
        return ["### Stain", "", "(not measured)", ""]
    tuning, held_out = labs.get("tuning", []), labs.get("held_out", [])
    lines = [
        "### Stain: trained on lab A, tested on other labs (the demo's 40 slides, its 10 test slides "
        "rendered by each lab; ABMIL-ACC with `bigslide demo`'s settings: tiles of 32 px at 1 µm/px, bag 24, "
        f"learning rate 2e-3, but {meta.get('stain_epochs')} epochs; classes called at the threshold chosen "
        "on lab A's validation slides. *flips_only*: stain settings off; *defaults*: the product's "
        "defaults; *stain_augment_xS*: data.stain_augment on, data.stain_augment_strength S (1: the full "
        "ranges). Tuning labs: "
        + ", ".join(tuning)
        + "; held-out labs, drawn once after the augmentation was chosen, scored with "
        + ", ".join(HELD_OUT_RUNS)
        + ": "
        + (", ".join(held_out) or "none yet")
        + "; retired held-out labs (of the choice before), scored the same way: "
        + (", ".join(labs.get("retired", [])) or "none")
        + ")",
        "",
        "| run | seeds | lab A AUC | lab A bal. acc. | lab B bal. acc. | lab C bal. acc. | tuning labs AUC "
        "| tuning labs bal. acc. | worst tuning lab bal. acc. |",
        "|---|---:|" + "---:|" * 7,
    ]
    for name, rows in names.items():
        cells = [mean_sd([r.get(k, float("nan")) for r in rows]) for k in ("auc_A", "balanced_accuracy_A")]
        cells += [mean_sd([r.get(f"balanced_accuracy_{lab}", np.nan) for r in rows]) for lab in "BC"]
        cells += [mean_sd(_over_labs(rows, m, tuning)) for m in ("auc", "balanced_accuracy")]
        cells.append(_worst_lab(rows, tuning) if tuning else "—")
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _per_lab_table(names, labs)
    return lines


def _per_lab_table(names: dict[str, list[dict[str, float]]], labs: dict[str, Any]) -> list[str]:
    runs = [(name, names.get(name, [])) for name in HELD_OUT_RUNS]
    described = labs.get("described", {})
    lines = [
        "Each lab with the defaults (*flips_only*), the augmentation chosen before (*stain_augment_x1*) and "
        "the one chosen now on tuning labs 1-16 (*stain_augment_x0.67*), balanced accuracy (AUC) mean ± sd "
        "over seeds; how the lab stains against lab A: dye amounts, stain vectors' hue turns (degrees), "
        "cast (OD added to R, G, B), JPEG quality of its tiles (— lossless):",
        "",
        "| lab | role | H amount | E amount | H turn | E turn | cast | JPEG | seeds | "
        + " | ".join(f"bal. acc. {name} | AUC {name}" for name, _rows in runs)
        + " |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|" + "---:|" * (2 * len(runs)),
    ]
    roles = [("bundled", lab) for lab in labs.get("bundled", [])[1:]]
    roles += [(role, lab) for role in ("tuning", "held_out", "retired") for lab in labs.get(role, [])]
    for role, lab in roles:
        d = described.get(lab, {})
        cast = ", ".join(f"{c:.3f}" for c in d.get("cast", []))
        quality = d.get("jpeg_quality") or "—"
        cells = [
            mean_sd([r.get(f"{m}_{lab}", np.nan) for r in rows])
            for _name, rows in runs
            for m in ("balanced_accuracy", "auc")
        ]
        seeds = min(sum(f"auc_{lab}" in r for r in rows) for _name, rows in runs)
        lines.append(
            f"| {lab} | {role.replace('_', '-')} | {d.get('h_amount', '')} | {d.get('e_amount', '')} | "
            f"{d.get('h_turn', '')} | {d.get('e_turn', '')} | {cast} | {quality} | {seeds} | "
            + " | ".join(cells)
            + " |"
        )
    return [*lines, ""]


def render_tables(state: dict[str, Any]) -> str:
    """The Markdown tables (mean ± sd over seeds) of every part measured so far."""
    runs, meta = state.get("runs", {}), state.get("meta", {})
    slide_cols = {"auc": "test AUC", "balanced_accuracy": "balanced accuracy", "cell_auc": "map cell AUC"}
    lines = [
        f"Machine: 2-core CPU VM, shared; torch {meta.get('torch')}, Python "
        f"{meta.get('python')}. Commands: "
        + ", ".join(f"`{c}`" for c in state.get("commands", []))
        + f". {meta.get('slides')} (tumour) and {meta.get('subtle_slides')} (subtle) slides of 1024² per set "
        f"(half train, a quarter validation, a quarter test), backbone "
        f"`{meta.get('backbone')}` from random weights; epochs: "
        + ", ".join(
            f"{meta[key]} ({what})"
            for key, what in (
                ("epochs", "tumour MIL"),
                ("image_epochs", "tumour image methods"),
                ("ultramnist_epochs", "UltraMNIST"),
                ("subtle_epochs", "subtle"),
            )
            if key in meta
        )
        + ". "
        "Mean ± sd over the seeds measured; *map cell AUC* is "
        "the AUC of the attention (MIL) or Z-block class-evidence (PatchGD) cells, lesion (> 10 % lesion) "
        "against other tissue cells, averaged over the tumour test slides.",
        "",
        "### Tumour lesions, MIL methods (tiles of 32 px at 1 µm/px, bag 24)",
        "",
        *_table(runs, "tumour_mil", slide_cols),
        f"### Tumour lesions, whole-slide image methods ({meta.get('image_size')}² per slide at 1 µm/px)",
        "",
        *_table(runs, "tumour_image", slide_cols),
        f"### Subtle lesions (enlarged, pale, vesicular nuclei; same density and mean colour; tiles of "
        f"{meta.get('subtle_tile')} px at 0.5 µm/px, bag {meta.get('subtle_bag')}, learning rate "
        f"{SUBTLE_LR}. Controls, tile AUC on the test slides' tiles with labels from the lesion masks: "
        "*tile_labels*, ABMIL-ACC's encoder trained on single tiles for "
        f"{meta.get('tile_label_epochs')} epochs; *frozen_probe*, a logistic regression on the features "
        "of a frozen random encoder of the same backbone, drawn from the run's seed)",
        "",
        *_table(runs, "subtle", {**slide_cols, "tile_auc": "tile AUC"}),
        f"### Teaching by annotation, subtle lesions (ABMIL-ACC, {meta.get('annotated_epochs')} epochs, "
        f"the subtle part's tiles, bag and learning rate; annotations drawn from the lesion masks: "
        f"{LESION_SHARE:.0%} of the training lesions and {NORMAL_SIDE}x{NORMAL_SIDE}-tile squares of "
        "normal tissue on half the training slides, 'Not lesion'; *none*: the same table, "
        "data.instance_weight 0; *attention* / *tiles*: data.instance_loss, weight 1. Epochs until the "
        f"validation AUC (12 slides) reaches {AUC_GOAL} for the first time, and from which it stays at "
        f"{AUC_GOAL} or above to the last epoch: mean ± sd over the seeds that get there, how many do)",
        "",
        *_annotation_table(runs),
        f"### Where to teach next, subtle lesions (ABMIL-ACC from random weights for "
        f"{meta.get('suggest_start_epochs')} epochs without annotations (*start*), then {_retrain(meta)} "
        "(data.instance_weight 1) with k areas of 3 x 3 tiles picked on the start's checkpoint and "
        "answered by an oracle from the lesion masks (the lesion class when at least half the area's tiles "
        "lie in a lesion, 'Not lesion' when none does, skipped otherwise; each arm takes areas in its order "
        "until it has k answers). *suggested*: `bigslide suggest`'s order; *random*: random tissue areas; "
        "*top_attention*: the highest attention relative to its slide's mean. Controls retrained the same "
        "way: *none*, no annotations; *outlines*, the annotations part's outlines of a "
        "quarter of the training lesions and normal squares. Attention cell AUC on the test slides, which "
        "carry no annotations. The strongest place asked: of the places `bigslide suggest` chose for "
        f"their attention, the highest relative to its slide's mean; below {HIGH:g}, it warns that the model "
        "has not learnt where to look)",
        "",
        *_suggest_table(runs),
        *_stain_tables(runs, state.get("stain_labs", {}), meta),
        f"### Studies ({meta.get('study_slides')} slides of 1024² per set, tiles of 32 px at 1 µm/px, bag "
        f"{meta.get('study_bag')}, {meta.get('study_epochs')} epochs; test split, per case for *cases*; "
        "*oracle*: the quantity the outcome was made from, scored on the same test slides)",
        "",
        *_table(
            runs,
            "study",
            {
                "c_index": "C-index",
                "oracle_c_index": "oracle C-index",
                "pearson_r": "Pearson r",
                "oracle_pearson_r": "oracle r",
                "auc": "case AUC",
                "balanced_accuracy": "balanced accuracy",
            },
        ),
        "### UltraMNIST: PatchGD vs GD at equal memory"
        + (
            f" ({meta['canvases']} training canvases, digits of {ULTRAMNIST_DIGITS[0] * meta['canvas']:g}-"
            f"{ULTRAMNIST_DIGITS[1] * meta['canvas']:g} px on {meta['canvas']}², backbone "
            f"`{meta.get('ultramnist_backbone')}`; PatchGD: {ULTRAMNIST_PATCH} px patches, k "
            f"{meta.get('ultramnist_k')}, pool head; validation accuracy, chance 0.1)"
            if "canvases" in meta
            else ""
        ),
        "",
        *_table(runs, "ultramnist", {"accuracy": "accuracy", "qwk": "QWK", "step_mb": "step MB"}),
    ]
    return "\n".join(lines)


def write_docs(state: dict[str, Any], path: Path) -> None:
    """Replace the text between the bench's markers in `path` with freshly rendered tables."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no '{BEGIN}' ... '{END}' markers to write between")
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{render_tables(state)}\n{END}{tail}")
