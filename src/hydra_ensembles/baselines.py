"""The paper's baselines, with the interface of `HydraEnsemble`: `model(**inputs).member_logits` is (B, M, C).

- `DeepEnsemble`: M models fine-tuned independently (different seeds), run one after another.
- `shared_backbone_ensemble`: the paper's cheaper "Deep Ensembles (D)": one fine-tuned backbone and M classifier
  heads trained on its frozen features with different seeds; returned as a HydraEnsemble whose members share
  every layer, so the backbone runs once (the shared trunk).
- `MCDropout`: one model, M forward passes with dropout active (Gal & Ghahramani, 2016).
- `lora_ensemble`: M LoRA fine-tunes (r = 4, alpha = 8 on the attention projections, §C.1.4) with different seeds.
- Temperature scaling is `evaluation.temperature.TemperatureScaled`; a pruned single model (Taylor, CircAvg) is
  a plain HF model from `build_members`.
A plain HF classifier counts as an ensemble of one (see `evaluation.report.collect_member_logits`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .adapters import Adapter, get_adapter
from .data.loaders import Batch, materialize, split_batch
from .finetune import TrainConfig, finetune
from .fusion import HydraEnsemble
from .outputs import PredictorOutput


class DeepEnsemble(nn.Module):
    """Independently trained models, run one after another. `stored_parameters` (if set) overrides the
    parameter count, for ensembles that share weights on disk (LoRA)."""

    def __init__(self, models: Sequence[nn.Module], stored_parameters: int | None = None):
        super().__init__()
        if not models:
            raise ValueError("a deep ensemble needs at least one model.")
        self.models = nn.ModuleList(models)
        self.stored_parameters = stored_parameters

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        return PredictorOutput(member_logits=torch.stack([get_adapter(m).output(m, inputs) for m in self.models], 1))


class MCDropout(nn.Module):
    """One model, `samples` stochastic passes with its dropout (hidden and attention) switched on.

    The dropout masks come from `seed` and a call counter, so a sequence of calls is reproducible.
    """

    def __init__(self, model: nn.Module, samples: int = 10, seed: int = 0):
        super().__init__()
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}.")
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError(f"{type(model).__name__} has no dropout with p > 0: MC dropout would return copies.")
        self.model, self.samples, self.seed, self.calls = model, samples, seed, 0

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        adapter = get_adapter(self.model)
        was_training = self.model.training
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.calls)
            self.calls += 1
            self.model.train()  # dropout on; no batch norm in these transformers, layer norm is unaffected
            try:
                logits = [adapter.output(self.model, inputs) for _ in range(self.samples)]
            finally:
                self.model.train(was_training)
        return PredictorOutput(member_logits=torch.stack(logits, 1))


def shared_backbone_ensemble(
    model: nn.Module,
    train_loader: Iterable[Batch],
    seeds: Sequence[int] = (0, 1, 2),
    *,
    epochs: int = 10,
    lr: float = 1e-3,
    progress: bool = True,
) -> HydraEnsemble:
    """Deep Ensembles (D): M heads (everything after the last layer; the final classifier re-initialised from
    each seed) trained with AdamW on the frozen backbone's features, fused so the backbone runs once."""
    adapter = get_adapter(model)
    batches = materialize(train_loader, "training loader")
    features = _features(model, batches)
    members = []
    for seed in seeds:
        member = copy.deepcopy(model)
        reset_classifier(member, seed)
        head = _head_parameters(member, adapter)
        optimizer = torch.optim.AdamW(head, lr=lr, weight_decay=0.01)
        generator = torch.Generator().manual_seed(seed)
        member.train()
        for _ in tqdm(range(epochs), desc=f"head, seed {seed}", disable=not progress, leave=False):
            for index in torch.randperm(len(features), generator=generator).tolist():
                hidden, inputs, labels = features[index]
                loss = nn.functional.cross_entropy(adapter.head(member, hidden, inputs), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        members.append(member.eval())
    return HydraEnsemble.fuse(members, mlp="stack")


def lora_ensemble(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    rank: int = 4,
    alpha: int = 8,
    fresh_classifier: bool = True,
    val_loader: Iterable[Batch] | None = None,
    progress: bool = True,
) -> DeepEnsemble:
    """M LoRA fine-tunes of `model` (adapters on the attention query and value projections, the head trained
    in full), merged into plain HF models. `stored_parameters` counts the shared base once plus each member's
    adapters and head."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # pragma: no cover - peft is a pinned dependency
        raise ImportError("LoRA ensembles need peft: pip install peft==0.21.2") from error
    adapter = get_adapter(model)
    names = adapter.layer_names
    targets = sorted({names.query.rsplit(".", 1)[-1], names.value.rsplit(".", 1)[-1]})
    backbone = adapter.backbone_path(model).split(".")[0]
    head_modules = [n for n, m in model.named_children() if n != backbone and any(True for _ in m.parameters())]
    members, stored = [], sum(p.numel() for p in model.parameters())
    for seed in seeds:
        member = copy.deepcopy(model)
        if fresh_classifier:
            reset_classifier(member, seed)
        peft_model = get_peft_model(
            member,
            LoraConfig(
                r=rank, lora_alpha=alpha, lora_dropout=0.1, target_modules=targets, modules_to_save=head_modules
            ),
        )
        stored += sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        finetune(peft_model, train_loader, config.with_(seed=seed), val_loader=val_loader, progress=progress)
        members.append(peft_model.merge_and_unload().eval())
    return DeepEnsemble(members, stored_parameters=stored)


def reset_classifier(model: nn.Module, seed: int) -> None:
    """Re-initialise, from `seed`, the linear layers after the encoder that output the class logits."""
    adapter = get_adapter(model)
    classes = model.config.num_labels
    std = getattr(adapter.config(model), "initializer_range", 0.02)
    generator = torch.Generator().manual_seed(seed)
    found = False
    for name, module in model.named_modules():
        inside = name.startswith(adapter.full_path(model, adapter.layers_path)) or not name
        if isinstance(module, nn.Linear) and module.out_features == classes and not inside:
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                if module.bias is not None:
                    module.bias.zero_()
            found = True
    if not found:
        raise ValueError(f"found no classifier layer with {classes} outputs in {type(model).__name__}.")


def _head_parameters(model: nn.Module, adapter: Adapter) -> list[nn.Parameter]:
    """Parameters outside the embeddings and the layers: final norm, pooler, classifier."""
    inner = tuple(adapter.full_path(model, p) + "." for p in (*adapter.embedding_paths, adapter.layers_path))
    return [p for name, p in model.named_parameters() if not name.startswith(inner)]


@torch.no_grad()
def _features(model: nn.Module, batches: list[Batch]) -> list[tuple[Tensor, dict, Tensor]]:
    """(last-layer hidden states of the tokens the head reads, inputs, labels) for every batch."""
    engine = HydraEnsemble.fuse([model])
    adapter = get_adapter(model)
    out = []
    for batch in batches:
        inputs, labels = split_batch(adapter, batch)
        x = engine.outer.embed(inputs)
        mask = adapter.attention_mask(inputs, x.shape[2])
        hidden = engine.run_layers(x, mask, queries=engine.head_tokens)[0]  # (B, q, d)
        out.append((hidden, inputs, torch.as_tensor(labels)))
    return out
