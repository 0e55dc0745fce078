"""Cross-validation: folds by case (stratified, fixed test set), and `bigslide cv` end to end with resume."""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest

from bigslide.cli.main import main
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine.config import TrainConfig
from bigslide.engine.cv import cross_validate, make_folds, one_class_splits, prepare_folds, summary_rows
from bigslide.engine.events import Loss, Message
from bigslide.engine.loop import RunResult
from bigslide.errors import ConfigError, DataError
from bigslide.synthetic.slide_set import make_slide_set


def classification_table(n_cases: int = 20) -> SlideTable:
    """Cases of 1 to 3 slides, a third of them tumour."""
    entries = []
    for c in range(n_cases):
        label = "tumor" if c % 3 == 0 else "normal"
        entries += [SlideEntry(Path(f"/s/{c}_{j}.svs"), label, case=f"p{c}") for j in range(1 + c % 3)]
    return SlideTable(entries)


def survival_table(n_cases: int = 12) -> SlideTable:
    entries = [
        SlideEntry(Path(f"/s/{c}.svs"), "", case=f"p{c}", time=1.0 + c, event=int(c < 4))
        for c in range(n_cases)
    ]
    return SlideTable(entries, task="survival")


def case_splits(fold: SlideTable) -> dict[str, str]:
    """The split of each case, checking that a case's slides share it."""
    out: dict[str, str] = {}
    for case, rows in fold.cases().items():
        splits = {fold.entries[i].split for i in rows}
        assert len(splits) == 1, f"case {case} is split across {splits}"
        out[case] = splits.pop() or ""
    return out


def held_out_once(folds: list[SlideTable], split: str) -> Counter[str]:
    return Counter(c for fold in folds for c, s in case_splits(fold).items() if s == split)


def test_classification_folds_hold_out_each_case_once_and_keep_cases_whole() -> None:
    table = classification_table()
    folds = make_folds(table, 4, seed=0)
    assert len(folds) == 4
    assert held_out_once(folds, "test") == Counter(dict.fromkeys(table.cases(), 1))
    for fold in folds:
        assert [e.path for e in fold.entries] == [e.path for e in table.entries]
        splits = case_splits(fold)
        assert set(splits.values()) == {"train", "val", "test"}
        # 7 of 20 cases are tumour: stratified, each fold's 5 held-out cases hold some of both
        tested = {fold.entries[rows[0]].label for c, rows in fold.cases().items() if splits[c] == "test"}
        assert tested == {"tumor", "normal"}
    assert [f.entries for f in make_folds(table, 4, seed=0)] == [f.entries for f in folds]
    assert [f.entries for f in make_folds(table, 4, seed=1)] != [f.entries for f in folds]


def test_survival_folds_are_stratified_by_event() -> None:
    table = survival_table()
    folds = make_folds(table, 4, seed=3)
    assert held_out_once(folds, "test") == Counter(dict.fromkeys(table.cases(), 1))
    for fold in folds:
        events = [e.event for e in fold.entries if e.split == "test"]
        assert sorted(events) == [0, 0, 1]  # 4 events and 8 censored cases over 4 folds


def test_a_fixed_test_split_stays_and_the_held_out_cases_validate() -> None:
    table = classification_table(12)
    fixed = {"p0", "p5"}
    for e in table.entries:
        e.split = "test" if e.case in fixed else ("val" if e.case == "p1" else None)
    folds = make_folds(table, 3, seed=0)
    rest = [c for c in table.cases() if c not in fixed]
    assert held_out_once(folds, "val") == Counter(dict.fromkeys(rest, 1))
    for fold in folds:
        splits = case_splits(fold)
        assert {c for c, s in splits.items() if s == "test"} == fixed
        assert set(splits.values()) == {"train", "val", "test"}


def test_small_strata_and_regression_still_give_case_folds() -> None:
    table = classification_table(9)
    table.entries[0].label = "rare"  # one case of its class: too few to stratify by
    table = SlideTable(table.entries)
    folds = make_folds(table, 3, seed=0)
    assert held_out_once(folds, "test") == Counter(dict.fromkeys(table.cases(), 1))
    regression = SlideTable(
        [SlideEntry(Path(f"/s/{i}.svs"), "", target=float(i)) for i in range(6)], task="regression"
    )
    folds = make_folds(regression, 3, seed=0)
    assert held_out_once(folds, "test") == Counter({str(e.path): 1 for e in regression.entries})


