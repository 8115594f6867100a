"""A LoRA run on the embedded digits model exports an adapter peft loads by itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tiny import tiny_config

from genrl import Trainer
from pipelines.toy.models import load_flow_model


def test_lora_export_carries_its_adapter_config(tmp_path: Path) -> None:
    from peft import PeftModel

    config = tiny_config(tmp_path, "policy.lora_rank=4", "train.iterations=1")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train()
    export = tmp_path / "run" / "export"
    assert {"trainable.safetensors", "adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in export.iterdir()
    }
    adapter = json.loads((export / "adapter_config.json").read_text())
    flow = tmp_path / "flow.safetensors"  # tiny_config's base weights
    assert adapter["r"] == 4 and adapter["peft_type"] == "LORA"
    assert adapter["base_model_name_or_path"] == str(flow)
    assert set(adapter["target_modules"]) == {"in_proj", "fc1", "fc2", "ada", "out_proj"}

    loaded = PeftModel.from_pretrained(load_flow_model(str(flow)), str(export)).eval()
    trained = trainer.policy.network.eval()
    x, sigma = torch.randn(3, 1, 8, 8), torch.tensor([0.9, 0.5, 0.1])
    labels = torch.tensor([1, 6, 9])
    with torch.no_grad():
        expected = trained(x, sigma, labels)
        assert torch.allclose(loaded(x, sigma, labels), expected, atol=1e-6)
        # The adapter changed the model: the base alone answers differently.
        assert not torch.allclose(load_flow_model(str(flow))(x, sigma, labels), expected)


def test_full_fine_tuning_exports_no_adapter(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "train.iterations=1")
    Trainer(config, run_dir=tmp_path / "run").train()
    names = {p.name for p in (tmp_path / "run" / "export").iterdir()}
    assert names == {"trainable.safetensors"}
