"""Parameters and FLOPs of a ViT-B/16 configuration (random weights, 1000 classes): single model, three pruned
members with 8 of 12 heads in every layer, and their fused Hydra Ensemble. Compare with the paper's Table 7.

    python benchmarks/cost_vit_b16.py
"""

import torch
import transformers as T

import hydra_ensembles as he


def main() -> None:
    torch.manual_seed(0)
    single = T.ViTForImageClassification(T.ViTConfig(image_size=224, patch_size=16, num_labels=1000)).eval()
    head_maps = he.sample_members(torch.rand(12, 12), num_members=3, budget=4, pool=12, seed=0)
    members = he.build_members(single, head_maps)
    ensemble = he.HydraEnsemble.fuse(members, mlp="average")
    inputs = {"pixel_values": torch.randn(1, 3, 224, 224)}
    rows = he.cost_table(single, members, ensemble, inputs)
    every_token = he.count_flops(ensemble, inputs | {"output_hidden_states": True})
    rows.append(he.Cost("fused, last layer on all tokens", rows[-1].parameters, every_token))
    print(he.format_cost_table(rows))
    print(
        "\nThe fused ensemble's last layer computes only the [CLS] row its classifiers read; the paper's count (and "
        "the HF models') runs it over all 197 tokens."
    )
    print(
        "\npaper, Table 7 (params / mult-adds): single 86.57M / 17.58G, deep ensemble 259.7M / 52.74G, "
        "Hydra 116.31M / 46.19G"
    )


if __name__ == "__main__":
    main()
