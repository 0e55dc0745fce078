"""Synthetic study sets: survival, regression and case-level tables that the slide table reads, with
outcomes that follow the lesions actually rendered."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tiffslide
from scipy.stats import pearsonr
from sksurv.metrics import concordance_index_censored

from bigslide.data.table import SlideTable
from bigslide.errors import DataError
from bigslide.synthetic.slide_set import load_lesions
from bigslide.synthetic.study import make_study_set

SIZE = (512, 512)  # the lesion fraction of the tissue does not depend on the slide size


def _rows(csv_path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with csv_path.open() as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def survival_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("survival"), "survival", n=36, seed=0, size=SIZE)


@pytest.fixture(scope="module")
def regression_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("regression"), "regression", n=24, seed=0, size=SIZE)


@pytest.fixture(scope="module")
def cases_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("cases"), "cases", n=18, seed=0, size=SIZE)


def test_survival_table_is_censored_and_the_oracle_ranks_it(survival_csv: Path) -> None:
    columns, rows = _rows(survival_csv)
    assert columns == ["slide", "time", "event", "split", "oracle"]
    table = SlideTable.from_csv(survival_csv, task="survival")
    assert len(table) == 36
    time = np.array([e.time for e in table.entries], dtype=float)
    event = np.array([e.event for e in table.entries]) == 1
    oracle = np.array([float(r["oracle"]) for r in rows])
    assert (time > 0).all()
    assert 0.15 <= 1 - event.mean() <= 0.5
    assert concordance_index_censored(event, time, oracle)[0] > 0.7
    # The risk is the tumour burden: zero exactly on the slides without lesions.
    lesions = load_lesions(survival_csv.parent / "lesions.json")
    assert [o > 0 for o in oracle] == [bool(lesions[r["slide"]]) for r in rows]
    # Stratified by event: every split holds events and the train split about half the slides.
    per_split = Counter((e.split, e.event) for e in table.entries)
    assert all(per_split[(split, 1)] >= 1 for split in ("train", "val", "test"))
    assert 15 <= sum(e.split == "train" for e in table.entries) <= 21


def test_regression_target_follows_the_lesion_fraction(regression_csv: Path) -> None:
    columns, rows = _rows(regression_csv)
    assert columns == ["slide", "target", "split", "oracle"]
    table = SlideTable.from_csv(regression_csv, task="regression")
    target = np.array([e.target for e in table.entries], dtype=float)
    oracle = np.array([float(r["oracle"]) for r in rows])
    assert pearsonr(oracle, target)[0] > 0.9
    assert oracle.min() == 0
    assert 5 < oracle.max() <= 100
    lesions = load_lesions(regression_csv.parent / "lesions.json")
    assert [o > 0 for o in oracle] == [bool(lesions[r["slide"]]) for r in rows]
    assert {e.split for e in table.entries} == {"train", "val", "test"}


def test_cases_hold_one_lesion_slide_per_positive_case(cases_csv: Path) -> None:
    columns, rows = _rows(cases_csv)
    assert columns == ["slide", "label", "case", "split", "oracle"]
    table = SlideTable.from_csv(cases_csv, task="classification")
    assert table.classes == ["normal", "tumor"]
    lesions = load_lesions(cases_csv.parent / "lesions.json")
    cases = table.cases()
    assert len(cases) == 6
    assert all(len(idx) == 3 for idx in cases.values())
    labels: Counter[str] = Counter()
    for idx in cases.values():
        entries = [table.entries[i] for i in idx]
        assert len({e.split for e in entries}) == 1  # a case is never split
        label = entries[0].label
        labels[label] += 1
        with_lesions = [bool(lesions[e.path.name]) for e in entries]
        assert sum(with_lesions) == (1 if label == "tumor" else 0)
        assert [int(rows[i]["oracle"]) for i in idx] == [int(w) for w in with_lesions]
    assert labels == {"tumor": 3, "normal": 3}
    per_split = Counter((table.entries[idx[0]].split, table.entries[idx[0]].label) for idx in cases.values())
    assert per_split[("train", "tumor")] >= 1
    assert per_split[("test", "tumor")] >= 1


def test_slides_are_pyramids_with_mpp(cases_csv: Path) -> None:
    _, rows = _rows(cases_csv)
    with tiffslide.TiffSlide(cases_csv.parent / rows[0]["slide"]) as slide:
        assert slide.dimensions == SIZE
        assert slide.level_count == 3
        assert float(slide.properties["tiffslide.mpp-x"]) == pytest.approx(0.5)


def test_same_seed_same_table_other_seed_other_table(tmp_path: Path) -> None:
    first = make_study_set(tmp_path / "a", "survival", n=8, seed=1, size=SIZE)
    again = make_study_set(tmp_path / "b", "survival", n=8, seed=1, size=SIZE)
    other = make_study_set(tmp_path / "c", "survival", n=8, seed=2, size=SIZE)
    assert first.read_text() == again.read_text()
    assert (tmp_path / "a" / "lesions.json").read_text() == (tmp_path / "b" / "lesions.json").read_text()
    assert first.read_text() != other.read_text()


def test_cached_until_the_settings_change(tmp_path: Path) -> None:
    csv_path = make_study_set(tmp_path, "regression", n=4, seed=0, size=SIZE)
    stamp = csv_path.stat().st_mtime_ns
    assert make_study_set(tmp_path, "regression", n=4, seed=0, size=SIZE) == csv_path
    assert csv_path.stat().st_mtime_ns == stamp
    make_study_set(tmp_path, "regression", n=4, seed=0, size=SIZE, r=0.5)
    assert csv_path.stat().st_mtime_ns != stamp


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="multiple of 3"):
        make_study_set(tmp_path, "cases", n=10, size=SIZE)
    with pytest.raises(DataError, match="kind"):
        make_study_set(tmp_path, "grading", size=SIZE)  # type: ignore[arg-type]
