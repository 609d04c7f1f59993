"""The paper's benchmark (Tables 1-2): tasks on real offline data sets, every baseline and both Hydra Ensembles,
per seed, cached and resumable. Only the CLI imports it; the library never does."""
