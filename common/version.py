"""Kiln's version (one place: the package metadata, kiln.__version__ and generated files read it)."""
__version__ = "0.1.0"
