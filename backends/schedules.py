"""Cortex-M schedules (filled in below)."""
ENABLED = False
