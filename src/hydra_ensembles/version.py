"""The library's version: what saved files and run records are stamped with."""

__version__ = "0.1.0"
