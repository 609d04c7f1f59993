"""The API reference builds offline from the docstrings (what scripts/api_docs.sh runs)."""

import subprocess
import sys
from pathlib import Path

BUILD = Path(__file__).parents[1] / "docs" / "build_api.py"


def test_api_reference_builds_from_docstrings(tmp_path):
    subprocess.run([sys.executable, str(BUILD), str(tmp_path)], check=True, capture_output=True)
    index = (tmp_path / "hydra_ensembles.html").read_text()
    assert "taylor_head_scores" in index and "HydraEnsemble" in index
    fusion = (tmp_path / "hydra_ensembles" / "fusion.html").read_text()
    assert "Run all members in one pass" in fusion  # a docstring, rendered
    files = (tmp_path / "hydra_ensembles" / "data" / "files.html").read_text()
    assert "image_batches" in files and "(N, H, W[, C])" in files
    assert (tmp_path / "hydra_ensembles" / "cli" / "predict.html").exists()
