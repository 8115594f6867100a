"""genrl plan (genrl/planning/): the planned bytes of a tiny model against what a real CPU run
holds, FLOPs against hand counts, FSDP2's sharding on a fake process group of 8 ranks."""

from __future__ import annotations

import json
import math
import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from genrl.planning.modelling import ComponentSpec, ModelSpec, lora_matches, parse_memory
from genrl.planning.plan import plan
from genrl.planning.strategies import STRATEGIES, Footprint, memory
from genrl.planning.tracing import trace
from genrl.planning.workloads import FAMILIES, training_loss
from genrl.recipes import get_recipe

TINY_SD3 = {
    "sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 3, "attention_head_dim": 16,
    "num_attention_heads": 4, "joint_attention_dim": 48, "caption_projection_dim": 64,
    "pooled_projection_dim": 40, "out_channels": 4, "pos_embed_max_size": 16,
    "dual_attention_layers": [0], "qk_norm": "rms_norm",
}  # fmt: skip
TINY_CLIP = {
    "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1,
    "projection_dim": 16, "vocab_size": 100, "max_position_embeddings": 77,
}  # fmt: skip
SIZES = ["policy.kwargs.height=64", "policy.kwargs.width=64", "policy.kwargs.max_sequence_length=8"]
TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"]


def tiny_spec() -> ModelSpec:
    return ModelSpec(
        key="tiny", name="tiny SD3", checkpoints=(), family="sd3", defaults={}, source="test",
        components=(
            ComponentSpec("transformer", "diffusers:SD3Transformer2DModel", TINY_SD3, True),
            ComponentSpec("text_encoder", "transformers:CLIPTextModelWithProjection", TINY_CLIP, False),
        ),
    )  # fmt: skip


def tiny_config(*extra: str):
    config = get_recipe("sd35m_pickscore").apply_overrides(
        [*SIZES, "policy.dtype=bfloat16", "train.mixed_precision=bf16", "train.minibatch_size=2",
         "train.rollout_batch_size=2", "train.prompts_per_iteration=2", "train.group_size=2",
         "train.gradient_accumulation_steps=1", f"policy.lora_target_modules={json.dumps(TARGETS)}",
         *extra]
    )  # fmt: skip
    config.validate()
    return config


class MeasuredBytes(TorchDispatchMode):
    """An independent count of live tensor bytes on real tensors: every storage an operator
    returns that none of its inputs holds (views and in-place results allocate nothing), from
    creation until it is freed; ``peak(excluding)`` leaves out some storages (the gradients) by
    replaying the log."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, int]] = []
        self.keys: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = [t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)]  # fmt: skip
        for t in tree_leaves(out):
            fresh = (
                t.untyped_storage().data_ptr() not in given
                if isinstance(t, torch.Tensor)
                else False
            )
            if fresh and t.untyped_storage()._cdata not in self.keys:
                s = t.untyped_storage()
                uid = len(self.log)
                self.keys[s._cdata] = uid
                self.log.append((uid, s.nbytes()))
                weakref.finalize(s, self._gone, s._cdata, uid, s.nbytes())
        return out

    def _gone(self, key: int, uid: int, size: int) -> None:
        self.keys.pop(key, None)
        self.log.append((uid, -size))

    def peak(self, excluding: set[int]) -> int:
        live = best = 0
        for uid, delta in self.log:
            if uid not in excluding:
                live += delta
                best = max(best, live)
        return best


def real_run(lora: bool, checkpointing: bool):
    """The tiny model built for real (as the planner builds it), one training minibatch with
    AdamW on the CPU: (parameter bytes, gradient bytes, optimizer-state bytes, activation peak)."""
    from genrl.planning.modelling import add_lora, build_component, set_dtype

    torch.manual_seed(0)
    module = build_component(tiny_spec().components[0], torch.float32)
    if lora:
        set_dtype(module, torch.bfloat16)
        add_lora(module, 32, 64.0, TARGETS)
    if checkpointing:
        module.enable_gradient_checkpointing()
    family = FAMILIES["sd3"]
    sizes = family.sizes({"height": 64, "width": 64, "max_sequence_length": 8}, {}, {})
    inputs = family.inputs(module, sizes, 4, False, torch.bfloat16)  # minibatch 2, CFG x2
    counter = MeasuredBytes()
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = family.output(module(**inputs))
        training_loss(out, False).backward()
        del out
    trainable = [p for p in module.parameters() if p.requires_grad]
    grads = {counter.keys[p.grad.untyped_storage()._cdata] for p in trainable}
    activation = counter.peak(grads)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    optimizer.step()
    states = sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for k, t in state.items()
        if k != "step"
    )
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    return params, grad_bytes, states, activation


@pytest.fixture(scope="module")
def tiny_plan():
    return plan(tiny_config(), 1, parse_memory("80GB"), spec=tiny_spec())


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_planned_bytes_equal_a_real_cpu_run(tiny_plan, lora, checkpointing):
    label = f"{'LoRA' if lora else 'full'}{' +ckpt' if checkpointing else ''}"
    planned = tiny_plan.footprints[label]
    params, grads, states, activation = real_run(lora, checkpointing)
    print(f"{label}: activation peak planned {planned.activation_bytes} B, measured {activation} B")
    assert planned.module_bytes == params
    assert planned.trainable_bytes == grads
    assert planned.trainable_count * 8 == states
    assert abs(planned.activation_bytes - activation) <= 0.2 * activation
    # The frozen CLIP text encoder, counted in policy.dtype (bfloat16).
    clip = nn.Module()
    from genrl.planning.modelling import build_component

    clip = build_component(tiny_spec().components[1], torch.bfloat16)
    assert planned.frozen_bytes == sum(p.numel() * 2 for p in clip.parameters())


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_lora_counts_what_peft_would_add(tiny_plan):
    """r * (in + out) per matched linear layer (peft's rule: the name or its last parts)."""
    from genrl.planning.modelling import build_component

    module = build_component(tiny_spec().components[0], torch.float32)
    expected = sum(
        32 * (m.in_features + m.out_features)
        for name, m in module.named_modules()
        if isinstance(m, nn.Linear) and lora_matches(name, TARGETS)
    )
    assert tiny_plan.parameters["LoRA adapter"] == expected > 0
    assert lora_matches("blocks.0.attn.to_q", ["attn.to_q"])
    assert not lora_matches("blocks.0.attn2.to_q", ["attn.to_q"])


def test_linear_flops_equal_the_hand_count():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        layer = nn.Linear(64, 32)
        x = torch.randn(8, 64, requires_grad=True)
        forward = trace(lambda: layer(x))
        both = trace(lambda: layer(x).sum().backward(), layer)
    assert forward.flops == 2 * 8 * 64 * 32
    # backward: grad of the input and of the weight, each another 2 * B * in * out.
    assert both.flops == 3 * 2 * 8 * 64 * 32
    assert both.gradient_bytes == (64 * 32 + 32) * 4


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.heads, -1).transpose(1, 2) for p in self.qkv)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


