"""Hydra distillation (paper 001): any ensemble of fixed members (a deep ensemble, a Hydra Ensemble: whatever
returns member logits (B, M, C) with member m one model from input to input; not MC dropout) distilled into one
student, a shared body with M light heads, one per member, so that the student keeps the members' disagreement
(model uncertainty) that matching their average loses.

    teacher outputs on the training inputs   attach_teacher       -> batches with `teacher_outputs` (B, M, C)
    phase 1: one "Hinton head" on the ensemble mean (Eq. 1-2)      = knowledge distillation, the baseline
    grow: M copies of the head, each equal to the Hinton head       `HydraEnsemble.grow`, `MultiHeadMLP.grow`
    phase 2: head m against member m (Eq. 3-4; Gaussian KL for regression)

Students: a transformer's first L - k layers as the body and M copies of its last k layers plus classifier as
the heads (a fused `HydraEnsemble` whose body runs once), or a `MultiHeadMLP` for toy and tabular data.
"""

from .hydra import Distilled, distill
from .students import MultiHeadMLP
from .teacher import attach_teacher

__all__ = ["Distilled", "MultiHeadMLP", "attach_teacher", "distill"]
