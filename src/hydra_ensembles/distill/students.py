"""Students for toy and tabular data: an MLP body shared by M MLP heads, all heads run as batched matmuls.

(A transformer student is a fused `HydraEnsemble`: `HydraEnsemble.fuse([model]).grow(M, head_layers=k)`.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor, nn

from ..fusion.ensemble import keep_frozen
from ..fusion.grouped import grouped_linear
from ..io import PREDICTOR_FILE, load_weights, save_dir_atomic, write_json_atomic
from ..outputs import PredictorOutput
from ..seeding import seeded

WEIGHTS_NAME = "model.safetensors"


class MultiHeadMLP(nn.Module):
    """A ReLU MLP body (widths `body`) shared by `heads` ReLU MLP heads (hidden widths `head`, then `outputs`).

    With body=() every head is a whole network of its own and no parameter is shared: a deep ensemble of M MLPs,
    trained in one batched pass (each head's loss gradient reaches only that head; train it with clip=None, since
    clipping the norm of all parameters together scales each member's step by the others'). With heads=1 it is one
    MLP.
    Heads are initialised independently (PyTorch's nn.Linear initialisation, from `seed`).

    Shapes: inputs (B, D) -> member_logits (B, M, C), C = outputs; with regression=True, member_gaussians
    (B, M, 2): each head's mean and log-variance (paper 001 §2, Regression).
    """

    kind = "multi_head_mlp"  # its name among the saved predictors, written in predictor.json

    def __init__(
        self,
        in_features: int,
        outputs: int,
        body: Sequence[int] = (64, 64),
        head: Sequence[int] = (),
        heads: int = 1,
        *,
        regression: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        if regression and outputs != 2:
            raise ValueError(f"a heteroscedastic regressor outputs (mean, log-variance): outputs=2, got {outputs}.")
        if heads < 1 or in_features < 1 or outputs < 1:
            raise ValueError(f"need heads, in_features, outputs >= 1; got {heads}, {in_features}, {outputs}.")
        self.settings = {
            "in_features": in_features,
            "outputs": outputs,
            "body": list(body),
            "head": list(head),
            "heads": heads,
            "regression": regression,
            "seed": seed,
        }
        self.regression = regression
        widths = [in_features, *body]
        with seeded(seed):  # the caller's random state is left as it was
            self.body = nn.Sequential(*[_relu_linear(a, b) for a, b in zip(widths[:-1], widths[1:])])
            sizes = [widths[-1], *head, outputs]
            # head layer l: weight (M, in, out), bias (M, 1, out), each head's slice an nn.Linear's initialisation
            linears = [[nn.Linear(a, b) for _ in range(heads)] for a, b in zip(sizes[:-1], sizes[1:])]
        self.head_weights = nn.ParameterList([torch.stack([x.weight.detach().T for x in layer]) for layer in linears])
        self.head_biases = nn.ParameterList([torch.stack([x.bias.detach()[None] for x in layer]) for layer in linears])

    @property
    def num_members(self) -> int:
        return self.settings["heads"]

    def forward(self, inputs: Tensor) -> PredictorOutput:
        """inputs (B, D) -> member logits (B, M, C) or member Gaussians (B, M, 2)."""
        h = self.body(inputs)  # (B, h)
        x = h[None].expand(self.num_members, *h.shape)  # (M, B, h)
        last = len(self.head_weights) - 1
        for index, (weight, bias) in enumerate(zip(self.head_weights, self.head_biases)):
            x = grouped_linear(x, weight, bias)  # (M, B, out): the fused engine's per-member linear
            x = torch.relu(x) if index < last else x
        out = x.transpose(0, 1)  # (B, M, C)
        return PredictorOutput(member_gaussians=out) if self.regression else PredictorOutput(member_logits=out)

    def grow(self, heads: int) -> MultiHeadMLP:
        """This one-head student with its head copied `heads` times on the same body (paper 001, "multi-head
        growth"): right after growing, every head predicts exactly what the one did. Returns a new model."""
        if self.num_members != 1:
            raise ValueError(f"grow starts from a one-head student (the Hinton head); this one has {self.num_members}.")
        reference = next(self.parameters())
        grown = MultiHeadMLP(**(self.settings | {"heads": heads})).to(reference.device, reference.dtype)
        with torch.no_grad():
            grown.body.load_state_dict(self.body.state_dict())
            for target, source in zip(
                [*grown.head_weights, *grown.head_biases], [*self.head_weights, *self.head_biases]
            ):
                target.copy_(source.expand_as(target))
        keep_frozen(self, grown)
        return grown.train(self.training)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """predictor.json (its kind and settings) and model.safetensors, atomically; read back by
        `hydra_ensembles.predictors.load_predictor`."""

        def write(tmp: Path) -> None:
            state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
            safetensors.torch.save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
            write_json_atomic(tmp / PREDICTOR_FILE, {"kind": self.kind, "settings": self.settings})

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> MultiHeadMLP:
        path = Path(path)
        record = json.loads((path / PREDICTOR_FILE).read_text())
        if record.get("kind") != cls.kind:
            raise ValueError(f"{str(path)!r} holds a {record.get('kind')!r}, not a {cls.kind}.")
        return load_weights(cls(**record["settings"]), path / WEIGHTS_NAME).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        heads = json.loads((path / PREDICTOR_FILE).read_text())["settings"]["heads"]
        return f"a multi-head MLP student with {heads} head{'s' if heads != 1 else ''}"


def _relu_linear(a: int, b: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(a, b), nn.ReLU())
