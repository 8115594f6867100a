"""Checkpoints (manifests, verified loading, resume on another process layout) and run
directories."""
