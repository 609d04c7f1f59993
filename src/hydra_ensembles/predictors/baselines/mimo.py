"""MIMO (Havasi et al., 2020) for vision transformers: M inputs mixed into one network with M classifier heads,
trained from scratch; at test time the same image goes to every input and one pass gives M members.

Construction, for an HF image classifier with c input channels, C classes and hidden size h:

    patch embedding   M convolutions, one per input, their outputs summed = one convolution over the M inputs
                      stacked on the channel axis (M*c channels; block m of its weight is input m's convolution;
                      the M biases, which only ever appear summed, are one bias)
    trunk             position embeddings, [CLS], the layers and the final norm: one, shared
    heads             M linear heads on the pooled output = one linear layer of M*C outputs, member m's logits
                      its outputs m*C .. (m+1)*C-1

So the network is an ordinary HF model of the family whose patch embedding is built for M*c channels
(`SummedPatchEmbeddings`: given one image, it puts it at every input) and whose classifier has M*C outputs; its
config keeps c channels and the C classes (num_labels = C): what one input is and which classes it names.

Text has no sensible analogue: the M inputs would be M sentences of different lengths whose token embeddings are
summed position by position, so that padding of one sentence lands on words of another and no attention mask fits
all M; MIMO is left out of the text tables.

Training (Havasi et al. §3; the reference implementation's input repetition): each batch of B examples is repeated
`batch_repetition` = R times; member m reads row i of the repeated batch from example `permutations[m, i]`, a
random permutation of the R*B rows, except that a fraction rho of the rows (the same rows for every member) is
kept in one common order: there all members read the same image (rho = 1: every member reads the same images,
rho = 0: independent permutations). The draws come from torch's default generator, which the training loop seeds
every epoch (`training.train`): seeded and resumable. A training step reads the loader's batch of B examples as
R*B rows (the reference implementation divides its batch by R so that a step reads B rows; here a step costs R
times Single's, at Single's batch, learning rate and steps). The loss (`training.losses.MIMOLoss`) is the sum over
members of each member's cross-entropy against the labels of the examples it read.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import transformers
from torch import Tensor, nn

from ...data.loaders import TARGETS, Batch
from ...io import PREDICTOR_FILE, load_weights, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ...seeding import seeded
from ...training import TrainConfig, train
from ...training.losses import MIMOLoss
from ..load import register_predictor, saved_record
from ..wrapper import Wrapper

WEIGHTS = "model.safetensors"


@dataclass
class MIMOTrainingOutput:
    """What MIMO returns in training mode. member_logits (R*B, M, C); permutations (M, R*B): member m's row i is
    example permutations[m, i] of the batch (its labels are labels[permutations[m, i]])."""

    member_logits: Tensor
    permutations: Tensor


def draw_permutations(batch: int, members: int, repetition: int, rho: float) -> Tensor:
    """(M, R*B) example indices: the batch's B indices repeated R times in one random order; then for each member
    the first round((1 - rho)*R*B) positions reshuffled apart (input repetition keeps the rest in common)."""
    rows = batch * repetition
    common = torch.arange(batch).repeat(repetition)[torch.randperm(rows)]  # (R*B,)
    shuffled = round((1 - rho) * rows)
    per_member = [torch.cat([common[:shuffled][torch.randperm(shuffled)], common[shuffled:]]) for _ in range(members)]
    return torch.stack(per_member)  # (M, R*B)


@register_predictor
class MIMO(Wrapper):
    """An HF image classifier shaped for M inputs and M heads (see the module docstring); member logits (B, M, C)."""

    kind = "mimo"
    title = "MIMO (Havasi et al., 2020): one {model} that reads {members} inputs and gives {members} predictions"

    def __init__(self, model: nn.Module, members: int, rho: float = 0.5, batch_repetition: int = 4):
        super().__init__()
        if not 0 <= rho <= 1 or batch_repetition < 1 or members < 1:
            raise ValueError(
                f"MIMO needs members >= 1, 0 <= rho <= 1 and batch_repetition >= 1, got members={members}, "
                f"rho={rho}, batch_repetition={batch_repetition}."
            )
        self.model, self.members, self.rho, self.batch_repetition = model, members, rho, batch_repetition

    @property
    def base(self) -> nn.Module:
        """The network: its config names the C classes."""
        return self.model

    @property
    def num_members(self) -> int:
        return self.members

    def training_key(self) -> dict[str, float]:
        """What training draws by, beyond the weights: a checkpoint resumes only under the same (`training.train`)."""
        return {"rho": self.rho, "batch_repetition": self.batch_repetition}

    def forward(self, pixel_values: Tensor, **inputs) -> PredictorOutput | MIMOTrainingOutput:
        """pixel_values (B, c, H, W). Eval: member logits (B, M, C) of the image at every input. Training: each
        member's logits on its own draw of the repeated batch, with the draws (`MIMOTrainingOutput`)."""
        inputs = {k: v for k, v in inputs.items() if k not in TARGETS}
        channels = self.model.config.num_channels
        if pixel_values.dim() != 4 or pixel_values.shape[1] != channels:  # M*c channels would pass as M inputs
            raise ValueError(
                f"MIMO reads images of {channels} channel(s), pixel_values (B, {channels}, H, W); got "
                f"{tuple(pixel_values.shape)}. Preprocess with the model's own image processor."
            )
        if not self.training:  # the network puts the image at every input
            return PredictorOutput(member_logits=self._member_logits(pixel_values, inputs))
        permutations = draw_permutations(len(pixel_values), self.members, self.batch_repetition, self.rho)  # (M, R*B)
        chosen = pixel_values[permutations.to(pixel_values.device)]  # (M, R*B, c, H, W)
        stacked = chosen.transpose(0, 1).flatten(1, 2)  # (R*B, M*c, H, W): input m is member m's draw
        return MIMOTrainingOutput(self._member_logits(stacked, inputs), permutations)

    def _member_logits(self, pixel_values: Tensor, inputs: dict) -> Tensor:
        """pixel_values (N, c, H, W) (one image for all inputs) or (N, M*c, H, W) -> member logits (N, M, C)."""
        logits = self.model(pixel_values=pixel_values, **inputs).logits  # (N, M*C)
        return logits.view(len(pixel_values), self.members, -1)  # member m's logits: outputs m*C..(m+1)*C-1

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """predictor.json (settings, the network's class and config) and model.safetensors, atomically."""

        def write(tmp: Path) -> None:
            state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
            safetensors.torch.save_file(state, tmp / WEIGHTS, metadata={"format": "pt"})
            record = {
                "kind": self.kind,
                "members": self.members,
                "rho": self.rho,
                "batch_repetition": self.batch_repetition,
                "model_class": type(self.model).__name__,
                "model_config": self.model.config.to_dict(),
            }
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> MIMO:
        path = Path(path)
        record = saved_record(path, cls)
        model_class = getattr(transformers, record["model_class"])
        config = model_class.config_class.from_dict(record["model_config"])
        model = _mimo_network(model_class, config, record["members"])
        model = load_weights(model, path / WEIGHTS)
        return cls(model, record["members"], record["rho"], record["batch_repetition"]).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        record = json.loads((path / PREDICTOR_FILE).read_text())
        return f"a MIMO network of {record['members']} members (rho={record['rho']:g})"


