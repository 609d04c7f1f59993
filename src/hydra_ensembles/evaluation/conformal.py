"""Split conformal prediction sets from any predictor's ensemble probabilities p = mean_m softmax(z_m).

A score s(x, y) says how badly class y conforms to input x (higher = worse). Calibration on n held-out labelled
inputs takes q = the ceil((n + 1)(1 - alpha))-th smallest of their true classes' scores, the empirical
ceil((n + 1)(1 - alpha)) / n quantile; the set of a new input is {y : s(x, y) <= q}. When the calibration and test
inputs are exchangeable, P(y_test in set) >= 1 - alpha whatever the model, and <= 1 - alpha + 1 / (n + 1) when the
scores have no ties (Vovk et al., 2005; Angelopoulos & Bates, "A gentle introduction to conformal prediction",
2021). A set may be empty (no class scores at most q) or hold every class.

Scores (`SCORES`), each mapping probs (N, C) and a draw u (N,) to every class's score (N, C):
- "thr" (alias "lac"): 1 - p_y (Sadinle et al., 2019): the smallest sets on average.
- "aps": the mass of the classes more probable than y plus u p_y (Romano et al., 2020), randomised by default:
  u ~ U(0, 1) per input, from a seeded generator (the same call gives the same sets, however often made).
  Non-randomised, u = 1 (torch-uncertainty's randomized=False): deterministic, but the top class scores its own
  probability, so the most confident inputs can get empty sets when q is below their top probability.
- "raps": APS plus lam * max(0, rank(y) - k_reg), rank 1 for the most probable class (Angelopoulos et al., 2021):
  fewer unlikely classes in the sets.
Classes of equal probability share a rank and each counts only the strictly more probable classes' mass, so a
score does not depend on the order of the classes. Shapes: N inputs, C classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..metrics._checks import check_distributions, check_probs
from ..uncertainty import ensemble_probs


@dataclass(frozen=True)
class Thr:
    """THR / LAC: s(x, y) = 1 - p_y."""

    def __call__(self, probs: Tensor, draw: Tensor) -> Tensor:
        return 1 - probs


@dataclass(frozen=True)
class Aps:
    """APS: s(x, y) = sum_{c: p_c > p_y} p_c + u p_y."""

    def __call__(self, probs: Tensor, draw: Tensor) -> Tensor:
        above, _ = mass_and_rank(probs)
        return above + draw[:, None] * probs


@dataclass(frozen=True)
class Raps:
    """RAPS: the APS score plus lam * max(0, rank(y) - k_reg)."""

    k_reg: int = 1
    lam: float = 0.1

    def __post_init__(self):
        if self.k_reg < 0 or self.lam < 0:
            raise ValueError(f"RAPS needs k_reg >= 0 and lam >= 0, got k_reg={self.k_reg}, lam={self.lam}.")

    def __call__(self, probs: Tensor, draw: Tensor) -> Tensor:
        above, rank = mass_and_rank(probs)
        return above + draw[:, None] * probs + self.lam * (rank - self.k_reg).clamp_min(0)


Score = Thr | Aps | Raps
SCORES: dict[str, type[Score]] = {"thr": Thr, "lac": Thr, "aps": Aps, "raps": Raps}  # default settings by name
REPORTED = ("thr", "aps", "raps")  # the distinct scores, in the order reports show them


def miscoverage(alpha: str | float) -> float:
    """`alpha` as a float in (0, 1), or ValueError (also an argparse `type`: "invalid miscoverage value")."""
    value = float(alpha)
    if not 0 < value < 1:
        raise ValueError(f"alpha must be in (0, 1) (0.1 asks for 90% coverage), got {alpha}.")
    return value


def minimum_calibration(alpha: float) -> int:
    """The fewest labelled calibration inputs split conformal needs at miscoverage `alpha`: the n with
    ceil((n + 1)(1 - alpha)) <= n, i.e. n >= 1 / alpha - 1 (9 at alpha 0.1); fewer would need q = +infinity."""
    return math.ceil(1 / alpha - 1 - 1e-9)


def mass_and_rank(probs: Tensor) -> tuple[Tensor, Tensor]:
    """For every class y: the total probability of the classes strictly more probable than y, and y's rank
    1 + #{c : p_c > p_y} (tied classes share the better rank). probs (N, C) -> (N, C), (N, C)."""
    ordered = probs.sort(dim=1, descending=True).values  # (N, C)
    before = torch.nn.functional.pad(ordered.cumsum(dim=1)[:, :-1], (1, 0))  # (N, C): mass of positions < k
    greater = torch.searchsorted(-ordered, -probs, right=False)  # (N, C): #{c : p_c > p_y}
    return before.gather(1, greater), (greater + 1).to(probs.dtype)


