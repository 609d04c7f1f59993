"""Post-hoc calibration of any predictor: a map fitted on labelled validation member logits, applied to outputs.

One predictor kind, `Calibrated(model, calibration_map)`, wraps any predictor with one of several maps, found by
name in `CALIBRATION_MAPS` and fitted by `fit_calibration(name, member_logits, labels)`:

    name         map                                   acts on                    parameters  reference
    temperature  z_m / T                               each member's logits       1           Guo et al., 2017
    vector       w * z_m + b                           each member's logits       2C          Guo et al., 2017
    dirichlet    W log softmax(z_m) + b, ODIR          each member's log-probs    C^2 + C     Kull et al., 2019
    histogram    per class: frequency of c in p_c's bin  the ensemble probability  C bins    Zadrozny & Elkan, 2001
    isotonic     per class: isotonic fit of [y = c]    the ensemble probability   <= C N      Zadrozny & Elkan, 2002

How a map meets an ensemble of M members. The logit maps (temperature, vector, dirichlet) are one map shared by
all members, applied to each member's logits before their softmaxes are averaged, and fitted by the NLL of that
average: the output keeps its M members, so mutual information and disagreement survive, and for M = 1 each is
the published method. One shared map rather than one per member: the members are exchangeable (same classes,
same training data), M maps would need M times the validation data, and vector scaling with w = 1/T, b = 0 is then
exactly temperature scaling. The probability maps (histogram, isotonic) calibrate each class's probability
one-vs-rest, and a class probability of the ensemble is only the mean of its members': they map the ensemble
probability, renormalise it to sum to 1, and return its log as the logits of one member (B, 1, C). A calibrated
ensemble of M > 1 members then has M = 1: its mutual information and disagreement are 0 (its model uncertainty is
lost), which `evaluate --score mutual_information` will show.

Shapes: N validation inputs, B inputs, M members, C classes. Fitting and the maps run in float64 (temperature
divides in the logits' own dtype, as it always has); outputs have the dtype of the logits they are given.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..io import PREDICTOR_FILE
from ..metrics._checks import check_labels
from ..metrics.ece import bin_index
from ..metrics.nll import NLL_FLOOR
from ..outputs import PredictorOutput, member_logits_of
from ..uncertainty import ensemble_probs
from .load import PREDICTOR_KINDS, ModelWrapper, describe_saved, num_members, register_predictor

PROBABILITY_FLOOR = 1e-6  # a probability map's per-class value before renormalising: a class it maps to 0 (no
# validation example of it in that bin or range) still costs a finite NLL on test data


class CalibrationMap(ABC):
    """A map from member logits (B, M, C) to calibrated member logits, fitted on validation data.

    `on_members`: True when it maps each member's logits (the output keeps M members); False when it maps the
    ensemble probability (the output has M = 1). `state()` is JSON and `from_state(state())` is an equal map.
    """

    name: ClassVar[str]
    described: ClassVar[str]  # what a saved predictor says it is, e.g. "temperature-scaled"
    on_members: ClassVar[bool]
    per_class: ClassVar[bool] = True  # fitted class by class (indexed by class): only for the classes it saw

    @classmethod
    @abstractmethod
    def fit(cls, member_logits: Tensor, labels: Tensor) -> CalibrationMap:
        """The map fitted on validation member logits (N, M, C) and labels (N,)."""

    @abstractmethod
    def apply(self, member_logits: Tensor) -> Tensor:
        """(B, M, C) -> (B, M, C) when `on_members`, else (B, 1, C) log-probabilities."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """The fitted parameters as JSON values."""

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CalibrationMap:
        return cls(**{key: _from_json(value) for key, value in state.items()})

    @abstractmethod
    def summary(self) -> dict[str, float]:
        """A few numbers that say what was fitted (printed and recorded by `hydra-ens calibrate`)."""


# ---------------------------------------------------------------------------------------------- logit maps


def fit_temperature(member_logits: Tensor, labels: Tensor, max_iter: int = 100) -> float:
    """The T > 0 minimising the NLL of mean_m softmax(z_m / T) on held-out data, by L-BFGS on log T.

    One temperature for all members, applied before their probabilities are averaged, so it also calibrates a
    Hydra Ensemble. Shape: member_logits (N, M, C), labels (N,). Returns T (T > 1 softens, T < 1 sharpens).
    """
    logits, labels = _validation(member_logits, labels, "temperature scaling")
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    _minimise_nll([log_t], lambda: logits / log_t.exp(), labels, "temperature", lr=0.1, max_iter=max_iter)
    temperature = float(log_t.detach().exp())
    with torch.no_grad():
        everywhere_right = (logits.argmax(dim=-1) == labels[:, None]).all()  # warned of already
        fitted, sharper = (ensemble_nll(logits / t, labels).item() for t in (temperature, temperature / 2))
    if not everywhere_right and sharper <= fitted + 1e-9:
        # every example has a member confidently right, or the wrong ones sit at the NLL's floor and cost the same
        # at any T: the NLL falls (or stays) as T -> 0, no minimum
        floored = int((ensemble_probs(logits / temperature).gather(1, labels[:, None]) < NLL_FLOOR).sum())
        why = (
            f"{floored} held-out example(s) are wrong beyond the NLL's floor (a probability under {NLL_FLOOR:.3g}, "
            "36 nats), so they cost the same at any temperature, and every other one has a member confidently right"
            if floored
            else "some member is confidently right on every held-out example"
        )
        warnings.warn(
            f"the held-out NLL still falls as the temperature sharpens (T = {temperature:.3g}: {fitted:.6f}, at "
            f"T / 2: {sharper:.6f}), so T is only where the optimiser stopped: {why}. Fit it on a larger or harder "
            "held-out set.",
            stacklevel=2,
        )
    return temperature


@dataclass
class TemperatureScaling(CalibrationMap):
    """z_m / T for every member m (Guo et al., 2017): changes the confidence, never a member's predicted class."""

    temperature: float
    name: ClassVar[str] = "temperature"
    described: ClassVar[str] = "temperature-scaled"
    per_class: ClassVar[bool] = False
    on_members: ClassVar[bool] = True

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")

    @classmethod
    def fit(cls, member_logits: Tensor, labels: Tensor, max_iter: int = 100) -> TemperatureScaling:
        return cls(fit_temperature(member_logits, labels, max_iter))

    def apply(self, member_logits: Tensor) -> Tensor:
        return member_logits / self.temperature

    def state(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def summary(self) -> dict[str, float]:
        return {"temperature": self.temperature}


@dataclass(eq=False)  # tensors: no field-wise ==
class VectorScaling(CalibrationMap):
    """w * z_m + b for every member m, with a scale w_c and a bias b_c per class (Guo et al., 2017, §4.2).

    scale, bias: (C,). Unit scales and zero biases are the identity; w = 1/T, b = 0 is temperature scaling. The
    biases can change the predicted class. Fitted by L-BFGS on the validation NLL of the ensemble, unregularised
    (2C parameters).
    """

    scale: Tensor
    bias: Tensor
    name: ClassVar[str] = "vector"
    described: ClassVar[str] = "vector-scaled"
    on_members: ClassVar[bool] = True

    @classmethod
    def fit(cls, member_logits: Tensor, labels: Tensor, max_iter: int = 300) -> VectorScaling:
        logits, labels = _validation(member_logits, labels, "vector scaling")
        classes = logits.shape[-1]
        missing = sorted(set(range(classes)) - set(labels.tolist()))
        if missing:  # unregularised: lowering an absent class's bias lowers the NLL without limit
            warnings.warn(
                f"class(es) {missing[:5]} never appear in the held-out labels, so vector scaling drives their bias "
                "down without limit (they would hardly ever be predicted): fit it on held-out data with every "
                "class, or use temperature scaling.",
                stacklevel=2,
            )
        scale = torch.ones(classes, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
        _minimise_nll([scale, bias], lambda: logits * scale + bias, labels, "vector scaling", max_iter=max_iter)
        return cls(scale.detach(), bias.detach())

    def apply(self, member_logits: Tensor) -> Tensor:
        scale, bias = (t.to(member_logits.device) for t in (self.scale, self.bias))
        return (member_logits.double() * scale + bias).to(member_logits.dtype)

    def state(self) -> dict[str, Any]:
        return {"scale": self.scale.tolist(), "bias": self.bias.tolist()}

    def summary(self) -> dict[str, float]:
        return {
            "scale_min": self.scale.min().item(),
            "scale_max": self.scale.max().item(),
            "bias_abs_max": self.bias.abs().max().item(),
        }


@dataclass(eq=False)  # tensors: no field-wise ==
class DirichletScaling(CalibrationMap):
    """W log softmax(z_m) + b for every member m: Dirichlet calibration (Kull et al., 2019, "Beyond temperature
    scaling"), i.e. matrix scaling of each member's log-probabilities.

    weights: (C, C); bias: (C,). The identity matrix and zero bias give back each member's probabilities. Fitted
    by L-BFGS on the validation NLL of the ensemble plus ODIR, Kull et al.'s Off-Diagonal and Intercept
    Regularisation: off_diagonal * sum_{i != j} W_ij^2 / (C (C - 1)) + intercept * sum_j b_j^2 / C. The diagonal is
    free (a temperature per class); the C^2 - C cross-class terms and the biases are pulled to 0, without which C^2
    parameters overfit a validation set of ordinary size. Kull et al. pick both strengths by cross-validation; the
    defaults (0.01) are a middle of their grid, to be raised for small validation sets or many classes.
    """

    weights: Tensor
    bias: Tensor
    off_diagonal: float = 0.01
    intercept: float = 0.01
    name: ClassVar[str] = "dirichlet"
    described: ClassVar[str] = "Dirichlet-calibrated"
    on_members: ClassVar[bool] = True

    @classmethod
    def fit(
        cls, member_logits: Tensor, labels: Tensor, off_diagonal: float = 0.01, intercept: float = 0.01,
        max_iter: int = 300,
    ) -> DirichletScaling:  # fmt: skip
        logits, labels = _validation(member_logits, labels, "Dirichlet calibration")
        log_probs, classes = logits.log_softmax(dim=-1), logits.shape[-1]  # (N, M, C)
        weights = torch.eye(classes, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
        off = 1 - torch.eye(classes, dtype=torch.float64)

        def odir() -> Tensor:
            off_diagonal_mean = (weights * off).pow(2).sum() / (classes * (classes - 1))
            return off_diagonal * off_diagonal_mean + intercept * bias.pow(2).mean()

        def calibrated() -> Tensor:
            return log_probs @ weights.T + bias

        _minimise_nll([weights, bias], calibrated, labels, "Dirichlet calibration", odir, max_iter=max_iter)
        return cls(weights.detach(), bias.detach(), off_diagonal, intercept)

    def apply(self, member_logits: Tensor) -> Tensor:
        weights, bias = (t.to(member_logits.device) for t in (self.weights, self.bias))
        return (member_logits.double().log_softmax(dim=-1) @ weights.T + bias).to(member_logits.dtype)

    def state(self) -> dict[str, Any]:
        return {
            "weights": self.weights.tolist(),
            "bias": self.bias.tolist(),
            "off_diagonal": self.off_diagonal,
            "intercept": self.intercept,
        }

    def summary(self) -> dict[str, float]:
        off = ~torch.eye(len(self.bias), dtype=torch.bool)
        return {
            "diagonal_mean": self.weights.diagonal().mean().item(),
            "off_diagonal_rms": self.weights[off].pow(2).mean().sqrt().item(),
            "bias_abs_max": self.bias.abs().max().item(),
        }


def _minimise_nll(
    params: list[Tensor],
    calibrated: Callable[[], Tensor],
    labels: Tensor,
    method: str,
    penalty: Callable[[], Tensor] | None = None,
    lr: float = 1.0,
    max_iter: int = 300,
) -> None:
    """Fit `params` in place by L-BFGS on the ensemble NLL of `calibrated()` (N, M, C) (+ `penalty()`)."""
    with torch.no_grad():
        start = calibrated()
    if (start.argmax(dim=-1) == labels[:, None]).all():
        # every member ranks the true class first everywhere: the NLL falls without limit as the map sharpens
        warnings.warn(
            f"every member classifies all {len(labels)} held-out examples correctly, so their NLL has no minimum: "
            f"the fitted {method} is only where the optimiser stopped, and sharpens without limit. Fit it on a "
            "larger or harder held-out set.",
            stacklevel=3,
        )
    optimizer = torch.optim.LBFGS(params, lr=lr, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = ensemble_nll(calibrated(), labels) + (penalty() if penalty else 0)
        loss.backward()
        return loss

    optimizer.step(closure)


def ensemble_nll(member_logits: Tensor, labels: Tensor) -> Tensor:
    """-mean_n log max((1/M) sum_m softmax(z_nm)_{y_n}, NLL_FLOOR): the NLL every table reports
    (`metrics.nll`), from log-probabilities so that it stays differentiable where a probability underflows. An
    unfloored fit charged a confidently wrong example past 36 nats and could raise the reported NLL.
    member_logits (N, M, C), labels (N,) -> a scalar."""
    log_probs = member_logits.log_softmax(dim=-1)
    index = labels[:, None, None].expand(-1, log_probs.shape[1], 1)
    true = log_probs.gather(2, index)[..., 0]  # (N, M)
    return -(true.logsumexp(dim=1) - math.log(log_probs.shape[1])).clamp_min(math.log(NLL_FLOOR)).mean()


# ---------------------------------------------------------------------------------------- probability maps


class ProbabilityMap(CalibrationMap):
    """A one-vs-rest map of each class's ensemble probability: the values are floored at `PROBABILITY_FLOOR`,
    renormalised to sum to 1, and returned as the log-probabilities of one member (B, 1, C): the members' model
    uncertainty (mutual information, disagreement) is lost."""

    on_members: ClassVar[bool] = False

    @abstractmethod
    def one_vs_rest(self, probs: Tensor) -> Tensor:
        """Each class's calibrated probability before renormalising: probs (B, C) float64 -> (B, C)."""

    def apply(self, member_logits: Tensor) -> Tensor:
        values = self.one_vs_rest(ensemble_probs(member_logits.double())).clamp_min(PROBABILITY_FLOOR)
        probs = values / values.sum(dim=-1, keepdim=True)  # (B, C)
        return probs.log()[:, None].to(member_logits.dtype)  # (B, 1, C)


@dataclass(eq=False)  # tensors: no field-wise ==
class HistogramBinning(ProbabilityMap):
    """Histogram binning (Zadrozny & Elkan, 2001), one-vs-rest then renormalised: class c's probability is
    replaced by the fraction of validation inputs of class c among those whose p_c fell in the same bin.

    bin_values: (C, bins). Bins are equal-width on [0, 1], bin b = [b/bins, (b+1)/bins) (the last also holds 1), as
    in `metrics.ece`; a bin no validation input fell in keeps its midpoint (no evidence: trust the model).
    """

    bin_values: Tensor
    name: ClassVar[str] = "histogram"
    described: ClassVar[str] = "histogram-binned"

    @classmethod
    def fit(cls, member_logits: Tensor, labels: Tensor, bins: int = 15) -> HistogramBinning:
        logits, labels = _validation(member_logits, labels, "histogram binning")
        probs, classes = ensemble_probs(logits), logits.shape[-1]  # (N, C)
        index = bin_index(probs, bins).T  # (C, N)
        is_class = (labels[:, None] == torch.arange(classes)).double().T  # (C, N)
        counts = torch.zeros(classes, bins, dtype=torch.float64).scatter_add_(1, index, torch.ones_like(is_class))
        hits = torch.zeros(classes, bins, dtype=torch.float64).scatter_add_(1, index, is_class)
        midpoints = ((torch.arange(bins, dtype=torch.float64) + 0.5) / bins).expand(classes, bins)
        return cls(torch.where(counts > 0, hits / counts.clamp_min(1), midpoints))

    def one_vs_rest(self, probs: Tensor) -> Tensor:
        values = self.bin_values.to(probs.device)
        return values[torch.arange(len(values), device=probs.device), bin_index(probs, values.shape[1])]

    def state(self) -> dict[str, Any]:
        return {"bin_values": self.bin_values.tolist()}

    def summary(self) -> dict[str, float]:
        return {"bins": float(self.bin_values.shape[1])}


@dataclass(eq=False)  # tensors: no field-wise ==
class IsotonicCalibration(ProbabilityMap):
    """Isotonic regression (Zadrozny & Elkan, 2002), one-vs-rest then renormalised: class c's probability is
    replaced by the non-decreasing function of p_c that best fits (least squares) the indicator [y = c] on the
    validation data, fitted by scikit-learn's `IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip")`.

    knots, values: per class, the fitted function's breakpoints (its `X_thresholds_`, increasing) and values
    (`y_thresholds_`); it is linear between them and constant beyond, as scikit-learn predicts, and is evaluated
    here in torch so that a saved map needs no pickle and runs on any device.
    """

    knots: list[Tensor]
    values: list[Tensor]
    name: ClassVar[str] = "isotonic"
    described: ClassVar[str] = "isotonic-calibrated"

    @classmethod
    def fit(cls, member_logits: Tensor, labels: Tensor) -> IsotonicCalibration:
        logits, labels = _validation(member_logits, labels, "isotonic regression")
        IsotonicRegression = _isotonic_regression()
        probs = ensemble_probs(logits).numpy()  # (N, C)
        fits = [
            IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(probs[:, c], (labels == c).double().numpy())
            for c in range(probs.shape[1])
        ]
        return cls([torch.from_numpy(f.X_thresholds_) for f in fits], [torch.from_numpy(f.y_thresholds_) for f in fits])

    def one_vs_rest(self, probs: Tensor) -> Tensor:
        columns = [
            _interpolate(probs[:, c], knots.to(probs.device), values.to(probs.device))
            for c, (knots, values) in enumerate(zip(self.knots, self.values, strict=True))
        ]
        return torch.stack(columns, dim=1)

    def state(self) -> dict[str, Any]:
        return {"knots": [k.tolist() for k in self.knots], "values": [v.tolist() for v in self.values]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> IsotonicCalibration:
        return cls(*([_from_json(row) for row in state[key]] for key in ("knots", "values")))

    def summary(self) -> dict[str, float]:
        return {"knots_per_class": sum(len(k) for k in self.knots) / len(self.knots)}


def _isotonic_regression() -> type:
    """scikit-learn's IsotonicRegression, imported when fitting only: a saved isotonic map applies without it, and
    importing it would cost every command a second."""
    try:
        from sklearn.isotonic import IsotonicRegression
    except ImportError:
        raise ValueError(
            "isotonic calibration is fitted with scikit-learn, which is not installed: `pip install "
            "scikit-learn==1.9.1` (or the [data] extra), or choose another --method."
        ) from None
    return IsotonicRegression


def _interpolate(x: Tensor, knots: Tensor, values: Tensor) -> Tensor:
    """Piecewise-linear through (knots, values), constant beyond the ends, in the arithmetic of scipy's
    `interp1d` that scikit-learn's `IsotonicRegression.predict` uses. x (B,); knots, values (K,) -> (B,)."""
    if len(knots) == 1:
        return values.expand_as(x)
    x = x.clamp(knots[0], knots[-1])
    high = torch.searchsorted(knots, x).clamp(1, len(knots) - 1)
    low = high - 1
    slope = (values[high] - values[low]) / (knots[high] - knots[low])
    return slope * (x - knots[low]) + values[low]


# ---------------------------------------------------------------------------------- registry and predictor

CALIBRATION_MAPS: dict[str, type[CalibrationMap]] = {
    cls.name: cls
    for cls in (TemperatureScaling, VectorScaling, DirichletScaling, HistogramBinning, IsotonicCalibration)
}


def calibration_map_class(method: str) -> type[CalibrationMap]:
    """The map registered as `method`."""
    if method not in CALIBRATION_MAPS:
        raise ValueError(
            f"unknown calibration method {method!r}; known: {sorted(CALIBRATION_MAPS)} (add one to CALIBRATION_MAPS)."
        )
    return CALIBRATION_MAPS[method]


def fit_calibration(method: str, member_logits: Tensor, labels: Tensor) -> CalibrationMap:
    """The `method` map fitted on validation member logits (N, M, C) and labels (N,), with its defaults."""
    return calibration_map_class(method).fit(member_logits, labels)


@register_predictor
class Calibrated(ModelWrapper):
    """Any predictor with a calibration map applied to its member logits. Returns member_logits (B, M, C) for a
    logit map, (B, 1, C) log-probabilities for a probability map (see the module docstring)."""

    kind = "calibrated"

    def __init__(self, model: nn.Module, calibration_map: CalibrationMap):
        super().__init__(model)
        self.calibration_map = calibration_map

    @property
    def num_members(self) -> int:
        return num_members(self.model) if self.calibration_map.on_members else 1

    @property
    def fitted_to_classes(self) -> bool:
        return self.calibration_map.per_class

    def forward(self, **inputs) -> PredictorOutput:
        return PredictorOutput(member_logits=self.calibration_map.apply(member_logits_of(self.model(**inputs))))

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """model/ (the predictor it calibrates) and predictor.json (kind, map name, map state), atomically."""
        return self.save_wrapped(path, {"map": self.calibration_map.name, "state": self.calibration_map.state()})

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> Calibrated:
        model, record = cls.load_wrapped(path)
        record = _upgraded(record)
        calibration_map = calibration_map_class(record["map"]).from_state(record["state"])
        return cls(model, calibration_map).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        return f"{describe_saved(path / 'model')}, {calibration_map_class(_saved_record(path)['map']).described}"


def _saved_record(path: Path) -> dict:
    """predictor.json of a calibrated predictor; the format written before there were several maps,
    {"kind": "temperature", "temperature": T}, read as the temperature map (saved predictors keep loading)."""
    return _upgraded(json.loads((path / PREDICTOR_FILE).read_text()))


def _upgraded(record: dict) -> dict:
    """A calibrated predictor's record in the current format (see `_saved_record`)."""
    if record["kind"] == EARLIER_KIND:
        return {"kind": Calibrated.kind, "map": "temperature", "state": {"temperature": record["temperature"]}}
    return record


EARLIER_KIND = "temperature"
PREDICTOR_KINDS[EARLIER_KIND] = Calibrated  # load_predictor finds the earlier format by its kind


def calibrate(model: nn.Module, member_logits: Tensor, labels: Tensor, method: str = "temperature") -> Calibrated:
    """`model` calibrated by the `method` map fitted on its validation member logits (N, M, C) and labels (N,)."""
    return Calibrated(model, fit_calibration(method, member_logits, labels))


def _validation(member_logits: Tensor, labels: Tensor, method: str) -> tuple[Tensor, Tensor]:
    """Checked float64 member logits (N, M, C) and long labels (N,), detached."""
    if len(labels) == 0:
        raise ValueError(f"{method} needs held-out examples; got none.")
    if member_logits.dim() != 3 or labels.dim() != 1 or member_logits.shape[0] != len(labels):
        raise ValueError(
            f"{method} takes member logits (N, M, C) and labels (N,); got {tuple(member_logits.shape)} and "
            f"{tuple(labels.shape)}."
        )
    if member_logits.shape[-1] < 2:
        raise ValueError(f"{method} needs at least 2 classes; got {member_logits.shape[-1]}.")
    check_labels(labels, member_logits.shape[-1], method)  # histogram/isotonic read a label >= C as no class
    return member_logits.detach().double().cpu(), labels.detach().long().cpu()


def _from_json(value: Any) -> Any:
    """A JSON list back as a float64 tensor; numbers as they are."""
    return torch.tensor(value, dtype=torch.float64) if isinstance(value, list) else value
