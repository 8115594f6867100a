"""Exponential moving average of the trainable weights, used for evaluation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class EMA:
    """``shadow <- decay * shadow + (1 - decay) * param`` every ``every`` optimizer steps.

    Args:
        network: the unwrapped network whose trainable parameters are averaged.
        decay: EMA decay (Flow-GRPO: 0.9).
        every: update interval in optimizer steps (Flow-GRPO: 8).
    """

    def __init__(self, network: nn.Module, decay: float, every: int = 1) -> None:
        self.decay = decay
        self.every = every
        self.params = {n: p for n, p in network.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def step(self, optimizer_step: int) -> None:
        if optimizer_step % self.every:
            return
        for name, param in self.params.items():
            if self.shadow[name].device != param.device:  # the network moved (e.g. to a GPU)
                self.shadow[name] = self.shadow[name].to(param.device)
            self.shadow[name].lerp_(param.detach(), 1 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Temporarily give the network the EMA weights (e.g. for evaluation, or the forwards
        of a lagged policy). The parameters' storage is exchanged with the shadow's, not copied:
        no extra memory and no copy of a full fine-tune's weights. Inside the context the
        shadow holds the live weights, so ``step`` and ``state_dict`` must not be called."""
        with torch.no_grad():
            for name, param in self.params.items():
                if self.shadow[name].device != param.device:
                    self.shadow[name] = self.shadow[name].to(param.device)
                self.shadow[name], param.data = param.data, self.shadow[name]
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    self.shadow[name], param.data = param.data, self.shadow[name]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().clone() for n, t in self.shadow.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for n in self.shadow:
            self.shadow[n].copy_(state[n])
