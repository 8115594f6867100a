"""DINOv2 rewards on a tiny random DINOv2 saved to disk and loaded back through our loader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from vision_tiny import build_dinov2, write_images

from reward_models import build_reward
from reward_models.dino import DinoBackbone, load_references


def pictures(n: int, seed: int, size: int = 40) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def dino(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dinov2(tmp_path_factory.mktemp("dino"))


def test_backbone_features_batched_equal_one_by_one(dino: Path) -> None:
    backbone = DinoBackbone(str(dino), "cpu", "float32", batch_size=2)
    images = pictures(5, 0)
    cls, patches = backbone.features(images)
    assert cls.shape == (5, 32) and patches.shape == (5, 16, 32)
    for i in range(5):
        one_cls, one_patches = backbone.features(images[i : i + 1])
        torch.testing.assert_close(one_cls[0], cls[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(one_patches[0], patches[i], atol=1e-5, rtol=0)
    # The processor's settings: short side 36, centre crop 32, ImageNet normalisation.
    preprocess = backbone.load()[1]
    assert preprocess.size == 36 and preprocess.crop == (32, 32)


def test_registers_are_not_patches(tmp_path: Path) -> None:
    """With register tokens the hidden states are [CLS, registers, patches]: the features are
    the first and the last 16, read straight from the model's own output."""
    from transformers import AutoModel

    path = build_dinov2(tmp_path, registers=2)
    backbone = DinoBackbone(str(path), "cpu", "float32", 4)
    images = pictures(2, 0)
    cls, patches = backbone.features(images)
    assert cls.shape == (2, 32) and patches.shape == (2, 16, 32)
    model, preprocess = backbone.load()
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(path)(pixel_values=preprocess(images, "cpu"))
    hidden = hidden.last_hidden_state
    assert hidden.shape[1] == 1 + 2 + 16
    torch.testing.assert_close(cls, hidden[:, 0])
    torch.testing.assert_close(patches, hidden[:, 3:])
    assert not torch.allclose(patches[:, 0], hidden[:, 1])  # a register is not the first patch
    del model


def test_similarity_by_hand(tmp_path: Path, dino: Path) -> None:
    refs = pictures(3, 1)
    paths = write_images(tmp_path / "refs", refs)
    mapping = {"a cat": [f"refs/{p.name}" for p in paths[:2]], "a dog": [f"refs/{paths[2].name}"]}
    (tmp_path / "refs.json").write_text(json.dumps(mapping))
    samples = pictures(3, 2)
    prompts = ["a cat", "a dog", "a bird"]  # no references for the bird
    reward = build_reward(
        "dino_similarity", references=str(tmp_path / "refs.json"), model=str(dino)
    )
    out = reward(samples, prompts)
    backbone = DinoBackbone(str(dino), "cpu", "float32", 8)
    # Expected from the features of the images as saved (PNG, 8 bits).
    saved = torch.stack([(r * 255).round() / 255 for r in refs])
    ref_cls = F.normalize(backbone.features(saved)[0], dim=-1)
    sample_cls = F.normalize(backbone.features(samples)[0], dim=-1)
    expected_cat = (sample_cls[0] @ ref_cls[:2].T).max()
    expected_dog = sample_cls[1] @ ref_cls[2]
    values = out.scores["dino_similarity"]
    assert values[0] == pytest.approx(float(expected_cat), abs=1e-5)
    assert values[1] == pytest.approx(float(expected_dog), abs=1e-5)
    assert math.isnan(values[2]) and out.applicable["dino_similarity"].tolist() == [
        True,
        True,
        False,
    ]
    mean = build_reward(
        "dino_similarity", references=str(tmp_path / "refs.json"), model=str(dino), reduce="mean"
    )(samples, prompts).scores["dino_similarity"]
    assert mean[0] == pytest.approx(float((sample_cls[0] @ ref_cls[:2].T).mean()), abs=1e-5)
    # An image that is one of its prompt's references scores 1 (max).
    assert reward(saved[:1], ["a cat"]).scores["dino_similarity"][0] == pytest.approx(1.0, abs=1e-5)


