"""Survival and regression endpoints: the losses against their textbook definitions, ABMIL-ACC exact over a
batch of bags with either survival loss, and the slide table's one-line errors."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bigslide.data.endpoint import Endpoint, fit_endpoint
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine.metrics import endpoint_metrics, survival_metrics
from bigslide.errors import DataError
from bigslide.methods.abmil_acc import accumulated_bag_backward
from bigslide.nn.losses import cox_partial_nll, discrete_time_nll, endpoint_loss, endpoint_outputs
from bigslide.nn.mil import make_aggregator
from bigslide.nn.mil.base import split_head_output


@pytest.fixture(autouse=True)
def _float64() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the exactness checks run in fp64
    yield
    torch.set_default_dtype(previous)


def test_discrete_time_nll_is_the_censored_likelihood_written_out() -> None:
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(6, 4)))
    interval = torch.tensor([0, 1, 3, 2, 0, 3])
    event = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    total = 0.0
    for i in range(6):
        h = 1 / (1 + np.exp(-logits[i].numpy()))
        k = int(interval[i])
        survival_to = np.prod(1 - h[:k])  # S_{k-1}: alive through every earlier interval
        if event[i]:
            total -= math.log(survival_to * h[k])
        else:
            total -= math.log(survival_to * (1 - h[k]))  # S_k
    assert float(discrete_time_nll(logits, interval, event)) == pytest.approx(total / 6, rel=1e-12)


def test_cox_partial_likelihood_is_breslow_written_out_with_ties() -> None:
    risk = torch.tensor([0.3, -1.2, 2.0, 0.5, 0.1])
    time = torch.tensor([5.0, 3.0, 3.0, 8.0, 1.0])  # a tie at 3
    event = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    total, events = 0.0, 0
    for i in range(5):
        if event[i]:
            at_risk = [j for j in range(5) if time[j] >= time[i]]  # ties stay in the risk set
            total -= float(risk[i]) - math.log(sum(math.exp(float(risk[j])) for j in at_risk))
            events += 1
    assert float(cox_partial_nll(risk, time, event)) == pytest.approx(total / events, rel=1e-12)
    assert float(cox_partial_nll(risk, time, torch.zeros(5))) == 0.0


class TileNet(nn.Module):
    """A small per-tile encoder (no BatchNorm): each tile is encoded on its own, as ACC requires."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 10)
        )
        self.dim = 10

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _grads(*modules: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for m in modules for p in m.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize("survival_loss", ["cox", "nll"])
def test_abmil_acc_is_exact_over_a_batch_of_bags_with_survival_losses(survival_loss: str) -> None:
    endpoint = Endpoint(
        "survival", survival_loss=survival_loss, bins=[] if survival_loss == "cox" else [2, 5]
    )
    torch.manual_seed(0)
    encoder = TileNet().double()
    head = make_aggregator("abmil", 10, endpoint.n_outputs, hidden=8, attention_dim=4).double()
    sizes = [5, 3, 7]
    bags = torch.rand(sum(sizes), 3, 8, 8, dtype=torch.float64)
    y = torch.tensor([[4.0, 1.0, 1.0], [1.5, 0.0, 0.0], [6.0, 1.0, 2.0]])

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return endpoint_loss(endpoint, logits, target)

    # The truth: one graph over the whole batch.
    logits = torch.cat([split_head_output(head(encoder(bag)))[0] for bag in bags.split(sizes)])
    truth_loss = loss_fn(logits, y)
    truth_loss.backward()
    truth = _grads(encoder, head)
    for p in [*encoder.parameters(), *head.parameters()]:
        p.grad = None

    step = accumulated_bag_backward(encoder, head, bags, y, loss_fn, chunk_size=2, sizes=sizes)
    assert float(step.loss) == pytest.approx(float(truth_loss.detach()), rel=1e-12)
    assert step.logits.shape == (3, endpoint.n_outputs)
    # relative to the whole gradient: the attention scorer's bias gets ~0 gradient (softmax ignores shifts)
    got, want = (
        torch.cat([g.flatten() for g in _grads(encoder, head)]),
        torch.cat([g.flatten() for g in truth]),
    )
    assert torch.linalg.norm(got - want) <= 1e-10 * torch.linalg.norm(want)


def test_outputs_risk_and_regression_units() -> None:
    survival = Endpoint("survival", bins=[2.0, 5.0])
    logits = torch.tensor([[-3.0, -3.0, -3.0], [3.0, 3.0, 3.0]])
    curves = endpoint_outputs(survival, logits).numpy()
    assert np.all(np.diff(curves, axis=1) < 0)  # S(t) falls with time
    low, high = survival.risk(curves)
    assert high > low  # high hazards: higher risk
    regression = Endpoint("regression", mean=40.0, sd=10.0)
    assert float(endpoint_outputs(regression, torch.tensor([[1.5]]))[0, 0]) == pytest.approx(55.0)
    assert float(endpoint_loss(regression, torch.tensor([[1.5]]), torch.tensor([55.0]))) == pytest.approx(0.0)


def test_fit_endpoint_cuts_intervals_at_training_event_quantiles() -> None:
    entries = [
        SlideEntry(Path(f"s{i}.tif"), "", "train" if i < 8 else "val", time=float(i + 1), event=i % 2)
        for i in range(10)
    ]
    endpoint = fit_endpoint(SlideTable(entries, task="survival"), time_bins=4)
    events = [e.time for e in entries[:8] if e.event == 1]  # 2, 4, 6, 8: validation rows do not count
    assert endpoint.bins == pytest.approx(list(np.quantile(events, [0.25, 0.5, 0.75])))
    assert endpoint.n_outputs == 4
    assert endpoint.target(entries[0]) == (1.0, 0.0, 0.0)
    assert endpoint.target(entries[9]) == (10.0, 1.0, 3.0)


def test_survival_metrics_follow_the_risk_order() -> None:
    rng = np.random.default_rng(1)
    risk = rng.normal(size=80)
    time = rng.exponential(np.exp(-2 * risk))
    event = (rng.random(80) < 0.7).astype(float)
    good = survival_metrics(time, event, risk)
    assert good["c_index"] > 0.75
    assert good["td_auc"] > 0.75
    assert survival_metrics(time, event, -risk)["c_index"] == pytest.approx(1 - good["c_index"])
    y = np.stack([time, event, np.zeros(80)], axis=1)
    cox = Endpoint("survival", survival_loss="cox")
    assert endpoint_metrics(cox, y, risk[:, None])["c_index"] == pytest.approx(good["c_index"])


def _table(tmp_path: Path, header: str, *rows: str) -> Path:
    for name in ("a.tif", "b.tif", "c.tif"):
        (tmp_path / name).write_bytes(b"")
    path = tmp_path / "slides.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    ("task", "header", "rows", "message"),
    [
        ("survival", "slide,time,event", ["a.tif,-3,1"], "row 2: time must be > 0"),
        (
            "survival",
            "slide,time,event",
            ["a.tif,3,1", "b.tif,4,2"],
            "row 3: event must be 1 (observed) or 0",
        ),
        ("survival", "slide,time,event", ["a.tif,soon,1"], "row 2: time must be a number, got 'soon'"),
        ("regression", "slide,target", ["a.tif,1.5", "b.tif,high"], "row 3: target must be a number"),
        ("regression", "slide,target", ["a.tif,nan"], "row 2: target must be a finite number"),
        (
            "survival",
            "slide,time,event,case",
            ["a.tif,3,1,p1", "b.tif,3,0,p1"],
            "row 3: case 'p1' has time 3.0, event 0 here but time 3.0, event 1 at row 2",
        ),
        (
            "survival",
            "slide,label",
            ["a.tif,tumor"],
            "missing column(s) event, time for data.task survival",
        ),
        ("classification", "slide,time,event", ["a.tif,3,1"], "its columns suggest data.task: survival"),
    ],
)
def test_bad_rows_are_one_line_errors_naming_the_row(
    tmp_path: Path, task: str, header: str, rows: list[str], message: str
) -> None:
    with pytest.raises(DataError) as err:
        SlideTable.from_csv(_table(tmp_path, header, *rows), task=task)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_cases_stay_on_one_side_of_the_split(tmp_path: Path) -> None:
    rows = []
    for i in range(24):
        (tmp_path / f"s{i}.tif").write_bytes(b"")
        rows.append(f"s{i}.tif,{'tumor' if (i // 3) % 2 else 'normal'},case{i // 3}")
    path = tmp_path / "slides.csv"
    path.write_text("slide,label,case\n" + "\n".join(rows) + "\n")
    table = SlideTable.from_csv(path).with_splits(seed=3)
    sides: dict[str, set[str | None]] = {}
    for e in table.entries:
        sides.setdefault(e.case_id, set()).add(e.split)
    assert all(len(s) == 1 for s in sides.values())
    assert {next(iter(s)) for s in sides.values()} == {"train", "val"}
    again = SlideTable.from_csv(table.to_csv(tmp_path / "again.csv"))
    assert [(e.case, e.split) for e in again.entries] == [(e.case, e.split) for e in table.entries]


def test_tile_risk_is_the_risk_lost_without_the_tile() -> None:
    torch.manual_seed(1)
    endpoint = Endpoint("survival", bins=[2.0, 5.0])
    head = make_aggregator("abmil", 10, endpoint.n_outputs, hidden=8, attention_dim=4).double()
    z = torch.randn(6, 10)

    def risk(logits: torch.Tensor) -> torch.Tensor:
        return -endpoint_outputs(endpoint, logits).sum(dim=1)

    with torch.no_grad():  # as predict calls it
        shares = head.contributions(z, risk)
        whole = risk(head(z)[0])
        for i in range(6):
            without = risk(head(torch.cat([z[:i], z[i + 1 :]]))[0])
            assert float(shares[i]) == pytest.approx(float(whole - without), rel=1e-9, abs=1e-12)
