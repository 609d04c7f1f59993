"""The real offline data sets of the demo and the benchmark: BBC News, drug reviews, Reuters (text.py);
Fashion-MNIST, MNIST, digits, solar cells (images.py); fetched from package registries (debian.py)."""
