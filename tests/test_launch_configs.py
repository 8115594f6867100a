"""The accelerate configs shipped in ``genrl/launch_configs/`` parse with accelerate's own
loader and say what their names promise; FSDP requests genrl cannot serve fail clearly."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from genrl.distributed.sharding import shards_itself

CONFIGS = Path(__file__).resolve().parents[1] / "genrl" / "launch_configs"
EXPECTED = {
    "ddp": "MULTI_GPU",
    "fsdp2_full": "FSDP",
    "fsdp2_lora": "FSDP",
    "zero2": "DEEPSPEED",
    "zero3": "DEEPSPEED",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerate(name: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert str(config.distributed_type).endswith(EXPECTED[name])
    assert config.num_processes == 2 and config.mixed_precision == "no"
    if name.startswith("fsdp2"):
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    if name.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])


def test_shipped_configs_are_exactly_these() -> None:
    assert {p.stem for p in CONFIGS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_deepspeed_plugin_accepts_the_config(name: str) -> None:
    """accelerate builds its DeepSpeed plugin from the config (needs deepspeed installed)."""
    pytest.importorskip("deepspeed")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    ds = load_config_from_file(str(CONFIGS / f"{name}.yaml")).deepspeed_config
    plugin = DeepSpeedPlugin(
        zero_stage=ds["zero_stage"],
        gradient_accumulation_steps=ds["gradient_accumulation_steps"],
        gradient_clipping=ds["gradient_clipping"],
        offload_optimizer_device=ds["offload_optimizer_device"],
        offload_param_device=ds["offload_param_device"],
        zero3_init_flag=ds["zero3_init_flag"],
    )
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == ds["zero_stage"]
    # The plugin leaves the micro batch size to a dataloader; genrl fills it from the recipe.
    from genrl.distributed.deepspeed import align_config

    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == "auto"
    state = SimpleNamespace(deepspeed_plugin=plugin)
    align_config(SimpleNamespace(distributed_type="DEEPSPEED", state=state), None, 8)
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 8
    assert plugin.deepspeed_config["gradient_clipping"] == 0.0


def test_fsdp_request_on_one_process_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    one = SimpleNamespace(distributed_type="NO", num_processes=1, device=cpu)
    with pytest.raises(ValueError, match="launch 2 or more processes"):
        shards_itself(one)
    two = SimpleNamespace(distributed_type="DistributedType.MULTI_CPU", num_processes=2, device=cpu)
    assert shards_itself(two)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    assert not shards_itself(two)


def _deepspeed_accelerator(stage: int, clipping: float) -> SimpleNamespace:
    config = {"zero_optimization": {"stage": stage}, "gradient_clipping": clipping}
    plugin = SimpleNamespace(deepspeed_config=config, zero_stage=stage)
    return SimpleNamespace(
        distributed_type="DistributedType.DEEPSPEED", state=SimpleNamespace(deepspeed_plugin=plugin)
    )


def test_deepspeed_config_takes_clipping_and_batch_size_from_the_recipe() -> None:
    """The shipped ZeRO configs say gradient_clipping 1.0; the recipe's optim.max_grad_norm
    is what the engine must use (None turns DeepSpeed's clipping off: 0). accelerate reads the
    micro batch size from a dataloader genrl never prepares: "auto" becomes
    train.minibatch_size, a number set in the config is kept."""
    from genrl.distributed.deepspeed import align_config, uses_deepspeed, zero_stage

    accelerator = _deepspeed_accelerator(3, 1.0)
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config["train_micro_batch_size_per_gpu"] = "auto"
    assert uses_deepspeed(accelerator) and zero_stage(accelerator) == 3
    align_config(accelerator, 0.5, 8)
    assert config["gradient_clipping"] == 0.5 and config["train_micro_batch_size_per_gpu"] == 8
    config["train_micro_batch_size_per_gpu"] = 3
    align_config(accelerator, None, 8)
    assert config["gradient_clipping"] == 0.0 and config["train_micro_batch_size_per_gpu"] == 3
    ddp = SimpleNamespace(distributed_type="DistributedType.MULTI_GPU")
    align_config(ddp, 0.5, 8)  # nothing to align, nothing touched
    assert not uses_deepspeed(ddp) and zero_stage(ddp) == 0


def test_deepspeed_checkpoints_are_refused_with_what_to_use() -> None:
    from genrl.distributed.deepspeed import refuse_checkpoint

    reason = refuse_checkpoint(_deepspeed_accelerator(2, 1.0), "resume")
    assert reason is not None and "cannot resume under DeepSpeed" in reason
    assert "fsdp2_full.yaml" in reason
    assert refuse_checkpoint(SimpleNamespace(distributed_type="MULTI_CPU"), "resume") is None
