"""The embedded digit models: loading, shapes, shipped-file integrity, prompts (no training)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from pipelines.toy import (
    ALL_PROMPTS,
    DIGIT_WORDS,
    EMBEDDED_CLASSIFIER,
    EMBEDDED_FLOW,
    TEMPLATES,
    DigitClassifier,
    DigitFlowModel,
    embedded_asset_path,
    from_pixels,
    load_classifier,
    load_flow_model,
    parse_prompt,
    prompt_for,
    save_model,
    to_pixels,
)
from tasks.digits import TRAIN_PROMPTS

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny models: a second thread only adds contention on small CI machines.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(embedded_asset_path("manifest.json").read_text())


@pytest.fixture(scope="module")
def flow() -> DigitFlowModel:
    return load_flow_model()


@pytest.fixture(scope="module")
def classifier() -> DigitClassifier:
    return load_classifier()


def _build_script():
    """Import scripts/build_assets.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "build_assets", REPO_ROOT / "scripts" / "build_assets.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_embedded_assets_load(flow: DigitFlowModel, classifier: DigitClassifier) -> None:
    for model in (flow, classifier):
        assert not model.training
        assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    assert flow.num_classes == 10


def test_flow_model_output(flow: DigitFlowModel) -> None:
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.linspace(0, 1, 5)
    labels = torch.tensor([0, 3, 9, 10, 10])  # 10 is the null (unconditional) label
    with torch.no_grad():
        v = flow(x, sigma, labels)
        assert v.shape == (5, 1, 8, 8) and v.dtype == torch.float32
        assert torch.isfinite(v).all()
        # No dropout/batch norm: train() and eval() agree exactly.
        flow.train()
        try:
            assert torch.equal(flow(x, sigma, labels), v)
        finally:
            flow.eval()
        # A scalar sigma is broadcast over the batch.
        assert torch.equal(flow(x, 0.5, labels), flow(x, torch.full((5,), 0.5), labels))
    with pytest.raises(ValueError, match=r"\[B, 1, 8, 8\]"):
        flow(torch.zeros(2, 64), sigma[:2], labels[:2])


