"""Building a run: every component of training, made in one visible order (``build_run``).

The trainer (``genrl/loop/trainer.py``) drives a ``Run``; scripts and benchmarks that need the parts
without the loop (a rollout to time, an objective to profile) build one the same way. Nothing
is replaced later behind the caller's back: the policy's ``module`` is wrapped by
``accelerator.prepare`` here, in step 6, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genrl.algorithms import ALGORITHMS
from genrl.algorithms.base import Algorithm
from genrl.config.errors import ConfigError
from genrl.distributed.deepspeed import align_config, zero_stage
from genrl.distributed.launch import build_accelerator
from genrl.distributed.processes import process_slice
from genrl.distributed.sharding import env_requests_fsdp, shard_module, shards_itself
from genrl.objectives.base import Objective
from genrl.policies.protocols import Policy
from genrl.prompts.sources import PromptSource, load_prompts
from genrl.rollouts.base import Rollout
from genrl.run.components import build_policy_from, build_reward_from
from genrl.run.config import TrainConfig


@dataclass
class Run:
    """The components of one training run (``build_run`` documents the order).

    Attributes:
        config: the validated configuration.
        accelerator: the run's ``accelerate.Accelerator`` (processes, devices, autocast).
        prompts: training and held-out prompts.
        policy: the adapter, set up for training; ``policy.module`` is the prepared module.
        reward: the weighted composite of the configured reward models.
        algorithm: the registered pairing (``config.algorithm.name``).
        rollout: how samples are made (phase 2).
        objective: advantages, training units and the loss (phases 4 and 5).
        optimizer: AdamW over the trainable parameters, prepared by the accelerator.
        local: this process's slice of every iteration's global batch.
    """

    config: TrainConfig
    accelerator: Any
    prompts: PromptSource
    policy: Policy
    reward: Any
    algorithm: Algorithm
    rollout: Rollout[Any, Any]
    objective: Objective[Any, Any, Any]
    optimizer: torch.optim.Optimizer
    local: slice


def build_run(config: TrainConfig, accelerator: Any = None) -> Run:
    """Validate ``config`` and build its components: 1. prompts (a bad prompt file fails before
    any model loads), 2. the policy with its weights, 3. its training setup (LoRA or full
    fine-tuning, once, seeded from ``config.seed`` without touching the caller's RNG), 4. the
    rewards on this process's device, 5. the algorithm's rollout and objective bound to the
    policy (which checks the policy's kind), and the reference copy when either of them uses
    the reference under full fine-tuning (``Policy.keep_reference``), 6. the optimizer, with the policy's module and the
    optimizer prepared by the accelerator (DDP, FSDP or DeepSpeed wrapping happens here)."""
    accelerator = accelerator or build_accelerator(config.train.mixed_precision)
    config.validate(accelerator.num_processes)

    # 1. Prompts.
    pc = config.prompts
    prompts = load_prompts(pc.dataset, pc.eval_dataset, pc.column)
    # 2-3. The policy, made trainable once.
    p = config.policy
    policy = build_policy_from(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy.setup_training(p.lora_rank, p.lora_alpha, p.lora_target_modules)
    # 4. Rewards.
    reward = build_reward_from(config, accelerator.device)
    # 5. Rollout and objective.
    algorithm = ALGORITHMS[config.algorithm.name](config.algorithm, config)
    rollout, objective = algorithm.build(policy)
    # The reference exists only when something uses it: under full fine-tuning a frozen copy of
    # the weights (none at kl_beta=0); an offline store is filled by the reference policy.
    if rollout.uses_reference or objective.uses_reference or config.train.offline_store:
        policy.keep_reference(offload=p.reference_offload)
    # 6. Optimizer; the accelerator wraps the module and the optimizer, except where genrl
    # shards the module itself (FSDP2 on CPU processes, genrl/distributed/sharding.py): that happens
    # before the optimizer is made, so that it holds the sharded parameters.
    sharded = shards_itself(accelerator)
    if (env_requests_fsdp() or zero_stage(accelerator) == 3) and config.optim.ema_decay:
        # EMA swaps parameter storage, which FSDP2's own shard buffers never see, and ZeRO-3
        # leaves empty placeholders in the parameters.
        raise ConfigError(
            "optim.ema_decay is not supported with FSDP or DeepSpeed ZeRO-3 yet (its EMA "
            "weights would not reach the sharded model): set optim.ema_decay=none, or train "
            "with DDP or ZeRO-2"
        )
    if sharded:
        shard_module(policy.module)
    o = config.optim
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(),
        lr=o.lr,
        betas=(o.betas[0], o.betas[1]),
        eps=o.eps,
        weight_decay=o.weight_decay,
    )
    # DeepSpeed's engine clips, and needs a batch size without a dataloader.
    align_config(accelerator, o.max_grad_norm, config.train.minibatch_size)
    if sharded:
        optimizer = accelerator.prepare(optimizer)
    else:
        policy.module, optimizer = accelerator.prepare(policy.module, optimizer)

    t = config.train
    local = process_slice(
        t.prompts_per_iteration * t.group_size, accelerator.num_processes, accelerator.process_index
    )
    return Run(
        config=config,
        accelerator=accelerator,
        prompts=prompts,
        policy=policy,
        reward=reward,
        algorithm=algorithm,
        rollout=rollout,
        objective=objective,
        optimizer=optimizer,
        local=local,
    )


__all__ = ["Run", "build_run"]