def test_attention_block_flops_equal_the_hand_count():
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, n, d, h = 2, 128, 64, 4
    with FakeTensorMode():
        block = Attention(d, h)
        x = torch.randn(b, n, d)
        with torch.no_grad():
            counted = trace(lambda: block(x)).flops
    projections = 4 * 2 * b * n * d * d  # q, k, v and out
    scores_and_mix = 2 * (2 * b * h * n * n * (d // h))  # Q K^T and P V
    assert counted == projections + scores_and_mix


def test_fsdp2_on_a_fake_process_group_shards_parameter_bytes_by_8():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from genrl.planning.modelling import build_component, repeated_blocks

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        module = build_component(tiny_spec().components[0], torch.float32)
        total = sum(p.numel() * 4 for p in module.parameters())
        mesh = init_device_mesh("cpu", (8,))
        for block in repeated_blocks(module):
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
        local = sum(p.to_local().numel() * 4 for p in module.parameters())
        # FSDP2 pads each parameter's dim 0 to a multiple of 8: at most 7 rows each.
        padding = sum(
            (-p.shape[0] % 8) * (p.numel() // p.shape[0]) * 4 for p in module.parameters()
        )
        assert total / 8 <= local <= (total + padding) / 8
        assert local == sum(math.ceil(p.shape[0] / 8) * (p.numel() // p.shape[0]) * 4
                            for p in module.parameters())  # fmt: skip
    finally:
        dist.destroy_process_group()
    f = Footprint(total, total, total // 4, 0, 0, 0, 0, 0, 0)
    fsdp = next(s for s in STRATEGIES if s.name == "FSDP2")
    assert abs(memory(f, fsdp, 8).parameters - local) <= padding / 8


def test_strategies_divide_by_hand():
    f = Footprint(8000, 4000, 1000, 500, 300, 0, 100, 2000, 1000)
    by = {s.name: memory(f, s, 4) for s in STRATEGIES}
    assert by["DDP"].gradients == 8000  # the gradients and the reducer's buckets
    assert by["DDP"].total == 8000 + 500 + 8000 + 300 + max(1000, 8000 + 2000, 8000 + 4000)
    assert by["ZeRO-2"].parameters == 8500 and by["ZeRO-2"].optimizer == 2000
    assert by["FSDP2"].parameters == 2000 + 500 and by["FSDP2"].transient == 200
    assert by["ZeRO-3"].gradients == 1000
    assert by["FSDP2-SGO"].parameters == 2000 + 8000 + 500


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_plan_rows_and_cheapest(tiny_plan):
    rows = tiny_plan.rows
    assert {r.setup.label for r in rows} == {"full", "full +ckpt", "LoRA", "LoRA +ckpt"}
    assert tiny_plan.best is not None and tiny_plan.best.setup.lora  # the recipe trains LoRA
    four = plan(tiny_config(), 4, parse_memory("80GB"), spec=tiny_spec())
    assert {r.strategy for r in four.rows} == {s.name for s in STRATEGIES}
    # EMA (the recipe's optim.ema_decay) is refused under FSDP and ZeRO-3: planned with it off.
    fsdp = next(r for r in four.rows if r.strategy == "FSDP2")
    assert "optim.ema_decay=none" in fsdp.flags


def test_parse_memory_and_errors():
    from genrl.config.errors import ConfigError

    assert parse_memory("80GB") == 80 * 2**30 == parse_memory("80")
    assert parse_memory("512MB") == 512 * 2**20
    with pytest.raises(ConfigError, match="--gpu-memory"):
        parse_memory("lots")


def test_cli_refuses_a_model_without_a_config(capsys):
    from genrl.cli.main import main

    assert main(["plan", "digits_flow_grpo"]) == 2
    assert "no model config" in capsys.readouterr().err


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_a_smaller_minibatch_when_nothing_fits(tiny_plan):
    from genrl.planning.choice import smaller_minibatch

    config = tiny_config()
    least = min(r.memory.total for r in tiny_plan.rows)
    assert smaller_minibatch(config, tiny_plan.rows, least - 1) is not None
    row = smaller_minibatch(config, tiny_plan.rows, least - 1)
    # minibatch 2 x 1 accumulation -> 1 x 2: the optimizer step sees the same samples.
    assert row.estimated and row.memory.total <= least - 1
    assert row.flags[-2:] == ["train.minibatch_size=1", "train.gradient_accumulation_steps=2"]
    assert smaller_minibatch(config, tiny_plan.rows, 1) is None


@pytest.mark.parametrize(
    "recipe",
    ["digits_flow_grpo", "digits_ram", "digits_gdro", "digits_diffusion_nft", "digits_dgpo",
     "digits_awm", "digits_branch_grpo", "llm_countdown_grpo", "dllm_sudoku_maskgrpo"],
)  # fmt: skip
def test_model_copies_agree_with_the_built_algorithms(recipe):
    """genrl/planning/copies.py against the rollout's and objective's own properties."""
    from genrl.algorithms import ALGORITHMS
    from genrl.planning.copies import model_copies
    from genrl.run.components import build_policy_from

    config = get_recipe(recipe)
    rollout, objective = ALGORITHMS[config.algorithm.name](config.algorithm, config).build(
        build_policy_from(config)
    )
    reference, lagged = model_copies(config.algorithm)
    assert reference == (rollout.uses_reference or objective.uses_reference)
    assert lagged == (getattr(rollout, "lagged_config", None) is not None)


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_the_output_fits_on_a_screen_and_the_json_has_the_numbers(tiny_plan):
    from genrl.planning.report import as_json, text

    lines = text(tiny_plan).splitlines()
    print("\n".join(lines))
    assert len(lines) <= 50 and max(len(line) for line in lines) <= 120
    assert "cheapest that fits" in text(tiny_plan)
    data = json.loads(json.dumps(as_json(tiny_plan)))
    assert data["best"]["command"].startswith("genrl train sd35m_pickscore")
    assert {r["setup"] for r in data["rows"]} == {"full", "full +ckpt", "LoRA", "LoRA +ckpt"}
    assert (
        data["footprints"]["LoRA"]["trainable_bytes"]
        == tiny_plan.footprints["LoRA"].trainable_bytes
    )


@pytest.mark.slow
def test_genrl_plan_of_a_real_recipe_end_to_end(capsys):
    """The command on Qwen3-0.6B (its real config, nothing allocated): JSON with every row."""
    import resource

    from genrl.cli.main import main

    assert main(["plan", "qwen3_countdown_grpo", "--gpus", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The model card: 0.44B non-embedding parameters + a tied 151936 x 1024 embedding.
    assert data["parameters"]["trained module"] == 596049920
    assert len(data["rows"]) == 4 * len(STRATEGIES) and data["best"]["fits"]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 3 * 2**20  # kB: under 3 GB


# Published sizes of the trained modules (billions; the model cards' and hub pages' figures,
# rounded as they give them): a wrong width or depth in a model file moves its count far more.
PUBLISHED = {
    "flux1_dev": 12, "llada_8b": 8, "qwen25_vl_3b": 3.75, "qwen25_vl_7b": 8.29,
    "qwen3_0_6b": 0.6, "qwen3_8b": 8.2, "qwen_image": 20, "sd35_large": 8.1,
    "sd35_medium": 2.5, "wan21_t2v_14b": 14, "wan21_t2v_1_3b": 1.3, "wan22_ti2v_5b": 5,
}  # fmt: skip


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_every_model_file_builds_at_its_published_size():
    from genrl.planning.modelling import build_component, load_model_spec, model_keys

    assert set(model_keys()) == set(PUBLISHED)
    for key, billions in PUBLISHED.items():
        spec = load_model_spec(key)
        with torch.device("meta"):
            count = sum(
                p.numel() for p in build_component(spec.trained, torch.bfloat16).parameters()
            )
        # SD3.5-medium's card says 2.5B for MMDiT-X; its transformer config builds 2.24B.
        assert abs(count / 1e9 - billions) <= 0.12 * billions, (key, count)