def test_lora_target_modules_exist(flow: DigitFlowModel) -> None:
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in flow.named_modules()}
    linear_leaves = {
        name.rsplit(".", 1)[-1]
        for name, module in flow.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    assert set(DigitFlowModel.lora_target_modules) <= leaf_names
    assert set(DigitFlowModel.lora_target_modules) <= linear_leaves


def test_classifier_shapes_and_batch_independence(classifier: DigitClassifier) -> None:
    images = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = classifier(images)
        alone = torch.cat([classifier(images[i : i + 1]) for i in range(4)])
    assert logits.shape == (4, 10) and logits.dtype == torch.float32
    # Each image's logits depend on that image only (eval mode: no batch statistics).
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(logits).all() and float(logits.std()) > 0


def test_pixel_maps_roundtrip() -> None:
    pixels = torch.arange(17, dtype=torch.float32) / 16  # every sklearn intensity, in [0, 1]
    assert torch.allclose(to_pixels(from_pixels(pixels)), pixels)
    assert torch.allclose(from_pixels(pixels), torch.arange(17) / 8 - 1)
    assert to_pixels(torch.tensor([-3.0, 3.0])).tolist() == [0.0, 1.0]


def test_classifier_heldout_accuracy(classifier: DigitClassifier, manifest: dict) -> None:
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    split = manifest["data"]["split"]
    digits = load_digits()
    _, test_idx = train_test_split(
        list(range(len(digits.target))),
        test_size=split["test_size"],
        random_state=split["random_state"],
        stratify=digits.target if split["stratify"] else None,
    )
    images = torch.tensor(digits.images[test_idx], dtype=torch.float32).unsqueeze(1) / 16
    labels = torch.tensor(digits.target[test_idx])
    with torch.no_grad():
        acc = (classifier(images).argmax(-1) == labels).float().mean().item()
    assert acc >= 0.95
    recorded = manifest["files"][EMBEDDED_CLASSIFIER]["metrics"]["heldout_accuracy"]
    assert acc == pytest.approx(recorded, abs=1e-6)


def test_flow_heldout_reward_matches_manifest(
    flow: DigitFlowModel, classifier: DigitClassifier, manifest: dict
) -> None:
    """The shipped base model's held-out reward: reproducible, and with room for RL."""
    reward, per_label = _build_script().heldout_reward(flow, classifier)
    metrics = manifest["files"][EMBEDDED_FLOW]["metrics"]
    # Loose tolerance: other CPUs may round differently in the last bits.
    assert reward == pytest.approx(metrics["heldout_reward"], abs=1e-3)
    assert per_label == pytest.approx(metrics["heldout_reward_per_label"], abs=1e-3)
    assert 0.3 <= reward <= 0.8


def test_manifest_matches_files(manifest: dict) -> None:
    assert set(manifest["files"]) == {EMBEDDED_FLOW, EMBEDDED_CLASSIFIER}
    for name, entry in manifest["files"].items():
        data = embedded_asset_path(name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{name} differs from manifest"
        assert len(data) == entry["size_bytes"]
    total = sum(entry["size_bytes"] for entry in manifest["files"].values())
    assert total < 8 * 2**20  # the embedded assets must stay a few MB


def test_manifest_records_configs(manifest: dict, flow, classifier) -> None:
    assert manifest["files"][EMBEDDED_FLOW]["config"] == flow.config
    assert manifest["files"][EMBEDDED_CLASSIFIER]["config"] == classifier.config
    n_params = sum(p.numel() for p in flow.parameters())
    assert manifest["files"][EMBEDDED_FLOW]["parameters"] == n_params


def test_save_load_roundtrip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DigitFlowModel(hidden_dim=32, num_layers=2)
    path = tmp_path / "flow.safetensors"
    save_model(model, path)
    loaded = load_flow_model(path)
    assert loaded.config == {"hidden_dim": 32, "num_layers": 2, "num_classes": 10}
    x, labels = torch.randn(3, 1, 8, 8), torch.tensor([1, 2, 10])
    with torch.no_grad():
        assert torch.equal(loaded(x, torch.full((3,), 0.3), labels), model(x, 0.3, labels))


def test_missing_paths_raise_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match=r"nope\.safetensors"):
        load_flow_model(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\.safetensors"):
        load_classifier(str(missing))
    # The embedded asset missing: the message names the path and how to rebuild it.
    import loading.assets
    import pipelines.toy.models as models

    monkeypatch.setattr(loading.assets, "embedded_asset_path", lambda name: tmp_path / name)
    with pytest.raises(FileNotFoundError, match=r"scripts/build_assets\.py") as info:
        models.load_flow_model()
    assert EMBEDDED_FLOW in str(info.value)


def test_build_script_check_passes() -> None:
    assert _build_script().check(embedded_asset_path("manifest.json").parent) == 0


def test_prompts_roundtrip() -> None:
    # The held-out wording (template 3) is one no training prompt uses.
    assert len(ALL_PROMPTS) == 10 and ALL_PROMPTS[7] == "an 8x8 picture of the digit 7"
    assert not set(ALL_PROMPTS) & set(TRAIN_PROMPTS) and len(set(TRAIN_PROMPTS)) == 30
    assert len(DIGIT_WORDS) == 10
    for template in range(len(TEMPLATES)):
        for digit in range(10):
            assert parse_prompt(prompt_for(digit, template)) == digit
    assert prompt_for(3, 1) == "the number 3"


@pytest.mark.parametrize(
    ("prompt", "label"),
    [("SEVEN", 7), ("Draw a 4 please", 4), ("a Nine", 9), ("seven (7)", 7), ("zero!", 0)],
)
def test_parse_prompt_forms(prompt: str, label: int) -> None:
    assert parse_prompt(prompt) == label


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("a handwritten digit", "names no digit"),
        ("someone drew a cat", "names no digit"),
        ("a three or a 5", "several different digits"),
        ("the number 12", "multi-digit"),
    ],
)
def test_parse_prompt_errors(prompt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_prompt(prompt)
    assert "accepted forms" in str(info.value)


def test_prompt_for_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="label"):
        prompt_for(10)
    with pytest.raises(ValueError, match="template"):
        prompt_for(1, len(TEMPLATES))
