"""The adapter interface: where one model family keeps its heads, norms, MLP and classifier.

Pruning, head importance, fusion and cost accounting are written once against this interface. An adapter is
mostly a name map (`LayerNames`) plus three small functions: `embed` (what runs before the first layer),
`attention_mask` (which keys each query may see) and one head function per supported model class (what runs
after the last layer). Adding an architecture means adding one adapter module; see docs/adapters.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

Inputs = Mapping[str, Tensor]
HeadFn = Callable[[nn.Module, Tensor, Inputs], Tensor]


@dataclass(frozen=True)
class LayerNames:
    """Dotted paths, relative to one transformer layer, of everything fusion and pruning touch."""

    query: str
    key: str
    value: str
    output: str
    norm1: str  # pre-norm: LN before attention; post-norm: LN after the attention residual
    norm2: str  # pre-norm: LN before the MLP;     post-norm: LN after the MLP residual
    mlp_in: str
    mlp_out: str
    activation: str  # attribute path of the MLP non-linearity (a callable)
    attention: str  # the module whose head-count attributes must follow pruning
    head_count_attrs: tuple[str, ...]  # attributes of `attention` that equal the number of heads
    width_attrs: tuple[str, ...] = ()  # attributes of `attention` that equal heads * head_dim
    scale1: str | None = None  # layer-scale vector on the attention branch (DINOv2), if any
    scale2: str | None = None  # layer-scale vector on the MLP branch
    # query, key and value name one Linear d -> 3*H*dh with rows [q | k | v], each grouped per head (ModernBERT)
    fused_qkv: bool = False
    # mlp_in is d -> 2F with rows [input | gate]: neuron k is rows k and F + k together (GeGLU, ModernBERT)
    gated_mlp: bool = False
    # further linears with output rows grouped per head like `query` (DeBERTa's position projections): pruned with
    # their heads; a path a layer lacks is skipped
    head_rows: tuple[str, ...] = ()


class LayerAttention(NamedTuple):
    """What one layer's attention takes besides its input, for families whose layers differ in it.

    mask: bool, True = may attend: (B, 1, 1|T, T) or (T, T), or None for full attention.
    rotary: (cos, sin), each (1|B, T, dh): rotary position embeddings rotated into every head's q and k, or None.
    positions: (P, d), a table of position embeddings that every head projects through its own query and key
        projections (DeBERTa's relative-distance table), or None; (M, P, d) in the fused engine when the members'
        embeddings differ (each member's heads project its own table).
    score_bias: `score_bias(q, k, pos_q, pos_k)` -> the additive scores (..., H, T, T) of each head, from its q and
        k (..., H, T, dh) (all T query rows) and its projections of `positions`, pos_q and pos_k (..., H, P, dh)
        (the leading axes broadcast; None where `position_blocks` names none); the engine adds them to
        q.k * scaling before the softmax. None: no bias.
    position_blocks: which of a head's projections make pos_q and pos_k: 0, 1, 2 its query, key and value, 3...
        the `Block.position_projections` the layer has, in order; None for none.
    """

    mask: Tensor | None
    rotary: tuple[Tensor, Tensor] | None = None
    positions: Tensor | None = None
    score_bias: Callable[[Tensor, Tensor, Tensor | None, Tensor | None], Tensor] | None = None
    position_blocks: tuple[int | None, int | None] = (0, 1)


class InputConv(NamedTuple):
    """A convolution over a layer's input x (B, T, d), mixed into the layer's output y (B, T, d) (DeBERTa-v2's
    `ConvLayer` after layer 0): norm(y + act(conv(x) zeroed at padding)) * mask, mask (B, T) the padding mask.
    conv: Conv1d d -> d, kernel k, padding (k - 1) // 2, any groups; `path`: where the HF module holding it sits,
    relative to the backbone (fusion keeps it with the layer, not with the modules around the layers)."""

    conv: nn.Conv1d
    norm: nn.LayerNorm
    activation: Callable[[Tensor], Tensor]
    path: str


@dataclass
class Block:
    """One layer's modules as fusion reads them (the live HF modules, not copies).

    Shapes: d = hidden size, H = heads currently in the layer, dh = head size, F = MLP width.
    query/key/value: Linear d -> H*dh (rows grouped per head), or with fused_qkv one Linear d -> 3*H*dh (rows
    [q | k | v]) for all three; output: Linear H*dh -> d (columns per head); mlp_in: Linear d -> F, or with
    gated_mlp d -> 2F (rows [input | gate]); mlp_out: Linear F -> d; scale1/scale2: (d,) layer-scale vectors or None.
    A Linear or LayerNorm may lack its bias (ModernBERT); norm1 may be an Identity (ModernBERT's first layer).
    position_projections: further Linears d -> H*dh with rows grouped per head that the layer applies to a
    position table, not to its input (`LayerNames.head_rows`: DeBERTa's pos_key_proj, pos_query_proj).
    input_conv: a convolution the model runs beside this layer (`InputConv`), or None (`Adapter.layer_block`).
    """

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear
    norm1: nn.LayerNorm | nn.Identity
    norm2: nn.LayerNorm
    mlp_in: nn.Linear
    mlp_out: nn.Linear
    activation: Callable[[Tensor], Tensor]
    scale1: Tensor | None
    scale2: Tensor | None
    fused_qkv: bool = False
    gated_mlp: bool = False
    position_projections: tuple[nn.Linear, ...] = ()
    input_conv: InputConv | None = None

    def fused_rows(self) -> tuple[tuple[nn.Linear, slice], ...]:
        """What fusion keeps per head: `projection_rows`, then each position projection whole."""
        return self.projection_rows() + tuple((linear, slice(None)) for linear in self.position_projections)

    def projection_rows(self) -> tuple[tuple[nn.Linear, slice], ...]:
        """Where the query, key and value projections sit: (Linear, its rows) for each, in that order; the three
        row blocks of one Linear when fused_qkv."""
        if not self.fused_qkv:
            return tuple((linear, slice(None)) for linear in (self.query, self.key, self.value))
        width = self.query.out_features // 3  # H*dh
        return tuple((self.query, slice(j * width, (j + 1) * width)) for j in range(3))

    def mlp_in_rows(self, neurons: Tensor) -> Tensor:
        """Rows of mlp_in that make the MLP neurons at `neurons` (positions in the current width F, shape (K,)):
        the neurons' own rows, and with gated_mlp their gates' rows F + k after them, (2K,)."""
        if not self.gated_mlp:
            return neurons
        return torch.cat([neurons, neurons + self.mlp_out.in_features])


@dataclass(frozen=True)
class ModelSpec:
    """How one supported HF model class is laid out around its encoder.

    backbone: dotted path of the encoder (embeddings + layers) inside the model, "" for the model itself.
    head: `head(model, hidden, inputs) -> Tensor` maps the last layer's output (B, T, d) to what the model
        returns: logits (B, C) for a classifier, a pooled embedding (B, D) for an encoder.
    classifier: whether `head` returns class logits.
    head_tokens: how many leading tokens `head` reads ([CLS] only: 1), so that the last layer need not compute
        the others; None when it reads every token (mean pooling, the end-of-text token).
    """

    backbone: str
    head: HeadFn
    classifier: bool
    head_tokens: int | None = None


class Adapter(ABC):
    """One model family. Subclasses fill in the class attributes and implement `embed`.

    Class attributes:
        name: family name used in saved files ("bert", "vit", ...).
        norm_position: "pre" (LN -> attention -> residual, as ViT/CLIP) or "post" (attention -> residual -> LN,
            as BERT).
        layer_names: where a layer keeps its projections, norms and MLP.
        layers_path: dotted path of the `nn.ModuleList` of layers, relative to the backbone.
        embedding_paths: dotted paths, relative to the backbone, of every module `embed` uses.
        input_names: the keyword inputs the family's models accept (others are rejected; "labels" is ignored).
        required_inputs: the subset that must be present.
        causal: whether attention is causal (CLIP's text tower).
        prompt_padding: the tokenizer's `padding` for a text tower's zero-shot prompts: True (to the batch's
            longest, for towers that mask padding and pool a token they find) or "max_length" (SigLIP's text
            tower pools the last position, so its embeddings depend on the padded length: pad as it was trained).
        head_dim_field: the config field the family's attention reads its head size from, if any ("head_dim" for
            ViT and DINOv2, "attention_head_size" for DeBERTa-v2); the others use hidden_size // heads whatever
            the config says.
        specs: supported HF class name -> `ModelSpec`.
    Override `fusion_unsupported` for models the fused engine cannot run.
    """

    name: ClassVar[str]
    norm_position: ClassVar[Literal["pre", "post"]]
    layer_names: ClassVar[LayerNames]
    layers_path: ClassVar[str]
    embedding_paths: ClassVar[tuple[str, ...]]
    input_names: ClassVar[tuple[str, ...]]
    required_inputs: ClassVar[tuple[str, ...]]
    causal: ClassVar[bool] = False
    prompt_padding: ClassVar[bool | str] = True
    head_dim_field: ClassVar[str | None] = None
    specs: ClassVar[dict[str, ModelSpec]]

    def fusion_unsupported(self, model: nn.Module) -> str | None:
        """Why the fused engine cannot run `model` (`HydraEnsemble.fuse` refuses with it); None when it can."""
        return None

    # ---- what runs before the first layer and after the last one ----

    @abstractmethod
    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        """Hidden states entering layer 0, shape (B, T, d), exactly as the HF forward computes them."""

    def attention_mask(self, inputs: Inputs, seq_len: int) -> Tensor | None:
        """Boolean mask (True = may attend) broadcastable to (B, heads, T, T), or None for full attention.

        Text families turn the (B, T) padding mask into (B, 1, 1, T); causal families also apply a lower
        triangle, giving (B, 1, T, T).
        """
        padding = inputs.get("attention_mask")
        keys = None if padding is None else padding.bool()[:, None, None, :]  # (B, 1, 1, T)
        if not self.causal:
            return keys
        device = inputs["input_ids"].device  # causal families are text families
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()  # (T, T)
        return causal if keys is None else causal & keys

    # ---- locating things inside a model ----

    def supported_class(self, model_class: type) -> type:
        """The nearest class in `model_class`'s MRO that this adapter supports."""
        for cls in model_class.__mro__:
            if cls.__name__ in self.specs:
                return cls
        raise KeyError(model_class.__name__)

    def spec(self, model: nn.Module) -> ModelSpec:
        return self.specs[self.supported_class(type(model)).__name__]

    def backbone_path(self, model: nn.Module) -> str:
        return self.spec(model).backbone

    def backbone(self, model: nn.Module) -> nn.Module:
        path = self.backbone_path(model)
        return model.get_submodule(path) if path else model

    def full_path(self, model: nn.Module, path: str) -> str:
        prefix = self.backbone_path(model)
        return f"{prefix}.{path}" if prefix else path

    def embedding_prefixes(self, model: nn.Module) -> tuple[str, ...]:
        """Parameter-name prefixes of the embeddings inside `model`, e.g. ("bert.embeddings.",)."""
        return tuple(self.full_path(model, path) + "." for path in self.embedding_paths)

    def locate(self, model: nn.Module, parameter: str) -> tuple[str, int | None]:
        """Where a parameter (by its name in `model`) sits: ("embeddings", None), ("layer", index) or
        ("head", None) for everything after the layers (final norm, pooler, classifier)."""
        if parameter.startswith(self.embedding_prefixes(model)):
            return "embeddings", None
        layers = self.full_path(model, self.layers_path) + "."
        if parameter.startswith(layers):
            return "layer", int(parameter[len(layers) :].split(".")[0])
        return "head", None

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return self.backbone(model).get_submodule(self.layers_path)

    def is_classifier(self, model: nn.Module) -> bool:
        return self.spec(model).classifier

    def head(self, model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
        """Logits (B, C) or pooled embedding (B, D) from the last layer's output `hidden` (B, T, d)."""
        return self.spec(model).head(model, hidden, inputs)

    def output(self, model: nn.Module, inputs: Inputs) -> Tensor:
        """Run the HF model itself and return the tensor `head` stands for (logits or pooled embedding)."""
        out = model(**inputs)
        for field in ("logits", "text_embeds", "image_embeds", "pooler_output"):
            value = getattr(out, field, None)
            if value is not None:
                return value
        return out.last_hidden_state[:, 0]

    # ---- sizes ----

    def num_layers(self, model: nn.Module) -> int:
        return len(self.layers(model))

    def config(self, model: nn.Module) -> PretrainedConfig:
        """The encoder's own config (for CLIPForImageClassification, the vision tower's)."""
        return self.backbone(model).config

    def num_heads(self, model: nn.Module) -> int:
        """Heads per layer of the unpruned architecture."""
        return int(self.config(model).num_attention_heads)

    def head_dim(self, model: nn.Module) -> int:
        """The head size as the family's attention computes it (a `head_dim` in a BERT config is not read by BERT,
        and trusting it would cut or zero part of a head)."""
        config = self.config(model)
        field = getattr(config, self.head_dim_field, None) if self.head_dim_field else None
        return int(field or config.hidden_size // config.num_attention_heads)

    def scaling(self, model: nn.Module) -> float:
        return self.head_dim(model) ** -0.5

    # ---- one layer ----

    def block(self, layer: nn.Module) -> Block:
        names = self.layer_names
        get = layer.get_submodule
        return Block(
            query=get(names.query),
            key=get(names.key),
            value=get(names.value),
            output=get(names.output),
            norm1=get(names.norm1),
            norm2=get(names.norm2),
            mlp_in=get(names.mlp_in),
            mlp_out=get(names.mlp_out),
            activation=_get_attr(layer, names.activation),
            scale1=_get_attr(layer, names.scale1) if names.scale1 else None,
            scale2=_get_attr(layer, names.scale2) if names.scale2 else None,
            fused_qkv=names.fused_qkv,
            gated_mlp=names.gated_mlp,
            position_projections=tuple(self.head_row_linears(layer).values()),
        )

    def layer_block(self, model: nn.Module, index: int) -> Block:
        """Layer `index` of `model` as fusion reads it: its `block`, with what the model runs beside the layer and
        fusion keeps with it (a family's override: DeBERTa-v2's convolution after layer 0)."""
        return self.block(self.layers(model)[index])

    def head_row_linears(self, layer: nn.Module) -> dict[str, nn.Linear]:
        """The further per-head projections (`LayerNames.head_rows`) that `layer` has, by path."""
        found = {}
        for path in self.layer_names.head_rows:
            try:
                found[path] = layer.get_submodule(path)
            except AttributeError:  # DeBERTa: no pos_key_proj with share_att_key or without c2p
                continue
        return found

    def attention_bias(self, backbone: nn.Module, seq_len: int) -> Tensor | None:
        """An additive bias that every layer adds to its attention scores, one plane per original head,
        (H, T, T), computed once before the first layer from tensors under `embedding_paths` (MPNet's relative
        position bias); None for families without one."""
        return None

    def layer_attention(self, backbone: nn.Module, inputs: Inputs, seq_len: int) -> list[LayerAttention] | None:
        """One `LayerAttention` per layer, for families whose layers differ in their masks or take rotary
        positions (ModernBERT: sliding-window masks in its local layers, a rotary table per layer type), computed
        once before the first layer from tensors under `embedding_paths` that all members share. Families that
        override it get these in place of `attention_mask` (and `attention_bias`); None: they do not."""
        return None

    def set_projections(
        self,
        layer: nn.Module,
        projections: tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear],
        num_heads: int,
        kept: Sequence[int] | None = None,
    ) -> None:
        """Swap in re-sized (query, key, value, output) projections and update the head-count attributes.
        `kept`: the original indices of the heads the layer keeps (empty for a placeholder head). With fused_qkv,
        query, key and value are one Linear (d -> 3*H'*dh)."""
        names = self.layer_names
        for path, module in zip((names.query, names.key, names.value, names.output), projections):
            layer.set_submodule(path, module)
        attention = layer.get_submodule(names.attention)
        for attr in names.head_count_attrs:
            setattr(attention, attr, num_heads)
        for attr in names.width_attrs:
            setattr(attention, attr, projections[0].out_features // (3 if names.fused_qkv else 1))

    def set_mlp(self, layer: nn.Module, mlp_in: nn.Linear, mlp_out: nn.Linear) -> None:
        """Swap in re-sized MLP linears (d -> F', F' -> d)."""
        layer.set_submodule(self.layer_names.mlp_in, mlp_in)
        layer.set_submodule(self.layer_names.mlp_out, mlp_out)


def _get_attr(root: object, path: str) -> object:
    value = root
    for part in path.split("."):
        value = getattr(value, part)
    return value