def test_a_fold_validating_on_one_class_says_why_its_auc_is_missing() -> None:
    """Three cases of a class over five folds leave some folds' validation without it: val_auc was NaN
    without a word."""
    table = classification_table(9)
    said = [one_class_splits(fold) for fold in make_folds(table, 5, seed=0)]
    assert any(said)
    for fold, words in zip(make_folds(table, 5, seed=0), said):
        for split in ("val", "test"):
            one = len({e.label for e in fold.subset(split).entries}) == 1
            assert one == any(w.startswith(f"its {split} slides are all") for w in words)
    assert one_class_splits(make_folds(classification_table(30), 3, seed=0)[0]) == []


def test_bad_fold_requests_are_one_line_errors() -> None:
    table = classification_table(4)
    with pytest.raises(ConfigError, match=r"^folds: need at least 2 folds, got 1$"):
        make_folds(table, 1, seed=0)
    with pytest.raises(DataError, match=r"^folds: 5 folds need at least 5 cases, the slide table has 4"):
        make_folds(table, 5, seed=0)
    table.entries[0].split = "test"  # case p0 has one slide: a fixed test case
    with pytest.raises(DataError, match=r"at least 4 cases outside the fixed test split, .* has 3"):
        make_folds(table, 4, seed=0)
    table.entries[1].split = "test"  # p1 has two slides: only one of them in the test split
    with pytest.raises(DataError, match="case 'p1' has slides in the test split and outside it"):
        make_folds(table, 2, seed=0)


def test_summary_has_mean_and_sample_sd_ignoring_nan() -> None:
    def result(val: float, test: float) -> RunResult:
        history = [{"epoch": 0, "val": {"auc": 0.0}}, {"epoch": 1, "val": {"auc": val}}]
        return RunResult(Path("."), None, history, test={"auc": test})

    rows = summary_rows([result(0.5, 0.6), result(math.nan, 0.8), result(0.7, 1.0)])
    assert [r["fold"] for r in rows] == [1, 2, 3, "mean", "sd"]
    assert rows[3]["val_auc"] == pytest.approx(0.6)
    assert rows[4]["val_auc"] == pytest.approx(0.02**0.5)
    assert rows[3]["test_auc"] == pytest.approx(0.8)
    assert rows[4]["test_auc"] == pytest.approx(0.2)


# -- end to end ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cv_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 9-slide table with two 2-slide cases and a config that trains a fold in about 3 s on a CPU."""
    folder = tmp_path_factory.mktemp("cv")
    slides = make_slide_set(folder / "slides", n_slides=9, size=(512, 512), seed=5)
    with slides.open(newline="") as f:
        rows = list(csv.DictReader(f))
    table = folder / "table.csv"
    lines = [f"slides/{r['slide']},{r['label']},c{i // 2 if i < 4 else i}" for i, r in enumerate(rows)]
    table.write_text("slide,label,case\n" + "\n".join(lines) + "\n")
    config = folder / "config.yaml"
    config.write_text(
        f"data: {{csv: {table}, tile_size: 32, bag_size: 4, workers: 0}}\n"
        "model: {backbone: test_resnet}\n"
        "method: {name: abmil_acc, params: {chunk_size: 4}}\n"
        "optim: {epochs: 1}\n"
        "run: {device: cpu, tensorboard: false}\n"
    )
    return config


def cv_cli(config: Path, out: Path, *extra: str) -> int:
    return main(["cv", str(config), "--folds", "3", "--out", str(out), *extra])


