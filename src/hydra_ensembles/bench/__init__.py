"""The paper's benchmark (Tables 1-2): tasks on real offline data sets, every baseline and both Hydra Ensembles,
per seed, cached and resumable. Only the CLI imports it; the library never does."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where trained models and fetched data are cached: $HYDRA_ENSEMBLES_CACHE or ~/.cache/hydra-ensembles."""
    return Path(os.environ.get("HYDRA_ENSEMBLES_CACHE", Path.home() / ".cache" / "hydra-ensembles"))
