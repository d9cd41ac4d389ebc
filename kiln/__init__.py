"""Kiln: ahead-of-time neural network toolchain."""
__version__ = "0.1.0"
