"""NVIDIA's package repositories as the fleet has them: the toolkit packages, apt and rpm, and their server."""