class SummedPatchEmbeddings(nn.Module):
    """The M inputs' patch embeddings, summed: the family's patch embedding built for M*c channels (`inner`), fed
    the M inputs stacked on the channel axis (B, M*c, H, W), or one image (B, c, H, W) that goes to every input."""

    def __init__(self, inner: nn.Module, members: int):
        super().__init__()
        self.inner, self.members = inner, members

    @property
    def projection(self) -> nn.Module:
        """The convolution (families read its dtype from here)."""
        return self.inner.projection

    def forward(self, pixel_values: Tensor, *args, **kwargs) -> Tensor:
        if pixel_values.shape[1] * self.members == self.inner.num_channels:  # one image: at every input
            pixel_values = pixel_values.repeat(1, self.members, 1, 1)  # (B, M*c, H, W)
        return self.inner(pixel_values, *args, **kwargs)


def _mimo_network(model_class: type, config: transformers.PretrainedConfig, members: int) -> nn.Module:
    """`model_class` with its patch embedding built for M*c input channels and wrapped as `SummedPatchEmbeddings`,
    and its C-way classifier widened to M*C outputs (config: one input's c channels and the C classes, which the
    model keeps: what the data readers make of an image, and which classes it names). Initialised as the family
    initialises its layers (the classifier: truncated normal, std initializer_range, zero bias)."""
    wide = copy.deepcopy(config)
    wide.num_channels = members * config.num_channels
    model = model_class(wide)
    model.config.num_channels = config.num_channels
    path = next(name for name, _ in model.named_modules() if name.endswith("patch_embeddings"))
    model.set_submodule(path, SummedPatchEmbeddings(model.get_submodule(path), members))
    classifier = model.classifier
    heads = nn.Linear(classifier.in_features, members * config.num_labels, device=classifier.weight.device)
    with torch.no_grad():
        nn.init.trunc_normal_(heads.weight, std=getattr(config, "initializer_range", 0.02))
        heads.bias.zero_()
    model.classifier = heads
    return model


def mimo(model: nn.Module, members: int = 3, rho: float = 0.5, batch_repetition: int = 4, seed: int = 0) -> MIMO:
    """An untrained MIMO network shaped after `model` (an HF image classifier: its class and config; its weights
    are not used), initialised from `seed`. Train it with `train_mimo`."""
    config = copy.deepcopy(model.config)
    if not isinstance(getattr(config, "num_channels", None), int) or not isinstance(
        getattr(model, "classifier", None), nn.Linear
    ):
        raise ValueError(
            f"MIMO mixes M images through their patch embeddings and needs an image classifier with a linear "
            f"`classifier` (ViT, DINOv2); a {type(model).__name__} is not one. Text has no sensible analogue "
            "(docs/baselines.md)."
        )
    with seeded(seed):  # the caller's random state is left as it was
        network = _mimo_network(type(model), config, members)
    return MIMO(network.to(next(model.parameters()).device), members, rho, batch_repetition).eval()


def mimo_forward(model: nn.Module, inputs: dict) -> PredictorOutput | MIMOTrainingOutput:
    """The training loop's forward for MIMO: the module's own output, draws included (the default forward would
    keep only the member logits)."""
    return model(**inputs)


def train_mimo(
    network: MIMO,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    *,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> MIMO:
    """Train MIMO in place with the one training loop (`MIMOLoss` on `mimo_forward`, the config's label
    smoothing); validation runs in eval mode (the same image at every input). Returns it in eval mode."""
    loss = MIMOLoss(config.label_smoothing)
    return train(
        network,
        train_loader,
        config,
        loss=loss,
        forward=mimo_forward,
        val_loader=val_loader,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        desc="training MIMO",
    )
