"""Bundled CPU workloads: the demo's default."""