@dataclass
class SplitConformal:
    """Split conformal prediction at miscoverage `alpha` (coverage 1 - alpha) with a score: a name of `SCORES`
    ("thr", "lac", "aps", "raps", at their default settings) or a score object such as `Raps(k_reg=2, lam=0.05)`.

    `randomized` (default) draws u ~ U(0, 1) per input for APS / RAPS (False: u = 1, deterministic) from the
    stream seeded with `seed`: calibration takes its first n draws, and every `sets` call the next N, from
    position n again, so the same inputs get the same sets on every call (an input's draw is its row's: its set
    may change when the inputs are batched otherwise). `calibrate` sets `quantile` and `calibration_size`.
    """

    alpha: float
    score: str | Score = "aps"
    randomized: bool = True
    seed: int = 0
    quantile: float | None = None
    calibration_size: int = 0

    def __post_init__(self):
        self.alpha = miscoverage(self.alpha)
        if isinstance(self.score, str):
            if self.score not in SCORES:
                raise ValueError(f"unknown conformal score {self.score!r}; choose one of {sorted(SCORES)}.")
            self.score = SCORES[self.score]()

    def scores(self, probs: Tensor, after: int = 0) -> Tensor:
        """Every class's score for each input, (N, C) float64, with a draw u per input: the seeded stream's draws
        after its first `after` (calibration: 0; new inputs: the calibration size)."""
        probs = probs.double()
        if self.randomized:
            generator = torch.Generator().manual_seed(self.seed)
            draw = torch.rand(after + len(probs), generator=generator, dtype=torch.float64)[after:].to(probs.device)
        else:
            draw = torch.ones(len(probs), dtype=torch.float64, device=probs.device)
        return self.score(probs, draw)

    def calibrate(self, probs: Tensor, labels: Tensor) -> SplitConformal:
        """Set `quantile` from held-out labelled inputs: probs (n, C), labels (n,). Returns self."""
        check_probs(probs, labels, "split conformal")
        n = len(labels)
        k = math.ceil((n + 1) * (1 - self.alpha) - 1e-9)  # 1e-9: (n + 1) * 0.9 may round up past an integer
        if k > n:
            raise ValueError(
                f"split conformal at alpha {self.alpha} needs at least {minimum_calibration(self.alpha)} labelled "
                f"calibration inputs, got {n}: give more, or a larger alpha."
            )
        true_class = self.scores(probs).gather(1, labels.long().to(probs.device)[:, None]).squeeze(1)  # (n,)
        self.quantile = true_class.sort().values[k - 1].item()
        self.calibration_size = n
        return self

    def sets(self, probs: Tensor) -> Tensor:
        """Prediction sets of new inputs as a mask (N, C), bool: class y is in input i's set when s(x_i, y) <= q."""
        if self.quantile is None:
            raise ValueError("the conformal predictor is not calibrated: call calibrate(probs, labels) first.")
        check_distributions(probs, "split conformal")
        return self.scores(probs, after=self.calibration_size) <= self.quantile


def coverage_and_size(sets: Tensor, labels: Tensor) -> dict[str, float]:
    """{"coverage": share of inputs whose label is in their set, "set_size": mean set size}. sets (N, C) bool,
    labels (N,)."""
    covered = sets.gather(1, labels.long().to(sets.device)[:, None]).squeeze(1)
    return {"coverage": covered.double().mean().item(), "set_size": sets.double().sum(dim=1).mean().item()}


def split_evaluation(
    member_logits: Tensor,
    labels: Tensor,
    alpha: float,
    score: str = "aps",
    splits: int = 100,
    calibration_share: float = 0.5,
    seed: int = 0,
) -> dict[str, float]:
    """Coverage and set size of split conformal on labelled data with no separate calibration set: `splits` random
    splits into calibration (`calibration_share`) and test inputs, seeded. Returns the mean and standard deviation
    of the test coverage over the splits, the mean set size, the splits and the calibration size.
    member_logits (N, M, C), labels (N,)."""
    if not 0 < calibration_share < 1 or not isinstance(splits, int) or splits < 1:
        raise ValueError(
            f"split_evaluation needs 0 < calibration_share < 1 and splits >= 1, got {calibration_share!r} and "
            f"{splits!r}."
        )
    probs, generator = ensemble_probs(member_logits.double()), torch.Generator().manual_seed(seed)
    n = int(len(labels) * calibration_share)
    if n == 0 or n == len(labels):
        raise ValueError(
            f"a calibration share of {calibration_share} of {len(labels)} inputs leaves "
            f"{'no calibration' if n == 0 else 'no test'} inputs: pass more labelled inputs, or another share."
        )
    results = []
    for split in range(splits):
        order = torch.randperm(len(labels), generator=generator)
        calibration, test = order[:n], order[n:]
        conformal = SplitConformal(alpha, score, seed=seed + split).calibrate(probs[calibration], labels[calibration])
        results.append(coverage_and_size(conformal.sets(probs[test]), labels[test]))
    coverage = torch.tensor([r["coverage"] for r in results], dtype=torch.float64)
    return {
        "coverage": coverage.mean().item(),
        "coverage_std": coverage.std(unbiased=False).item(),
        "set_size": sum(r["set_size"] for r in results) / splits,
        "splits": splits,
        "calibration_size": n,
    }
