"""`HydraEnsemble`: M pruned members of one pretrained model fused into one module that runs them in one pass.

Data flow for inputs of batch B and length T (M members, d hidden):

    embeddings (computed once when members share them)   -> (M, B, T, d) member streams, member-major
    L x FusedLayer (grouped q/k/v/o, one SDPA over all members' heads, shared or stacked MLP)
    each member's own head (final norm / pooler / classifier) -> (M, B, C)
    public output: member_logits (B, M, C); ensemble probability = mean over members of softmax(logits)
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import safetensors.torch
import torch
import transformers
from torch import Tensor, nn

from ..adapters import Adapter, adapter_by_name, class_mismatch, get_adapter
from ..data.loaders import Batch, per_example, split_batch, to_device
from ..io import HYDRA_CONFIG, read_safetensors, reading_dir, save_dir_atomic, saved_inside, write_json_atomic
from ..modes import evaluating
from ..outputs import PredictorOutput
from ..pruning import HeadMap, base_fingerprint, kept_heads, kept_neurons
from ..pruning.heads import check_plain_linears
from ..pruning.persist import clear_structures
from ..uncertainty import ensemble_probs
from ..version import __version__
from .layer import (
    ConvConstants,
    FusedLayer,
    MLPMode,
    batch_rows,
    layer_inputs,
    ragged_by_default,
    repeat_rows,
    share_average_or_stack,
)
from .outer import OuterModules, TensorStore

CONFIG_NAME = HYDRA_CONFIG
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1
Layout = Literal["auto", "ragged", "padded"]  # how layers with uneven heads lay out their attention (`set_layout`)


class HydraEnsemble(nn.Module):
    """M pruned members of one pretrained HF model, fused. Build with `HydraEnsemble.fuse(members)`."""

    kind = "hydra_ensemble"  # its name among the saved predictors (`hydra_ensembles.predictors.load_predictor`)

    def __init__(
        self,
        adapter: Adapter,
        model_class: type,
        model_config: transformers.PretrainedConfig,
        outer: OuterModules,
        layers: Sequence[FusedLayer],
        head_maps: Sequence[HeadMap],
        mlp: MLPMode,
        fingerprint: str,
        averaged: Sequence[str] = (),
    ):
        super().__init__()
        self.adapter = adapter
        self.model_class = model_class
        self.model_config = model_config
        self.outer = outer
        self.layers = nn.ModuleList(layers)
        self.head_maps = [dict(h) for h in head_maps]
        self.mlp = mlp
        self.fingerprint = fingerprint
        # names of the tensors averaged over members that differ in them (mlp="average" after separate
        # fine-tuning): empty when the ensemble equals its members exactly
        self.averaged = list(averaged)
        spec = adapter.specs[model_class.__name__]  # model_class: a supported class
        self.is_classifier = spec.classifier
        self.head_tokens = spec.head_tokens  # leading tokens the head reads: the last layer computes only those
        # On the CPU, forward passes run in chunks of at most this many member-token rows (M x examples x T): the
        # result is the same, and there a small working set is markedly faster than one huge pass. None: no
        # chunking (as on a GPU, and when compiled).
        self.max_rows: int | None = 4096
        # shared trunk: leading layers that are one function for all members (none if embeddings differ)
        shared = [layer.shared for layer in self.layers] + [False]
        self.trunk = 0 if outer.embeddings_per_member else shared.index(False)

    @property
    def num_members(self) -> int:
        return len(self.head_maps)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def locate(self, parameter: str) -> tuple[str, int | None]:
        """Where one of this module's parameters (by its name here) sits in the members, as `Adapter.locate` says
        it of an HF model: ("embeddings", None), ("layer", index) or ("head", None); so that training freezes the
        embeddings or trains the last layers of a fused ensemble as of one HF model."""
        if parameter.startswith("layers."):
            return "layer", int(parameter.split(".")[1])
        for store in ("outer.shared.", "outer.member."):
            if parameter.startswith(store):  # stored under its dotted name in the members, with "/" for "."
                return self.adapter.locate(self.outer.skeleton, parameter[len(store) :].replace("/", "."))
        return "head", None

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters that are, per member, a bias, norm or layer-scale vector (stacked with a
        member or group axis): AdamW leaves them undecayed, as it leaves an HF model's 1-D parameters."""
        names = set()
        for name, tensor in self.named_parameters():
            last = name.rsplit(".", 1)[-1]
            if name.startswith("layers."):
                vector = last.endswith("_bias") or last.startswith(("norm", "scale", "conv_norm"))
            else:  # the outer stores: a member tensor has a leading M axis
                vector = tensor.dim() - name.startswith("outer.member.") < 2
            if vector:
                names.add(name)
        return names

    # ---- building ----

    @classmethod
    def fuse(
        cls, members: Sequence[nn.Module], mlp: MLPMode = "average", *, allow_identical: bool = False
    ) -> HydraEnsemble:
        """Fuse pruned members (HF models from `build_members`, fine-tuned or not) into one module.

        Args:
            members: M >= 1 models of one class, pruned from one checkpoint, with the same classifier shape.
            mlp: "average" averages the members' MLPs, layer norms and embeddings (the paper's merged MLP; exact
                when members share them, as zero-shot members do; an approximation once members were fine-tuned
                apart: `ensemble.averaged` names what was averaged, `fusion_deviation` measures the effect; fusing
                the pruned members and then fine-tuning the fused ensemble, `training.finetune_fused`, stays exact);
                "stack" keeps each member's own (exact for separately fine-tuned members). Embedding, MLP and
                norm tensors identical across members are stored once either way; each member's head (pooler,
                classifier, final norm) is its own. Members that keep different MLP neurons are refused under
                "average" (different neurons would be averaged).
            allow_identical: fuse members with the same heads and weights (refused by default: no diversity).
        """
        members = list(members) if isinstance(members, nn.ModuleList) else members
        _check_members(members, mlp)
        if not allow_identical:
            _check_not_identical(members)
        adapter = get_adapter(members[0])
        head_maps = [kept_heads(m) for m in members]
        model_class = adapter.supported_class(type(members[0]))
        skeleton, layer_kwargs = _skeleton(model_class, members[0].config, adapter, like=members[0])
        layers = []
        for index in range(adapter.num_layers(members[0])):
            blocks = [adapter.layer_block(m, index) for m in members]
            kept = [head_map[index] for head_map in head_maps]
            layers.append(FusedLayer.from_blocks(blocks, kept, mlp, **layer_kwargs[index]))
        shared, member, parameters, averaged = _outer_tensors(adapter, skeleton, members, mlp)
        outer = OuterModules(adapter, skeleton, shared, member, parameters)
        config = _clean_config(members[0].config)
        fingerprint = base_fingerprint(members[0])
        averaged += [f"layers.{i}.{name}" for i, layer in enumerate(layers) for name in layer.averaged]
        return cls(adapter, model_class, config, outer, layers, head_maps, mlp, fingerprint, averaged).eval()

    def set_layout(self, layout: Layout = "auto") -> HydraEnsemble:
        """Lay out the attention of the layers whose members keep different numbers of heads, in place (the
        outputs are the same): "ragged" (each member's heads only), "padded" (zero-padded to the widest member),
        or "auto": the faster one on the device the weights are on (`ragged_by_default`: ragged on a CPU, padded
        on a GPU), which fusing and loading choose already. Call it after moving an ensemble to another kind of
        device (`lay_out_for_device`; `inference.prepare` and the CLI do). Only those layers' q/k/v and W_o
        parameters are replaced (build an optimiser after); everything else stays. Returns this ensemble."""
        if layout not in ("auto", "ragged", "padded"):
            raise ValueError(f"layout must be 'auto', 'ragged' or 'padded', got {layout!r}.")
        for layer in self.layers:
            if layout == "auto":
                layer.lay_out(ragged_by_default(layer.head_counts, layer.qkv_weight.device))
            else:
                layer.lay_out(layout == "ragged" and len(set(layer.head_counts)) > 1)
        return self

    def grow(self, heads: int, head_layers: int = 0) -> HydraEnsemble:
        """Hydra distillation's student (paper 001 §2, "multi-head growth"): this one-member ensemble with its
        last `head_layers` layers and its head (final norm, pooler, classifier) copied `heads` times, on one
        shared body (the embeddings and the other layers, run once: the trunk). Every copy starts equal to the
        original, so right after growing each member predicts exactly what the one member did; training then
        moves the copies apart. head_layers=0: the heads are the classifiers alone. Returns a new ensemble; this
        one is unchanged."""
        if self.num_members != 1:
            raise ValueError(
                f"grow starts from a one-member ensemble (the Hinton head); this one has {self.num_members}."
            )
        if heads < 1 or not 0 <= head_layers <= self.num_layers:
            raise ValueError(
                f"grow needs heads >= 1 and 0 <= head_layers <= {self.num_layers} (the layers of this model), "
                f"got heads={heads}, head_layers={head_layers}."
            )
        first_head_layer = self.num_layers - head_layers
        layers = [layer.repeat(heads, stack=i >= first_head_layer) for i, layer in enumerate(self.layers)]
        with torch.no_grad():
            member = {k: t.detach().expand(heads, *t.shape[1:]).clone() for k, t in self.outer.member.tensors().items()}
            shared = {k: t.detach().clone() for k, t in self.outer.shared.tensors().items()}
        parameters = set(self.outer.shared.parameter_names() + self.outer.member.parameter_names())
        outer = OuterModules(self.adapter, self.outer.skeleton, shared, member, parameters)
        mlp = "stack" if head_layers else self.mlp
        grown = HydraEnsemble(
            self.adapter,
            self.model_class,
            self.model_config,
            outer,
            layers,
            self.head_maps * heads,
            mlp,
            self.fingerprint,
            self.averaged,
        )
        keep_frozen(self, grown)
        return grown.train(self.training)

    def untie(self) -> HydraEnsemble:
        """Give every member its own copy of each tensor the members share (G = 1 -> M), in place; returns self.
        The outputs are unchanged, but training then moves each member by its own gradient alone. Fusion stores
        tensors equal in all members once (at initialisation: layer norms, zero biases), so members trained from
        scratch as one module (Packed-Ensembles) must be untied first, or those tensors would couple them."""
        members = self.num_members

        def own(tensor: Tensor, shape: Sequence[int]) -> Tensor:
            return tensor.detach().expand(members, *shape).clone()  # (M, ...)

        with torch.no_grad():
            for layer in self.layers:
                for name, p in list(layer.named_parameters()):  # a group axis G first (a ragged layout's
                    if p.dim() >= 2 and p.shape[0] == 1 and members > 1:  # attention has none: per member already)
                        setattr(layer, name, nn.Parameter(own(p, p.shape[1:]), requires_grad=p.requires_grad))
            shared = self.outer.shared.tensors()
            if shared:
                # the store's name ("shared." / "member.") dropped: a frozen tensor stays frozen when it moves
                frozen = {name.split(".", 1)[1] for name, p in self.outer.named_parameters() if not p.requires_grad}
                member = self.outer.member.tensors() | {name: own(t, t.shape) for name, t in shared.items()}
                parameters = set(self.outer.shared.parameter_names() + self.outer.member.parameter_names())
                self.outer = OuterModules(self.adapter, self.outer.skeleton, {}, member, parameters)
                for name, p in self.outer.named_parameters():
                    p.requires_grad_(name.split(".", 1)[1] not in frozen)
        self.trunk = 0
        return self

    def check_in_order(self, models: Sequence[nn.Module], what: str, fix: str) -> None:
        """Refuse `models` that are not this ensemble's members, one per member, in its order (each keeping
        member m's heads); `what` names them in the message, `fix` says what to pass instead."""
        if len(models) != self.num_members:
            raise ValueError(f"the ensemble has {self.num_members} members, got {len(models)} {what}s.")
        for m, model in enumerate(models):
            if not isinstance(model, self.model_class):
                raise ValueError(
                    f"{what} {m} is a {type(model).__name__}; the ensemble's members are "
                    f"{self.model_class.__name__}s: {fix}."
                )
            if kept_heads(model) != self.head_maps[m]:
                raise ValueError(
                    f"{what} {m} keeps other heads than the ensemble's member {m} ({kept_heads(model)} vs "
                    f"{self.head_maps[m]}): {fix}."
                )

    def unfuse(self, templates: Sequence[nn.Module]) -> list[nn.Module]:
        """The members this ensemble runs, as HF models: copies of `templates` (the pruned members it was fused
        from, or any models of the same class pruned to the same heads: they give the structure) holding this
        ensemble's weights, a tensor the members share in every copy and a member's own in its copy. The inverse
        of `fuse`: each copy run alone gives its member's logits here (up to float rounding), also after the
        fused ensemble was trained (`training.finetune_fused`), which is how a member is taken out of it."""
        self.check_in_order(templates, "template", "pass the pruned members the ensemble was fused from")
        dtype = next(self.parameters()).dtype
        for m, template in enumerate(templates):  # a copy_ into another dtype would round the weights silently
            if (other := next(template.parameters()).dtype) != dtype:
                raise ValueError(f"template {m} is {other} and the ensemble {dtype}: pass templates in {dtype}.")
        members = []
        for m, template in enumerate(templates):
            member = copy.deepcopy(template)
            with torch.no_grad():
                for index, layer in enumerate(self.layers):
                    layer.write_member(m, self.adapter.layer_block(member, index))
                state = dict(member.named_parameters()) | dict(member.named_buffers())
                for name, tensor in self.outer.shared.tensors().items():
                    state[name].copy_(tensor)
                for name, tensor in self.outer.member.tensors().items():
                    state[name].copy_(tensor[m])
            members.append(member.train(self.training))
        return members

    # ---- running ----

    def forward(self, output_hidden_states: bool = False, **inputs: Any) -> PredictorOutput:
        """Run all members in one pass. `inputs` are what the base HF model takes (e.g. input_ids and
        attention_mask, or pixel_values); a `labels` entry is ignored, so a training batch can be passed as is."""
        inputs, _ = split_batch(self.adapter, inputs)
        x, mask = self.embed(inputs)  # x: (1, B, T, d) when shared, else (M, B, T, d)
        batch, tokens = x.shape[1], x.shape[2]
        # one unsliced chunk when compiled (each batch size would recompile) and off the CPU (on a GPU, chunks only
        # add kernel launches: measured on an H100, 6 chunks made a batch of 32 cost 6x one model, not 2.9x)
        whole = torch.compiler.is_compiling() or x.device.type != "cpu"
        step = batch if self.max_rows is None or whole else max(1, self.max_rows // (self.num_members * tokens))
        if not whole:
            chunks = max(1, math.ceil(batch / step))
            step = max(1, math.ceil(batch / chunks))  # even chunks: 32 at <= 10 a chunk is 4 x 8, not 10+10+10+2
        outs, hiddens = [], []
        for start in [0] if whole else range(0, batch, step):  # rows are independent: chunks bound the working set
            rows = slice(start, start + step)
            part = (
                inputs
                if whole
                else {k: v[rows] if per_example(v) and v.shape[0] == batch else v for k, v in inputs.items()}
            )
            part_mask = mask if whole else batch_rows(mask, rows, batch)
            h = self.run_layers(x[:, rows], part_mask, queries=None if output_hidden_states else self.head_tokens)
            outs.append(self.classify(h, part))  # (M, b, C) or (M, b, D)
            hiddens.append(h if output_hidden_states else None)
        out = torch.cat(outs, dim=1).transpose(0, 1)  # (B, M, C) or (B, M, D)
        hidden = torch.cat(hiddens, dim=1).transpose(0, 1) if output_hidden_states else None  # (B, M, T, d)
        if self.is_classifier:
            return PredictorOutput(member_logits=out, member_hidden_states=hidden)
        return PredictorOutput(member_pooled=out, member_hidden_states=hidden)

    # ---- engine API: the steps of a forward pass, for scoring candidates as members and training heads ----
    # (with `num_layers` and `head_tokens`, the leading tokens the heads read; nothing outside fusion/ reaches
    # into `outer` or `layers`)

    def embed(self, inputs: dict[str, Any]) -> tuple[Tensor, Tensor | None]:
        """Member streams entering layer 0 and the attention mask. inputs: model inputs (no labels).

        Returns x (1, B, T, d) when the members share their embeddings (else (M, B, T, d)) and the mask, as every
        layer takes it: bool, (B, 1, 1|T, T) or (T, T), or None; or, for families whose layers share an additive
        score bias (MPNet), float (B, G*H, T, T): one plane per original head of each of G = 1 or M bias copies,
        the dtype's lowest value where the padding mask forbids; or, for families whose layers differ in it
        (ModernBERT), a list of one `LayerAttention` per layer (mask and rotary table). Pass it on as it is: the
        engine's steps pick each layer's part."""
        x = self.outer.embed(inputs)
        batch, tokens = x.shape[1], x.shape[2]
        per_layer = self.outer.layer_attention(inputs, tokens)
        if per_layer is not None:
            return x, per_layer
        mask = self.adapter.attention_mask(inputs, tokens)
        bias = self.outer.attention_bias(tokens)  # (G, H, T, T) or None
        if bias is None:
            return x, mask
        bias = bias.flatten(0, 1)[None].expand(batch, -1, -1, -1)  # (B, G*H, T, T), a view
        if mask is not None:
            # HF's own fill (a row with every key masked then attends evenly, as HF's; -inf would make it NaN)
            bias = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        return x, bias

    def prefix(self, inputs: dict[str, Any], last: int) -> tuple[list[Tensor], Tensor | None]:
        """The hidden states entering layers 0..last (each (1|M, B, T, d)), and the mask: what candidates of
        layers <= last share, since turning a head off in layer l changes nothing below l."""
        x, mask = self.embed(inputs)
        states = [x]
        for index, layer in enumerate(self.layers[:last]):
            if index >= self.trunk:  # past the shared trunk every member has its stream (as `run_layers`)
                x = x.expand(self.num_members, *x.shape[1:])
            x = layer(x, layer_inputs(mask, index))
            states.append(x)
        return states, mask

    def ablation_candidates(
        self, layer: int, x: Tensor, mask: Tensor | None, slots: Sequence[int], queries: int | None = None
    ) -> Tensor:
        """Layer `layer`'s output once per candidate head (slot) turned off, from its input x (1, B, T, d) of a
        one-member engine: (C, B, T, d), or (C, B, q, d) with `queries` (see `FusedLayer.ablation_candidates`)."""
        return self.layers[layer].ablation_candidates(x, layer_inputs(mask, layer), slots, queries)

    @staticmethod
    def tile_mask(mask: Any, count: int, batch: int) -> Any:
        """The mask as `embed` returned it for a batch of `batch` rows, for `count` copies of that batch stacked
        copy-major on the batch axis (candidates scored as streams): per-example parts repeated, shared ones kept."""
        return repeat_rows(mask, count, batch)

    def classify(self, hidden: Tensor, inputs: dict[str, Any]) -> Tensor:
        """Each member's head (final norm, pooler, classifier) on its last-layer states hidden (M, B, T|q, d):
        logits (M, B, C), or pooled outputs (M, B, D) for encoders."""
        return self.outer.head(hidden, inputs)

    def run_layers(self, x: Tensor, mask: Tensor | None, start: int = 0, queries: int | None = None) -> Tensor:
        """Layers `start`.. on member streams x (M or 1, B, T, d) -> (M, B, T, d), or (M, B, q, d) when the last
        layer computes only the first `queries` = q tokens (what the head reads).

        Shared trunk: the leading layers that are the same function for every member (same heads, same
        weights) run once on a single stream, which is only then copied out to the M members.
        """
        last = len(self.layers) - 1
        for index in range(start, len(self.layers)):
            if index >= self.trunk:
                x = x.expand(self.num_members, *x.shape[1:])
            x = self.layers[index](x, layer_inputs(mask, index), queries if index == last else None)
        return x.expand(self.num_members, *x.shape[1:])

    # ---- saving ----

    def export_onnx(self, path: str | os.PathLike, example_inputs: dict[str, Any]) -> Path:
        """Write this ensemble as an ONNX graph (dynamic batch and sequence length) returning member logits
        (B, M, C): `hydra_ensembles.export.export_onnx`, which says what the graph takes and needs."""
        from ..export import export_onnx  # export imports this module

        return export_onnx(self, path, example_inputs)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write `hydra_config.json` and `model.safetensors` to `path`, atomically (a crash keeps the old save)."""

        def write(tmp: Path) -> None:
            state = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()}
            safetensors.torch.save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
            write_json_atomic(tmp / CONFIG_NAME, self._saved_config())

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> HydraEnsemble:
        """Load an ensemble written by `save_pretrained`; it returns outputs identical to the saved one."""
        with reading_dir(path, "saved Hydra Ensemble") as path:
            if not (path / CONFIG_NAME).is_file():
                raise FileNotFoundError(
                    f"{str(path)!r} has no {CONFIG_NAME}: it is not a saved Hydra Ensemble.{saved_inside(path)}"
                )
            saved = json.loads((path / CONFIG_NAME).read_text())
            state = read_safetensors(path / WEIGHTS_NAME, device)
        if saved.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{str(path)!r} holds a Hydra Ensemble of format version {saved.get('format_version')!r}, written by "
                f"hydra-ensembles {saved.get('library_version', 'of an unknown version')}; this is {__version__}, "
                f"which reads format {FORMAT_VERSION}: load it with the version that wrote it, or fuse its members "
                "again with this one."
            )
        if not hasattr(transformers, saved["model_class"]):
            raise ValueError(
                f"{str(path)!r} is an ensemble of {saved['model_class']}, which transformers "
                f"{transformers.__version__} does not have: install the transformers version it was fused with."
            )
        adapter = adapter_by_name(saved["adapter"])
        model_class = getattr(transformers, saved["model_class"])
        config = model_class.config_class.from_dict(saved["model_config"])
        head_maps = [{int(layer): heads for layer, heads in h.items()} for h in saved["head_maps"]]
        skeleton, layer_kwargs = _skeleton(model_class, config, adapter, absent=saved.get("absent", []))
        layers = []
        for index in range(len(head_maps[0])):
            prefix = f"layers.{index}."
            tensors = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            kept = [head_map[index] for head_map in head_maps]
            layers.append(FusedLayer(tensors, kept_heads=kept, **layer_kwargs[index]))
        shared = TensorStore.from_state(state, "outer.shared.")
        member = TensorStore.from_state(state, "outer.member.")
        outer = OuterModules(adapter, skeleton, shared, member, set(saved["parameters"]))
        averaged = saved.get("averaged", [])
        return cls(
            adapter, model_class, config, outer, layers, head_maps, saved["mlp"], saved["fingerprint"], averaged
        ).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        """What the ensemble saved at `path` is, from its config alone: "a fused ensemble of 3 members"."""
        members = len(json.loads((path / CONFIG_NAME).read_text())["head_maps"])
        return f"a fused ensemble of {members} member{'s' if members != 1 else ''}"

    def _saved_config(self) -> dict[str, Any]:
        parameters = self.outer.shared.parameter_names() + self.outer.member.parameter_names()
        return {
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "adapter": self.adapter.name,
            "model_class": self.model_class.__name__,
            "model_config": self.model_config.to_dict(),
            "mlp": self.mlp,
            "head_maps": [{str(layer): heads for layer, heads in h.items()} for h in self.head_maps],
            "fingerprint": self.fingerprint,
            "averaged": self.averaged,
            "parameters": sorted(parameters),
        } | ({"absent": absent} if (absent := _absent(self.adapter, self.outer.skeleton)) else {})

    def extra_repr(self) -> str:
        counts = [[len(h[layer]) for h in self.head_maps] for layer in range(len(self.layers))]
        return (
            f"model={self.model_class.__name__}, members={self.num_members}, mlp={self.mlp}, heads per layer={counts}"
        )


def lay_out_for_device(model: nn.Module) -> nn.Module:
    """`model` with every fused ensemble in it laid out for the device its weights are on
    (`HydraEnsemble.set_layout("auto")`): after moving a model fused or loaded on a CPU to a GPU. Returns `model`."""
    for module in model.modules():
        if isinstance(module, HydraEnsemble):
            module.set_layout("auto")
    return model


def _check_members(members: Sequence[nn.Module], mlp: str) -> None:
    if mlp not in ("average", "stack"):
        raise ValueError(f"mlp must be 'average' or 'stack', got {mlp!r}.")
    if isinstance(members, nn.Module) or not members:
        raise ValueError("fuse needs a non-empty list of member models (see hydra_ensembles.build_members).")
    for member in members:
        get_adapter(member)  # raises for unsupported classes
    classes = sorted({type(m).__name__ for m in members})
    if len(classes) > 1:
        raise ValueError(f"members mix model classes {classes}: fuse members of one class.")
    fingerprints = [base_fingerprint(m) for m in members]
    if len(set(fingerprints)) > 1:
        raise ValueError(
            f"members come from different base models (fingerprints {fingerprints}): a Hydra Ensemble fuses "
            "pruned copies of one checkpoint. If a member is an unpruned model you fine-tuned, call "
            "hydra_ensembles.prune_heads(base, {}) on the base before copying it, to record its fingerprint."
        )
    adapter = get_adapter(members[0])
    if refusal := adapter.fusion_unsupported(members[0]):
        raise ValueError(f"{classes[0]} cannot be fused: {refusal}.")
    for member in members:  # the engine reads each projection's weight: a LoRA wrapper's B A would be lost
        blocks = [adapter.block(layer) for layer in adapter.layers(member)]
        check_plain_linears(
            linear for b in blocks for linear in (b.query, b.key, b.value, b.output, b.mlp_in, b.mlp_out)
        )
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        values = [getattr(adapter.config(m), field, None) for m in members]
        if len(set(values)) > 1:
            raise ValueError(
                f"members have different architectures: {field} = {values}; prune every member from one "
                "checkpoint (he.build_members)."
            )
    if adapter.is_classifier(members[0]) and (mismatch := class_mismatch(members)):
        raise ValueError(f"members have different classifiers: {mismatch}; fine-tune every member on the same classes.")
    if mlp == "average":
        neurons = [kept_neurons(m) for m in members]
        differ = next((m for m in range(1, len(members)) if neurons[m] != neurons[0]), None)
        if differ is not None:
            layer = next(i for i in neurons[0] if neurons[differ].get(i) != neurons[0][i])
            widths = [len(neurons[m][layer]) for m in (0, differ)]
            fix = (
                f"Fusion needs equal MLP widths ({widths[0]} and {widths[1]} neurons there): prune"
                if widths[0] != widths[1]
                else "Use mlp='stack' (exact), or prune"
            )
            raise ValueError(
                f"members 0 and {differ} keep different MLP neurons (layer {layer}): averaging their MLPs would "
                f"average different neurons. {fix} the neurons of the base before building members (every member "
                "then keeps the same)."
            )
    placements = {(p.device, p.dtype) for m in members for p in m.parameters()}
    if len(placements) > 1:
        raise ValueError(f"members sit on different devices/dtypes {sorted(map(str, placements))}; move them to one.")


def _check_not_identical(members: Sequence[nn.Module]) -> None:
    """Refuse two members with the same kept heads and the same weights: they add nothing but cost."""
    states = [m.state_dict() for m in members]
    maps = [kept_heads(m) for m in members]
    for j in range(len(members)):
        for i in range(j):
            if maps[i] == maps[j] and all(torch.equal(states[i][k], states[j][k]) for k in states[i]):
                raise ValueError(
                    f"members {i} and {j} are identical (same heads, same weights): an ensemble of copies has no "
                    "diversity. Make members with hydra_ensembles.sample_members (distinct by construction) or "
                    "fine-tune them with different seeds; pass allow_identical=True if copies are what you want."
                )


def fusion_deviation(
    ensemble: HydraEnsemble, members: Sequence[nn.Module], loader: Iterable[Batch], max_examples: int | None = 256
) -> dict[str, float]:
    """How far the fused ensemble is from its members run one by one, on (the first `max_examples` of) `loader`.

    Returns {"logits": max |z_fused - z_member|, "probs": max |p_fused - p_members| (ensemble probabilities),
    "examples": inputs compared}. Zero up to float rounding for mlp="stack" and for members that share their
    MLPs; the paper's merged MLP (mlp="average") after separate fine-tuning is an approximation measured here.
    """
    # in another order, an exact ensemble would read as an approximation
    ensemble.check_in_order(members, "model", "give the members in the order they were fused")
    adapter = get_adapter(members[0])
    worst = {"logits": 0.0, "probs": 0.0, "examples": 0}
    with torch.no_grad():
        for batch in loader:
            inputs, _ = split_batch(adapter, batch)
            if max_examples is not None:
                left = max_examples - worst["examples"]
                if left <= 0:
                    break
                inputs = {k: v[:left] if per_example(v) else v for k, v in inputs.items()}
            device = next(ensemble.parameters()).device
            fused = ensemble(**to_device(inputs, device))
            # each member where it is (the CLI moves the ensemble alone to a GPU)
            outputs = [_member_output(adapter, m, to_device(inputs, next(m.parameters()).device)) for m in members]
            one_by_one = torch.stack([out.to(device) for out in outputs], dim=1)  # (B, M, C|D)
            got = fused.member_logits if ensemble.is_classifier else fused.member_pooled  # (B, M, C) or (B, M, D)
            worst["logits"] = max(worst["logits"], (got - one_by_one).abs().max().item())
            if ensemble.is_classifier:
                gap = (ensemble_probs(got.double()) - ensemble_probs(one_by_one.double())).abs().max().item()
                worst["probs"] = max(worst["probs"], gap)
            worst["examples"] += len(got)
    if worst["examples"] == 0:
        raise ValueError("the loader is empty: nothing to compare the fused ensemble with its members on.")
    return worst


def _member_output(adapter: Adapter, member: nn.Module, inputs: dict) -> Tensor:
    with evaluating(member):
        return adapter.output(member, inputs)


def _clean_config(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    return clear_structures(copy.deepcopy(config))


def _absent(adapter: Adapter, skeleton: nn.Module, member: nn.Module | None = None) -> list[str]:
    """The backbone modules of `skeleton` that `member` was built without (`add_pooling_layer=False`: no
    pooler; HF then holds None, not a module); without `member`, those the skeleton holds as None."""
    backbone = adapter.backbone(skeleton)
    if member is None:
        return sorted(name for name, module in backbone._modules.items() if module is None)
    other = adapter.backbone(member)
    return sorted(name for name, module in backbone._modules.items() if module and getattr(other, name, 0) is None)


def _skeleton(
    model_class: type,
    config: transformers.PretrainedConfig,
    adapter: Adapter,
    *,
    like: nn.Module | None = None,
    absent: Sequence[str] = (),
) -> tuple[nn.Module, list[dict[str, Any]]]:
    """Build `model_class` on the meta device (no memory) without its layers and what runs beside them (an
    `InputConv`: fused layers hold it), nor the backbone modules the members were built without (`absent`, or
    those `like`, a member, lacks: a pooler), and read the constants fusion needs, one dict per layer."""
    config = _clean_config(config)
    with torch.device("meta"):
        model = model_class(config)
    for name in _absent(adapter, model, like) if like is not None else absent:
        setattr(adapter.backbone(model), name, None)
    blocks = [adapter.layer_block(model, index) for index in range(adapter.num_layers(model))]
    block = blocks[0]
    shared = {
        "head_dim": adapter.head_dim(model),
        "scaling": adapter.scaling(model),
        "norm_position": adapter.norm_position,
        "eps": (getattr(block.norm1, "eps", block.norm2.eps), block.norm2.eps),  # ModernBERT: an Identity norm1
        "activation": block.activation,
        "num_heads": adapter.num_heads(model),
        "projections": len(block.fused_rows()),
        "biased": tuple(linear.bias is not None for linear, _ in block.fused_rows()),
    }
    backbone = adapter.backbone(model)
    for beside in {b.input_conv.path for b in blocks if b.input_conv is not None}:
        parent, _, name = beside.rpartition(".")
        setattr(backbone.get_submodule(parent), name, None)  # as HF models without it hold it
    backbone.set_submodule(adapter.layers_path, nn.ModuleList())
    return model.eval(), [shared | {"conv": ConvConstants.of(b.input_conv)} for b in blocks]


def _outer_tensors(
    adapter: Adapter, skeleton: nn.Module, members: Sequence[nn.Module], mlp: MLPMode
) -> tuple[dict[str, Tensor], dict[str, Tensor], set[str], list[str]]:
    """Split the members' non-layer tensors into shared ones and per-member stacks.

    Heads (everything outside the embeddings) are always per member. Embeddings are shared when identical;
    otherwise averaged (mlp="average") or stacked (mlp="stack"). Also returns the names of those averaged.
    """
    parameters = {name for name, _ in skeleton.named_parameters()}
    names = sorted(parameters | {name for name, _ in skeleton.named_buffers()})
    embedding_prefixes = adapter.embedding_prefixes(skeleton)
    states = [dict(m.named_parameters()) | dict(m.named_buffers()) for m in members]
    shared: dict[str, Tensor] = {}
    member: dict[str, Tensor] = {}
    averaged: list[str] = []
    with torch.no_grad():
        for name in names:
            tensors = [state[name].detach() for state in states]
            shapes = sorted({tuple(t.shape) for t in tensors})
            if len(shapes) > 1:
                raise ValueError(
                    f"members differ in the shape of {name}: {shapes}; they need one architecture and classifier."
                )
            if not name.startswith(embedding_prefixes):
                member[name] = torch.stack(tensors)  # (M, ...): heads are always per member
                continue
            combined, approximate = share_average_or_stack({name: tensors}, mlp)
            if combined[name].shape[0] == 1:
                shared[name] = combined[name][0]
            else:
                member[name] = combined[name]
            averaged += [name] if approximate else []
    return shared, member, parameters, averaged


def keep_frozen(source: nn.Module, grown: nn.Module) -> None:
    """Freeze in `grown` (a student grown from `source`, its parameters new) every parameter `source` had frozen,
    by name; the rest train."""
    frozen = {name for name, p in source.named_parameters() if not p.requires_grad}
    for name, p in grown.named_parameters():
        p.requires_grad_(name not in frozen)
