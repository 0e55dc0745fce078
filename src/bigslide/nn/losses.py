"""The loss and the outputs of each endpoint (`bigslide.data.endpoint`), on a batch of logits.

Every loss is a mean over the batch. The survival losses couple the items of a batch only through
their logits (Cox compares each event with the batch's risk set), so methods that replay an encoder
(ABMIL-ACC) stay exact: they need only each bag's gradient with respect to its features.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from bigslide.data.endpoint import Endpoint


def endpoint_loss(endpoint: Endpoint | None, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`logits` (B, K) against the batch's targets `y` (as collated from `Endpoint.target`)."""
    if endpoint is None or endpoint.task == "classification":
        return F.cross_entropy(logits, y)
    if endpoint.task == "regression":
        standard = (y.to(logits.dtype) - endpoint.mean) / endpoint.sd
        return F.mse_loss(logits[:, 0], standard)
    y = y.to(logits.dtype).reshape(-1, 3)
    time, event = y[:, 0], y[:, 1]
    if endpoint.survival_loss == "cox":
        return cox_partial_nll(logits[:, 0], time, event)
    return discrete_time_nll(logits, y[:, 2].long(), event)


def endpoint_outputs(endpoint: Endpoint | None, logits: torch.Tensor) -> torch.Tensor:
    """What predictions report per item: class probabilities, the number in the table's units, the
    survival curve S(t_k) (discrete time), or the log-hazard (Cox)."""
    if endpoint is None or endpoint.task == "classification":
        return torch.softmax(logits, dim=-1)
    if endpoint.task == "regression":
        return logits[:, :1] * endpoint.sd + endpoint.mean
    if endpoint.survival_loss == "cox":
        return logits[:, :1]
    return torch.exp(torch.cumsum(F.logsigmoid(-logits), dim=-1))


def discrete_time_nll(logits: torch.Tensor, interval: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of discrete-time hazards h_k = sigmoid(logit_k) with censoring.

    An event in interval k has likelihood S_{k-1} h_k; a time censored in interval k has S_k, with
    S_k = prod_{j <= k} (1 - h_j). Computed in log space (log-sigmoid) for stability.
    """
    log_hazard = F.logsigmoid(logits)
    log_survival = torch.cumsum(F.logsigmoid(-logits), dim=1)  # log S_k
    k = interval.clamp(0, logits.shape[1] - 1).unsqueeze(1)
    before = torch.cat([torch.zeros_like(log_survival[:, :1]), log_survival], dim=1).gather(1, k)
    observed = before + log_hazard.gather(1, k)
    censored = log_survival.gather(1, k)
    return -(event.unsqueeze(1) * observed + (1 - event.unsqueeze(1)) * censored).mean()


def cox_partial_nll(risk: torch.Tensor, time: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """Cox partial likelihood (Breslow ties) over the batch, divided by its number of events.

    Each event i is compared with its risk set {j: t_j >= t_i}. A batch without an event carries no
    information: its loss is 0 (with a zero gradient).
    """
    at_risk = time.unsqueeze(0) >= time.unsqueeze(1)  # [i, j]: j still at risk at t_i
    masked = risk.unsqueeze(0).expand(len(risk), -1).masked_fill(~at_risk, float("-inf"))
    log_risk_set = torch.logsumexp(masked, dim=1)
    events = event.sum()
    # Chosen on the device: a Python `if` on the count would make the host wait for it.
    partial = -((risk - log_risk_set) * event).sum() / events.clamp_min(1)
    return torch.where(events > 0, partial, (risk * 0).sum())


def endpoint_score(endpoint: Endpoint | None, logits: torch.Tensor) -> torch.Tensor:
    """(B,) the one number per item a heatmap explains: the risk (survival) or the standardised value
    (regression). Classes have none (their maps explain a class's logit)."""
    if endpoint is None or endpoint.task == "classification":
        raise ValueError("a classifier's heatmaps explain a class logit, not one score")
    if endpoint.task == "regression" or endpoint.survival_loss == "cox":
        return logits[:, 0]
    return -endpoint_outputs(endpoint, logits).sum(dim=1)
