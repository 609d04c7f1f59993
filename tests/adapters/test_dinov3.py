"""DINOv3: rotary positions computed from each image's size, registers, a key without a bias."""

import pytest
import torch
import transformers as T
from conftest import IMAGE, SIZES, fused_output, output, perturb, random_head_maps
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.predictors.card import write_card


@pytest.mark.parametrize("registers", [0, 2])
def test_fused_dinov3_equals_its_members_at_image_sizes_other_than_the_configs(registers):
    """The rotary table follows the image (HF computes it from pixel_values' height and width): a table made for
    config.image_size would rotate the patches of a 24 x 32 or 8 x 12 image wrongly."""
    config = T.DINOv3ViTConfig(**SIZES | IMAGE, layerscale_value=0.5, num_register_tokens=registers)
    model = T.DINOv3ViTModel(config).eval()
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, random_head_maps(3, seed=2)))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    for height, width in ((24, 32), (8, 12), (17, 21)):
        inputs = {"pixel_values": torch.randn(3, 3, height, width, generator=torch.Generator().manual_seed(height))}
        expected = torch.stack([output(m, inputs) for m in members], dim=1)  # (B, M, d)
        assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= CONTRACT


def test_a_model_card_reads_an_image_size_given_as_height_and_width(tmp_path):
    model = T.DINOv3ViTModel(T.DINOv3ViTConfig(**SIZES | IMAGE | {"image_size": [16, 24]})).eval()
    card = write_card(he.prune_heads(model, {0: [1]}), tmp_path)  # its cost: a forward of a probe image
    assert "FLOPs (one input, 1x3x16x24)" in card.read_text()  # the probe as tall and wide as the config says
