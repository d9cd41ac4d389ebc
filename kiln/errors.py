"""Kiln's error types for users: ``except kiln.errors.KilnError`` catches every error Kiln raises
on purpose (defined in the leaf package kiln.common, which every package may import)."""
from kiln.common.errors import CheckFailed, KilnError, UsageError  # noqa: F401
