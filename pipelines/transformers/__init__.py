"""Adapters of transformers checkpoints: causal LMs, masked-diffusion LMs and vision-language
models, on the shared ``TransformersPolicy`` (``base.py``)."""
