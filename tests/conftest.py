"""Shared test setup: single-threaded torch (2-core CI machines) and no network access."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

torch.set_num_threads(1)
