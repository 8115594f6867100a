"""Phase 5 of the loop: minibatches, gradient accumulation, clipping, LR schedule, optimizer and
EMA steps. Knows no algorithm: it asks ``objective.loss`` for each minibatch."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from genrl.data.rng import RolloutNoise, Streams
from genrl.distributed.deepspeed import uses_deepspeed
from genrl.distributed.sharding import full_tensor
from genrl.objectives.base import StepContext
from genrl.objectives.losses import Metrics
from genrl.policies.ema import EMA
from genrl.policies.protocols import Policy
from genrl.reporting.metrics import MeanAccumulator, to_floats
from genrl.run.config import TrainConfig


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN/inf; the message names the loss terms of that minibatch."""


class Updater:
    """Owns the optimizer, the LR schedule and the EMA of one run.

    Args:
        config: the run's configuration (``train`` and ``optim`` sections).
        policy: the adapter, its ``module`` already prepared (``genrl.run.build.build_run``).
        accelerator: the run's ``accelerate.Accelerator``.
        optimizer: the prepared optimizer over the trainable parameters.
        units_per_iteration: training units per iteration on this process (plans the schedule).
    """

    def __init__(
        self,
        config: TrainConfig,
        policy: Policy,
        accelerator: Any,
        optimizer: torch.optim.Optimizer,
        units_per_iteration: int,
    ) -> None:
        o, t = config.optim, config.train
        self.config = config
        self.policy = policy
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.ema = EMA(policy.network, o.ema_decay, o.ema_every) if o.ema_decay else None
        self.planned_units = units_per_iteration
        self.planned_minibatches = math.ceil(units_per_iteration / t.minibatch_size)
        steps_per_epoch = math.ceil(self.planned_minibatches / t.gradient_accumulation_steps)
        self.total_steps = t.iterations * t.inner_epochs * steps_per_epoch
        self.steps = 0

    def lr(self, step: int) -> float:
        """Learning rate of optimizer step ``step``: linear warm-up, then the chosen decay."""
        o = self.config.optim
        if step < o.warmup_steps:
            return o.lr * (step + 1) / o.warmup_steps
        span = max(1, self.total_steps - o.warmup_steps)
        progress = min(1.0, (step - o.warmup_steps) / span)
        if o.lr_schedule == "cosine":
            return o.lr * 0.5 * (1 + math.cos(math.pi * progress))
        if o.lr_schedule == "linear":
            return o.lr * (1 - progress)
        return o.lr

    def update(self, objective: Any, units: Any, noise: RolloutNoise) -> dict[str, float]:
        """``inner_epochs`` passes over ``units`` in shuffled minibatches; returns mean metrics."""
        t, acc = self.config.train, self.accelerator
        accumulate = t.gradient_accumulation_steps
        tracker = MeanAccumulator()
        first_ratios: tuple[torch.Tensor, torch.Tensor] | None = None
        for epoch in range(t.inner_epochs):
            order = noise.local_permutation((Streams.MINIBATCH_ORDER, epoch), len(units))
            chunks = self._minibatches(order)
            tokens = self._tokens_per_minibatch(objective, units, chunks)
            window_losses: list[tuple[int, torch.Tensor, Metrics]] = []
            for k, index in enumerate(chunks):
                # The last accumulation window of an epoch may be shorter: divide by its size.
                window_start = (k // accumulate) * accumulate
                window = min(accumulate, len(chunks) - window_start)
                is_step = k == window_start + window - 1
                sync = contextlib.nullcontext() if is_step else acc.no_sync(self.policy.module)
                step = StepContext(window, tokens[k // accumulate] if tokens else None)
                if k == window_start:
                    self._set_lr()
                # DeepSpeed steps its engine inside ``accelerator.backward`` whenever accelerate's
                # ``sync_gradients`` is set; genrl accumulates itself, so it marks each window's
                # last minibatch as the boundary (elsewhere the flag changes nothing: the
                # optimizer steps only on that minibatch anyway).
                acc.sync_gradients = is_step
                try:
                    with sync, acc.autocast():
                        loss, metrics = objective.loss(self.policy, units.select(index), step)
                        acc.backward(loss / window)
                finally:
                    acc.sync_gradients = True
                if first_ratios is None and "ratio_max" in metrics:
                    first_ratios = (metrics["ratio_min"], metrics["ratio_max"])
                window_losses.append((k, loss.detach(), metrics))
                tracker.add({f"loss/{name}": v for name, v in metrics.items()})
                tracker.add({"loss/total": loss.detach()})
                if is_step:
                    # One synchronisation per optimizer step: no update from a non-finite loss.
                    self._check_finite(window_losses, epoch)
                    window_losses = []
                    tracker.add(self._step())
        out = tracker.means()
        if first_ratios is not None:
            # 0 exactly on an on-policy first update: the porting check of Flow-GRPO's README.
            low, high = (float(r) for r in first_ratios)
            out["loss/first_minibatch_ratio_deviation"] = max(abs(high - 1), abs(low - 1))
        out["train_units"] = float(len(units))
        out["lr"] = self.lr(max(0, self.steps - 1))
        out["optimizer_steps"] = float(self.steps)
        return out

    def _minibatches(self, order: torch.Tensor) -> list[torch.Tensor]:
        """``minibatch_size`` units at a time; an objective that trains fewer units than planned
        (Flow-GRPO leaving zero-advantage trajectories out) still gets the planned number of
        minibatches, smaller ones, so that every process takes the same optimizer steps."""
        size = self.config.train.minibatch_size
        if len(order) >= self.planned_units or len(order) < self.planned_minibatches:
            return list(order.split(size))
        return list(order.tensor_split(self.planned_minibatches))

    def _tokens_per_minibatch(
        self, objective: Any, units: Any, chunks: list[torch.Tensor]
    ) -> list[float]:
        """Per accumulation window, the mean number of loss tokens per minibatch over the window
        and all processes (DAPO's token mean divides by it); empty when the objective does not
        count tokens. One all-reduce per epoch."""
        accumulate = self.config.train.gradient_accumulation_steps
        if not chunks or objective.loss_tokens(units.select(chunks[0])) is None:
            return []  # the loss counts no tokens: nothing to select or reduce
        windows = [chunks[i : i + accumulate] for i in range(0, len(chunks), accumulate)]
        counts = [
            [objective.loss_tokens(units.select(index)) for index in window] for window in windows
        ]
        device = self.accelerator.device
        totals = torch.tensor([float(sum(c)) for c in counts], device=device)
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        processes = self.accelerator.num_processes
        return [
            float(total) / (processes * len(w)) for total, w in zip(totals, windows, strict=True)
        ]

    @staticmethod
    def _check_finite(window: list[tuple[int, torch.Tensor, Metrics]], epoch: int) -> None:
        """Raise ``NonFiniteLossError`` naming the first minibatch of the accumulation window
        whose loss is NaN or infinite, with its loss terms."""
        finite = torch.stack([torch.isfinite(loss) for _, loss, _ in window])
        if bool(finite.all()):
            return
        k, loss, metrics = window[int((~finite).int().argmax())]
        terms = ", ".join(f"{name}={v:.4g}" for name, v in to_floats(metrics).items())
        raise NonFiniteLossError(
            f"the loss is {float(loss)} (epoch {epoch}, minibatch {k}; {terms}); "
            "lower optim.lr or check the reward scale"
        )

    def _set_lr(self) -> None:
        """The LR of the coming optimizer step, set before the window's first backward: under
        DeepSpeed the step happens inside the last backward of the window."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr(self.steps)

    def _step(self) -> dict[str, Any]:
        o = self.config.optim
        params = self.policy.trainable_parameters()
        grad_norm: torch.Tensor | float
        if uses_deepspeed(self.accelerator):
            # The engine clipped (at optim.max_grad_norm, genrl/distributed/deepspeed.py) and stepped
            # in backward; its gradients are partitioned, so only it knows their norm.
            grad_norm = float(self.accelerator.clip_grad_norm_(params, o.max_grad_norm or 0.0) or 0)
        elif o.max_grad_norm is not None:
            grad_norm = self.accelerator.clip_grad_norm_(params, o.max_grad_norm)
        else:
            norms = [p.grad.norm() for p in params if p.grad is not None]
            norms = [full_tensor(n) for n in norms]  # FSDP2: each shard's norm -> the whole's
            grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else 0.0
        if isinstance(grad_norm, torch.Tensor):
            grad_norm = full_tensor(grad_norm)  # a DTensor under FSDP2
        self.optimizer.step()  # a no-op under DeepSpeed (accelerate's wrapper)
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        if self.ema is not None:
            self.ema.step(self.steps)
        return {"grad_norm": grad_norm}
