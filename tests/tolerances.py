"""The suite's numerical tolerances, each derived from what it compares rather than tuned to one machine.

Two computations that are equal in exact arithmetic but run in another order (a fused grouped matmul against
the HF model's per-member matmuls, two batchings of one sum, another CPU's SIMD width or thread count) differ
only by rounding. A sum of K terms whose absolute values add up to S, computed in two orders, differs by at
most 2 * gamma_K * S with gamma_K = K u / (1 - K u) (Higham, "Accuracy and Stability of Numerical Algorithms",
2002, Lemma 3.1), u the unit roundoff: `reordered_sum` is that bound.
"""

from __future__ import annotations

U32 = 2.0**-24  # float32 unit roundoff, 6.0e-8
U64 = 2.0**-53  # float64 unit roundoff, 1.1e-16


def reordered_sum(terms: int, magnitude: float = 1.0, unit: float = U64) -> float:
    """Worst-case |difference| of one sum of `terms` terms with sum of |terms| <= `magnitude`, in two orders."""
    gamma = terms * unit / (1 - terms * unit)
    return 2 * gamma * magnitude


# The exactness contracts of DESIGN.md (fused == members, pruned == ablated, one member == the HF model) are
# specified for float32 as max |difference| <= 1e-5. Why that holds on any CPU: the fused and the HF forward
# compute the same sums in another order; rounding errors of a reordered dot product of K terms are random in
# sign and grow like sqrt(K) u times the sum of |terms| (Higham & Mary, SIAM J. Sci. Comput. 2019), which for
# the O(1) layer-normed activations and O(0.02) weights of these models is ~sqrt(37) * 6e-8 * 1 = 4e-7 per
# reduction (tiny configs; MiniLM: sqrt(1536) * 6e-8 * 0.1 = 2e-7), and the ~6 reductions per layer add up over
# L <= 6 layers as a random walk: sqrt(36) * 4e-7 = 2.4e-6, four times below the contract. (Measured over the
# contract tests, the text families' weights at std 0.1: at most 1.4e-6.)
CONTRACT = 1e-5


def real_contract(reference, layers: int) -> float:
    """The contract's bound for a real model of `layers` layers whose outputs `reference` (a tensor) reach beyond
    1 in absolute value: the derivation above assumes O(1) outputs and at most 6 layers; rounding grows with the
    magnitude of what is summed (Higham) and as a random walk over the layers' reductions (sqrt(layers / 6)). A
    fused DINOv2-S (12 layers, logits up to 3.6) measured 1.05e-5 on one CPU, under 5.1e-5, far under `DEFECT`."""
    return CONTRACT * max(1.0, reference.abs().max().item()) * max(1.0, (layers / 6) ** 0.5)


# What a real defect (a wrong head, another member's MLP, a missed bias, a mask error) must move the outputs by
# for a contract test to mean anything: a hundred times the bound. The tests assert it for their models (the
# tiny ones at a trained model's scale, conftest.at_trained_scale: >= 3.6e-3 measured).
DEFECT = 100 * CONTRACT