def read_summary(out: Path) -> list[dict[str, str]]:
    with (out / "summary.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def mtimes(out: Path) -> dict[str, int]:
    return {
        p.parent.parent.name: p.stat().st_mtime_ns for p in sorted(out.glob("fold_*/checkpoints/last.pt"))
    }


def starts(event: object, text: str) -> bool:
    return isinstance(event, Message) and event.text.startswith(text)


@pytest.mark.slow
def test_cv_from_the_command_line_trains_each_fold_once_and_resumes(
    cv_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cv"
    assert cv_cli(cv_config, out, "--quiet") == 0
    assert sorted(p.name for p in out.glob("fold_*")) == ["fold_1", "fold_2", "fold_3"]
    tested: Counter[str] = Counter()
    for i in (1, 2, 3):
        fold = out / f"fold_{i}"
        with (fold / "split.csv").open(newline="") as f:
            split = list(csv.DictReader(f))
        assert list(split[0]) == ["slide", "case", "split"]
        tested.update({r["case"] for r in split if r["split"] == "test"})
        table = SlideTable.from_csv(fold / "table.csv")
        assert [e.split for e in table.entries] == [r["split"] for r in split]
        assert json.loads((fold / "done.json").read_text())["fold"] == i
        assert (fold / "checkpoints" / "last.pt").is_file()
    assert tested == Counter(dict.fromkeys(["c0", "c1", "c4", "c5", "c6", "c7", "c8"], 1))
    summary = read_summary(out)
    assert [r["fold"] for r in summary] == ["1", "2", "3", "mean", "sd"]
    assert "val_accuracy" in summary[0]
    # needs the engine's test-split evaluation (RunResult.test)
    assert "test_accuracy" in summary[0]
    accuracy = [float(r["test_accuracy"]) for r in summary[:3]]
    assert float(summary[3]["test_accuracy"]) == pytest.approx(sum(accuracy) / 3, abs=1e-5)
    first = mtimes(out)
    assert len(first) == 3

    # Stopped in fold 3 after a finished fold 2 lost its done marker: fold 2 is scored again from
    # its checkpoint without a step, fold 3 saves its steps so far.
    (out / "fold_2" / "done.json").unlink()
    shutil.rmtree(out / "fold_3")
    config = TrainConfig.from_yaml(cv_config)
    config.run.out_dir = str(out)
    gen = cross_validate(config, 3)
    seen: list[object] = []
    for event in gen:
        seen.append(event)
        if isinstance(event, Loss) and any(starts(e, "fold 3/3") for e in seen):
            break
    gen.close()
    fold_2 = seen[next(i for i, e in enumerate(seen) if starts(e, "fold 2/3")) :]
    fold_2 = fold_2[: next(i for i, e in enumerate(fold_2) if starts(e, "fold 3/3"))]
    assert fold_2
    assert not any(isinstance(e, Loss) for e in fold_2)
    assert (out / "fold_2" / "done.json").is_file()
    assert (out / "fold_3" / "checkpoints" / "last.pt").is_file()
    assert not (out / "fold_3" / "done.json").exists()

    capsys.readouterr()
    assert cv_cli(cv_config, out) == 0
    printed = capsys.readouterr().out
    assert f"resumed from {out / 'fold_3' / 'checkpoints' / 'last.pt'}" in printed
    assert "fold 1/3: finished before" in printed
    assert "fold 2/3: finished before" in printed
    again = mtimes(out)
    assert {k: again[k] for k in ("fold_1", "fold_2")} == {k: first[k] for k in ("fold_1", "fold_2")}
    assert (out / "fold_3" / "done.json").is_file()
    assert [r["fold"] for r in read_summary(out)] == ["1", "2", "3", "mean", "sd"]


def test_other_folds_or_settings_in_the_same_folder_are_refused(
    cv_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cv"
    config = TrainConfig.from_yaml(cv_config)
    config.run.out_dir = str(out)
    folds = prepare_folds(config, 3)
    assert [f.out_dir for f in folds] == [out / f"fold_{i}" for i in (1, 2, 3)]
    assert prepare_folds(config, 3)[0].table.entries == folds[0].table.entries  # same folds: accepted

    # a finished fold 1 (its config and done marker are all that is read here)
    folds[0].config.to_yaml(folds[0].out_dir / "config.yaml")
    folds[0].done_path.write_text("{}")
    code = cv_cli(cv_config, out, "--epochs", "2")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    assert "fold 1 was trained with other settings (optim.epochs: 1 then, 2 now)" in err

    code = cv_cli(cv_config, out, "--set", "run.seed=7")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    assert "fold_1/split.csv: the folds differ from those this folder was made with" in err

    code = cv_cli(cv_config, out, "--folds", "4")
    assert code == 2
    assert "fold_1/split.csv: the folds differ" in capsys.readouterr().err
    assert not (out / "fold_4").exists()  # refused before anything was written
