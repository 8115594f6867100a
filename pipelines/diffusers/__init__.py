"""Adapters of diffusers checkpoints, one file per model family, on the shared flow adapter
``flow_image.py``."""
