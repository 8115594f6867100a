"""``genrl plan``'s figures for the step ``benchmarks/gpu_flow_grpo.py`` measures, so that the
estimate and the measurement of one configuration sit in one output.

The planner gets the benchmark's own model (the transformer alone: the benchmark has no text
encoders and no VAE), sizes (height, width, text tokens), batches (the rollout's samples, the
training minibatch, both doubled by batched CFG), storage dtype, autocast and LoRA, and plans one
GPU on fake tensors. What each figure stands for:

* sampling step: the parameters plus one CFG forward's peak (no optimizer state exists yet when
  the benchmark times it);
* training step: the planner's total (parameters, AdamW's states, and the larger of the
  minibatch's forward and backward with its gradients and the optimizer step's temporaries).
  The benchmark also keeps its rollout (the latents and log-probs of every step) alive, which
  the plan does not count.
"""

from __future__ import annotations

from typing import Any

from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.planning.choice import Setup
from genrl.planning.modelling import ComponentSpec, ModelSpec
from genrl.planning.plan import plan
from genrl.run.config import PolicyConfig, SDESamplingConfig, TrainConfig, TrainLoopConfig

GIB = 2**30
CLIP_TOKENS = 77  # the planner's SD3 inputs put 77 CLIP tokens before the T5 ones


def planned_figures(
    transformer_config: dict[str, Any], args: Any, batch: int, num_prompts: int
) -> dict[str, float]:
    """Planned GiB of the sampling step and of the training step with checkpointing off and
    on, for ``gpu_flow_grpo.py``'s ``args``; and the seconds the plan took."""
    spec = ModelSpec(
        key="gpu_flow_grpo",
        name="the benchmark's SD3 transformer",
        checkpoints=(),
        family="sd3",
        defaults={},
        components=(
            ComponentSpec(
                "transformer", "diffusers:SD3Transformer2DModel", transformer_config, True
            ),
        ),
        source="benchmarks/gpu_flow_grpo.py",
    )
    text = max(args.text_tokens - CLIP_TOKENS, 1)
    config = TrainConfig(
        recipe="gpu_flow_grpo",
        policy=PolicyConfig(
            name="sd3",
            lora_rank=args.lora_rank,
            lora_alpha=args.lora_alpha,
            dtype=args.dtype,
            kwargs={"height": args.height, "width": args.width, "max_sequence_length": text},
        ),
        sampler=SDESamplingConfig(num_steps=args.steps, guidance_scale=args.guidance),
        algorithm=FlowGRPOConfig(kl_beta=args.kl_beta),
        train=TrainLoopConfig(
            prompts_per_iteration=num_prompts,
            group_size=min(args.group_size, batch),
            minibatch_size=args.minibatch,
            rollout_batch_size=batch,
            gradient_accumulation_steps=1,
            mixed_precision="bf16" if args.dtype == "bfloat16" else "no",
        ),
    )
    config.validate()
    planned = plan(config, 1, 80 * GIB, spec=spec)
    rows = {r.setup: r.memory for r in planned.rows}
    off, on = rows[Setup(True, False)], rows[Setup(True, True)]
    return {
        "planned_sampling_step_gib": round((off.parameters + off.rollout) / GIB, 3),
        "planned_train_step_gib_no_checkpointing": round(off.total / GIB, 3),
        "planned_train_step_gib_checkpointing": round(on.total / GIB, 3),
        "plan_seconds": round(planned.seconds, 1),
    }
