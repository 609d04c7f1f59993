"""Data: loader handling shared by every step, and the real offline data sets the demo uses."""

from .loaders import Batch, check_shapes, materialize, split_batch, to_device

__all__ = ["Batch", "check_shapes", "materialize", "split_batch", "to_device"]
