"""Kiln's leaf package: what every other package may import and that imports nothing of Kiln's
(the error root and the version). Keeping it a leaf keeps the package graph free of cycles."""
