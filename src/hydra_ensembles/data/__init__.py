"""Data: the batch contract every step reads (loaders.py) and the files users have (files.py)."""

from .loaders import Batch, check_shapes, materialize, split_batch, to_device

__all__ = ["Batch", "check_shapes", "materialize", "split_batch", "to_device"]