def test_reference_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no images"):
        load_references(tmp_path / "empty")
    (tmp_path / "bad.json").write_text('{"p": ["missing.png"]}')
    with pytest.raises(FileNotFoundError, match="missing images"):
        load_references(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_references(tmp_path / "nothing")


def test_adversarial_head_learns_reals_from_fakes_and_round_trips(
    tmp_path: Path, dino: Path
) -> None:
    bright = 0.7 + 0.3 * pictures(6, 3)  # reals: bright images; fakes: dark ones
    write_images(tmp_path / "reals", bright)
    options = dict(references=str(tmp_path / "reals"), model=str(dino), num_patches=4, lr=1e-2)
    reward = build_reward("dino_adversarial", **options)
    dark = 0.3 * pictures(6, 4)
    before = reward(dark, ["p"] * 6).scores["dino_adversarial"]
    for _ in range(30):
        metrics = reward.update(dark, ["p"] * 6)
    assert set(metrics) == {"d_loss", "d_real", "d_fake"}
    assert metrics["d_real"] > metrics["d_fake"] and metrics["d_loss"] < 1.0
    test_real = reward(0.7 + 0.3 * pictures(4, 5), ["p"] * 4).scores["dino_adversarial"]
    test_fake = reward(0.3 * pictures(4, 6), ["p"] * 4).scores["dino_adversarial"]
    assert test_real.mean() > test_fake.mean()
    assert reward(dark, ["p"] * 6).scores["dino_adversarial"].mean() < before.mean()
    # The checkpointed state (head, optimizer, random stream) reproduces scores and updates.
    state = reward.state_dict()
    twin = build_reward("dino_adversarial", **options)
    twin.load_state_dict(state)
    images = pictures(3, 7)
    torch.testing.assert_close(
        twin(images, ["p"] * 3).scores["dino_adversarial"],
        reward(images, ["p"] * 3).scores["dino_adversarial"],
    )
    assert twin.update(dark, ["p"] * 6) == reward.update(dark, ["p"] * 6)


def test_adversarial_update_with_gather_trains_on_all_fakes(tmp_path: Path, dino: Path) -> None:
    write_images(tmp_path / "reals", pictures(4, 8))
    options = dict(references=str(tmp_path / "reals"), model=str(dino), num_patches=2)
    seen: list[int] = []

    def gather(tensor: torch.Tensor) -> torch.Tensor:  # two processes holding the same batch
        seen.append(tensor.shape[0])
        return torch.cat([tensor, tensor])

    build_reward("dino_adversarial", **options).update(pictures(3, 9), ["p"] * 3, gather=gather)
    assert seen == [3]


def test_toy_training_with_an_adversarial_regulariser(tmp_path: Path, dino: Path) -> None:
    """The embedded-task trainer with a second, stateful reward: the head is updated every
    iteration (metrics logged) and its state goes into the checkpoint."""
    from tiny import tiny_config

    from genrl import Trainer
    from genrl.checkpoints.checkpoint import load_checkpoint, resolve_checkpoint
    from genrl.run.config import RewardSpec

    write_images(tmp_path / "reals", pictures(4, 10, size=8))
    config = tiny_config(tmp_path)
    spec = {"references": str(tmp_path / "reals"), "model": str(dino), "num_patches": 2}
    config.reward.append(RewardSpec(name="dino_adversarial", weight=0.1, kwargs=spec))
    trainer = Trainer(config, run_dir=tmp_path / "run")
    metrics = trainer.train_iteration()
    assert "reward_update/dino_adversarial/d_loss" in metrics
    assert math.isfinite(metrics["dino_adversarial/mean"])
    trainer.train()
    state = load_checkpoint(resolve_checkpoint(tmp_path / "run"))["state"]["reward"]
    assert state["dino_adversarial"]["updates"] == 2


def test_adversarial_score_weights_cls_and_patches_by_hand(tmp_path: Path, dino: Path) -> None:
    write_images(tmp_path / "reals", pictures(1, 11))
    reward = build_reward("dino_adversarial", references=str(tmp_path / "reals"), model=str(dino))
    head = torch.nn.Linear(32, 1)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[0, 0] = 1.0
        head.bias.zero_()
    reward._head, reward._optimizer = head, torch.optim.Adam(head.parameters())  # reads feature 0
    tokens = torch.zeros(1, 3, 32)
    tokens[0, :, 0] = torch.tensor([1.0, 2.0, 4.0])  # CLS 1, patches 2 and 4
    assert float(reward.discriminate(tokens)) == pytest.approx(0.7 * 1 + 0.3 * 3)


def test_scoring_does_not_move_the_update_stream(tmp_path: Path, dino: Path) -> None:
    """Two processes that score different numbers of evaluation chunks keep identical heads."""
    write_images(tmp_path / "reals", pictures(4, 12))
    options = dict(references=str(tmp_path / "reals"), model=str(dino), num_patches=4)
    first, second = (build_reward("dino_adversarial", **options) for _ in range(2))
    first(pictures(5, 13), ["p"] * 5)  # this process scored one chunk more
    first(pictures(3, 14), ["p"] * 3)
    second(pictures(3, 14), ["p"] * 3)
    fakes = pictures(4, 15)
    assert first.update(fakes, ["p"] * 4) == second.update(fakes, ["p"] * 4)
    for a, b in zip(first.head.parameters(), second.head.parameters(), strict=True):
        assert torch.equal(a, b)
    # And a score depends on the images only.
    assert torch.equal(
        first(fakes, ["p"] * 4).scores["dino_adversarial"],
        second(fakes, ["p"] * 4).scores["dino_adversarial"],
    )
