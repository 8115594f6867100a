"""The VLM adapter's behaviours beyond the family table (``test_vlm_families.py``: log-probs
against the stock forward, sampling, GRPO, the reference and the export for every family), on
a tiny Qwen2-VL and a few others: prompts that carry images (from a JSON Lines dataset), rows
that share a text, rounds with and without images, per-prompt state through a checkpoint, LoRA
targets and full fine-tuning, LLaVA's pixels, Gemma 3's token types and Idefics3's tiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from vision_tiny import build_qwen2_vl

from genrl import Trainer
from genrl.algorithms.grpo import GRPOConfig
from genrl.prompts.sources import PromptFileError, load_prompts
from genrl.run.config import (
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)
from pipelines import build_policy
from pipelines.transformers.vlm_families import VLMFamily
from reward_models import REWARDS, RewardModel, RewardOutput
from samplers.autoregressive import TokenSampler
from tasks.prompt import Prompt


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen2_vl(tmp_path_factory.mktemp("qwen2vl"))


def picture(colour: tuple[int, int, int], size: tuple[int, int]) -> Image.Image:
    image = Image.new("RGB", size, colour)
    image.putpixel((1, 2), (255 - colour[0], 10, 200))  # not a flat image
    return image


PROMPTS = [
    Prompt("What colour?", {"images": [picture((200, 30, 30), (32, 32))]}),
    # Another size: another number of patches and vision tokens, so packing is exercised.
    Prompt("Count the shapes.", {"images": [picture((20, 200, 30), (16, 24))]}),
    Prompt("Two pictures: same?", {"images": [picture((9, 9, 9), (16, 16))] * 2}),
]


def direct_log_probs(qwen: Path, prompt: Prompt, completion: list[int]) -> torch.Tensor:
    """``log p(completion | prompt)`` from the stock model on its processor's unpadded inputs,
    over text tokens."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(qwen))
    model = AutoModelForImageTextToText.from_pretrained(str(qwen)).eval()
    images = prompt.columns["images"]
    message = {
        "role": "user",
        "content": [*({"type": "image"} for _ in images), {"type": "text", "text": str(prompt)}],
    }
    text = processor.apply_chat_template([message], add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[images], return_tensors="pt")
    ids = torch.cat([inputs["input_ids"], torch.tensor([completion])], dim=1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(completion)).long()], 1)
    logits = model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        mm_token_type_ids=types,
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
    ).logits
    # A completion is text: the vision placeholders are never sampled, nor scored.
    config = model.config
    placeholders = [config.image_token_id, config.video_token_id]
    placeholders += [config.vision_start_token_id, config.vision_end_token_id]
    logits[..., placeholders] = float("-inf")
    scores = torch.log_softmax(logits[0, -len(completion) - 1 : -1].float(), dim=-1)
    return scores.gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_log_probs_equal_a_direct_forward_of_each_prompt(qwen: Path) -> None:
    policy = build_policy("vlm", pretrained=str(qwen))
    ids, mask = policy.encode_prompts(list(PROMPTS))
    extras = policy.model_inputs(list(PROMPTS))
    assert set(extras) == {"pixel_values", "image_grid_thw"}
    assert extras["image_grid_thw"].shape == (3, 2, 3)  # padded to the most images
    completion = torch.tensor([[20, 21, 22, 9], [30, 31, 32, 33], [40, 41, 42, 43]])
    full = torch.cat([ids, completion], dim=1)
    attention = torch.cat([mask, torch.ones_like(completion)], dim=1)
    ours = policy.token_log_probs(full, attention, completion, 1.0, extras)
    for row, prompt in enumerate(PROMPTS):
        expected = direct_log_probs(qwen, prompt, completion[row].tolist())
        torch.testing.assert_close(ours[row], expected, rtol=0, atol=2e-5)


def test_sampling_log_probs_equal_the_scoring_forward(qwen: Path) -> None:
    """Generation continues the multimodal RoPE positions as the training forward places them."""
    policy = build_policy("vlm", pretrained=str(qwen))
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[1]]
    ids, mask = policy.encode_prompts(prompts)
    extras = policy.model_inputs(prompts)
    sampler = TokenSampler(temperature=1.0)
    out = policy.generate(ids, mask, sampler, 6, torch.Generator().manual_seed(0), extras)
    full = torch.cat([ids, out.tokens], dim=1)
    attention = torch.cat([mask, out.mask.long()], dim=1)
    rescored = policy.token_log_probs(full, attention, out.tokens, 1.0, extras)
    torch.testing.assert_close(rescored[out.mask], out.log_probs[out.mask], rtol=0, atol=2e-5)


class AnswerMatch(RewardModel):
    """1 when the completion starts with the row's ``answer`` column (tests only)."""

    name = "answer_match"
    accepts = ("texts",)

    def score(self, outputs, prompts, metadata) -> RewardOutput:
        assert metadata is not None and all("answer" in m for m in metadata)
        hits = [
            float(o.strip().startswith(m["answer"])) for o, m in zip(outputs, metadata, strict=True)
        ]
        # Partial credit for the answer's letters, so that a random model's groups differ.
        shaped = [
            h + sum(c in m["answer"] for c in o) / (len(o) + 1)
            for h, o, m in zip(hits, outputs, metadata, strict=True)
        ]
        return RewardOutput({self.name: torch.tensor(shaped)})


def write_dataset(directory: Path) -> Path:
    rows = []
    for i, (colour, answer) in enumerate([((220, 20, 20), "red"), ((20, 220, 20), "green")]):
        picture(colour, (32, 32)).save(directory / f"img{i}.png")
        rows.append({"prompt": "What colour is it?", "images": f"img{i}.png", "answer": answer})
        rows[-1]["prompt"] += f" ({i})"
    path = directory / "vqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def vlm_config(tmp_path: Path, qwen: Path) -> TrainConfig:
    return TrainConfig(
        recipe="tiny_vlm",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(name="vlm", pretrained=str(qwen), lora_rank=4),
        generation=GenerationConfig(max_new_tokens=6, temperature=1.0),
        reward=[RewardSpec(name="answer_match")],
        algorithm=GRPOConfig(kl_beta=0.04),
        prompts=PromptConfig(dataset=str(write_dataset(tmp_path))),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=4, minibatch_size=4
        ),
        optim=OptimConfig(lr=5e-2),
        eval=EvalConfig(samples_per_prompt=1),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )


def test_jsonl_prompts_carry_their_columns(tmp_path: Path) -> None:
    source = load_prompts(str(write_dataset(tmp_path)))
    first = source.train[0]
    assert first == "What colour is it? (0)" and isinstance(first, Prompt)
    assert first.columns == {"images": str(tmp_path / "img0.png"), "answer": "red"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "images": "missing.png"}\n')
    with pytest.raises(PromptFileError, match=r"no such file .*missing\.png"):
        load_prompts(str(bad))
    bad.write_text('{"text": "p"}\n')
    with pytest.raises(PromptFileError, match=r'line 1 must be an object with a string "prompt"'):
        load_prompts(str(bad))


def test_a_llava_with_batch_first_pixels_scores_like_its_direct_forward(
    tmp_path: Path,
) -> None:
    """LLaVA's processor returns one pixel row per prompt and its language model counts
    positions plainly: the other layout the adapter handles."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from vision_tiny import build_llava

    llava = build_llava(tmp_path / "llava")
    policy = build_policy("vlm", pretrained=str(llava))
    prompts = [
        Prompt("Does this image contain artifacts?", {"images": picture((200, 0, 0), (40, 40))}),
        Prompt("Answer Yes or No", {"images": [picture((0, 0, 200), (32, 48))]}),
    ]
    ids, mask = policy.encode_prompts(prompts)
    extras = policy.model_inputs(prompts)
    assert set(extras) == {"pixel_values", "images_per_prompt"}  # nested per image
    assert extras["pixel_values"].shape[:2] == (2, 1)
    out = policy.generate(ids, mask, TokenSampler(1.0), 4, torch.Generator().manual_seed(0), extras)
    full = torch.cat([ids, out.tokens], dim=1)
    attention = torch.cat([mask, out.mask.long()], dim=1)
    ours = policy.token_log_probs(full, attention, out.tokens, 1.0, extras)
    torch.testing.assert_close(ours[out.mask], out.log_probs[out.mask], rtol=0, atol=2e-5)
    processor = AutoProcessor.from_pretrained(str(llava))
    model = AutoModelForImageTextToText.from_pretrained(str(llava)).eval()
    for row, prompt in enumerate(prompts):
        text = policy.format_prompts([prompt])[0]
        image = picture((200, 0, 0), (40, 40)) if row == 0 else picture((0, 0, 200), (32, 48))
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        tokens = out.tokens[row][out.mask[row]]
        direct_ids = torch.cat([inputs["input_ids"][0], tokens])[None]
        logits = model(input_ids=direct_ids, pixel_values=inputs["pixel_values"]).logits[0]
        logits[:, model.config.image_token_id] = float("-inf")  # never sampled nor scored
        scores = torch.log_softmax(logits[-len(tokens) - 1 : -1], dim=-1)
        expected = scores.gather(1, tokens[:, None])[:, 0]
        torch.testing.assert_close(ours[row][out.mask[row]], expected, rtol=0, atol=2e-5)


def test_rows_that_share_a_text_keep_their_own_images_and_checkpoints_load(
    qwen: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two dataset rows with one text ("What colour is it?") and different images: each keeps
    its image, per-prompt state is keyed by row, and a checkpoint holding MSSR's per-prompt
    baselines loads back (they are plain strings, not Prompt objects)."""
    rows = []
    for i, (colour, answer) in enumerate([((220, 20, 20), "red"), ((20, 220, 20), "green")]):
        picture(colour, (32, 32) if i == 0 else (16, 24)).save(tmp_path / f"img{i}.png")
        rows.append({"prompt": "What colour is it?", "images": f"img{i}.png", "answer": answer})
    data = tmp_path / "same.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(str(data)).train
    assert prompts[0] == prompts[1] and prompts[0].columns != prompts[1].columns
    policy = build_policy("vlm", pretrained=str(qwen))
    grids = policy.model_inputs(prompts)["image_grid_thw"][:, 0]
    assert grids.tolist() == [[1, 8, 8], [1, 6, 4]]  # each row's own image

    monkeypatch.setitem(REWARDS, "answer_match", AnswerMatch)
    config = vlm_config(tmp_path, qwen)
    config.apply_overrides(
        [f"prompts.dataset={data}", "algorithm.advantage=mssr", "train.group_size=1"]
    )
    trainer = Trainer(config)
    trainer.train_iteration()
    trainer.iteration = 1
    counts = trainer.objective.state_dict()["mssr_tracker"]["counts"]
    assert set(counts) == {"What colour is it? #0", "What colour is it? #1"}
    assert all(type(key) is str for key in counts)
    path = trainer.save_checkpoint()
    resumed = Trainer(config, run_dir=tmp_path / "again")
    resumed.load_checkpoint(path)
    assert resumed.objective.state_dict()["mssr_tracker"]["counts"] == counts


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_rounds_with_and_without_images_concatenate(family: str, tmp_path: Path) -> None:
    """Qwen's packed patches and Gemma 3's pixels nested per image (one image, none, two)."""
    import vision_tiny

    from genrl.data.batches import TokenRollout

    checkpoint = getattr(vision_tiny, f"build_{family}")(tmp_path / family)
    policy = build_policy("vlm", pretrained=str(checkpoint))
    text_only = [Prompt("No picture here.")]
    batches = []
    for prompts in ([PROMPTS[0]], text_only, [PROMPTS[2]]):
        ids, mask = policy.encode_prompts(prompts)
        batches.append(
            TokenRollout(
                prompts=list(prompts), completions=[""], group_ids=torch.zeros(1).long(),
                input_ids=ids, attention_mask=mask, completion_mask=torch.ones(1, 0).bool(),
                old_log_probs=torch.zeros(1, 0), ref_log_probs=torch.zeros(1, 0),
                finished=torch.ones(1).bool(), model_inputs=policy.model_inputs(prompts),
            )
        )  # fmt: skip
    assert batches[1].model_inputs == {}
    joined = TokenRollout.concatenate(batches)
    if family == "qwen2_vl":
        grid = joined.model_inputs["image_grid_thw"]
        assert grid.shape == (3, 2, 3) and int(grid[1].abs().sum()) == 0  # the text row: padding
    else:
        assert joined.model_inputs["images_per_prompt"].tolist() == [1, 0, 2]
        assert joined.model_inputs["pixel_values"].shape == (3, 2, 3, 32, 32)
    # Each row scores as it did in its own batch.
    completion = torch.tensor([[20, 21]] * 3)
    full = torch.cat([joined.input_ids, completion], 1)
    attention = torch.cat([joined.attention_mask, torch.ones_like(completion)], 1)
    together = policy.token_log_probs(full, attention, completion, 1.0, joined.model_inputs)
    for row, batch in enumerate(batches):
        alone_ids = torch.cat([batch.input_ids, completion[:1]], 1)
        alone_mask = torch.cat([batch.attention_mask, torch.ones(1, 2).long()], 1)
        alone = policy.token_log_probs(
            alone_ids, alone_mask, completion[:1], 1.0, batch.model_inputs
        )
        torch.testing.assert_close(together[row], alone[0], rtol=0, atol=2e-5)


class UnprobedProcessor:
    """A LLaVA processor that refuses a lone prompt with two images, so that the policy cannot
    learn whether its pixel rows are per image or per prompt."""

    def __init__(self, processor: object) -> None:
        self.inner = processor

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def __call__(self, *, text: list[str], images: list | None = None, **kwargs: object):
        if len(text) == 1 and images is not None and len(images[0]) > 1:
            raise ValueError("refused")
        return self.inner(text=text, images=images, **kwargs)


def test_a_llava_batch_with_uneven_image_counts_nests_its_pixels_per_image(tmp_path: Path) -> None:
    """LLaVA's processor returns one pixel row per image: rows [2 images, 0] nest them per prompt;
    where the layout cannot be learnt, uneven counts are refused."""
    from vision_tiny import build_llava

    llava = build_llava(tmp_path / "llava")
    policy = build_policy("vlm", pretrained=str(llava))
    prompts = [
        Prompt(
            "Does this image contain artifacts?", {"images": [picture((1, 2, 3), (32, 32))] * 2}
        ),
        Prompt("Answer Yes or No", {}),
    ]
    extras = policy.model_inputs(prompts)
    assert extras["images_per_prompt"].tolist() == [2, 0]
    assert extras["pixel_values"].shape == (2, 2, 3, 32, 32)
    assert extras["pixel_values"][1].abs().sum() == 0  # padding
    unprobed = build_policy("vlm", pretrained=str(llava))
    unprobed.processor = UnprobedProcessor(unprobed.processor)
    expected = (
        r"as many images: 'Answer Yes or No' has 0, 'Does this image contain artifacts\?' has 2"
    )
    with pytest.raises(ValueError, match=expected):
        unprobed.encode_prompts(prompts)


def test_lora_targets_that_name_only_the_vision_tower_are_refused(qwen: Path) -> None:
    policy = build_policy("vlm", pretrained=str(qwen))
    with pytest.raises(ValueError, match=r"match no linear layer of the language model"):
        policy.setup_training(4, 8, ["qkv"])  # Qwen2-VL's vision attention only


def test_full_fine_tuning_keeps_the_frozen_vision_tower_in_its_dtype(qwen: Path) -> None:
    policy = build_policy("vlm", pretrained=str(qwen), dtype="bfloat16")
    policy.setup_training(0, 0.0, None)
    params = dict(policy.network.named_parameters())
    vision = [p for n, p in params.items() if "visual" in n]
    language = [p for n, p in params.items() if "visual" not in n]
    assert vision and all(not p.requires_grad and p.dtype == torch.bfloat16 for p in vision)
    assert all(p.requires_grad and p.dtype == torch.float32 for p in language)


def sample_and_check_against_direct_forwards(
    directory: Path, prompts: list[Prompt], expected_inputs: set[str]
) -> None:
    """Sampling log-probs equal the scoring forward's, and each row's equal a direct unpadded
    forward of the stock model on its processor's chat path for that prompt alone (token types
    marking the completion as text, the vision placeholders' logits at -inf)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    policy = build_policy("vlm", pretrained=str(directory))
    ids, mask = policy.encode_prompts(prompts)
    assert not mask.all()  # left padding is exercised
    extras = policy.model_inputs(prompts)
    assert set(extras) == expected_inputs and all(len(v) == len(prompts) for v in extras.values())
    out = policy.generate(ids, mask, TokenSampler(1.0), 5, torch.Generator().manual_seed(0), extras)
    full = torch.cat([ids, out.tokens], dim=1)
    attention = torch.cat([mask, out.mask.long()], dim=1)
    ours = policy.token_log_probs(full, attention, out.tokens, 1.0, extras)
    torch.testing.assert_close(ours[out.mask], out.log_probs[out.mask], rtol=0, atol=2e-5)
    processor = AutoProcessor.from_pretrained(str(directory))
    model = AutoModelForImageTextToText.from_pretrained(str(directory)).eval()
    for row, prompt in enumerate(prompts):
        images = [{"type": "image", "image": i} for i in prompt.columns["images"]]
        message = {"role": "user", "content": [*images, {"type": "text", "text": str(prompt)}]}
        inputs = processor.apply_chat_template(
            [message], add_generation_prompt=True, tokenize=True, return_dict=True,
            return_tensors="pt",
        )  # fmt: skip
        tokens = out.tokens[row][out.mask[row]]
        kwargs = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        for key in ("token_type_ids", "mm_token_type_ids"):
            if key in kwargs:  # the completion is text
                kwargs[key] = torch.cat([kwargs[key], torch.zeros(1, len(tokens)).long()], 1)
        direct_ids = torch.cat([inputs["input_ids"][0], tokens])[None]
        logits = model(input_ids=direct_ids, **kwargs).logits[0]
        logits[:, model.config.image_token_id] = float("-inf")  # never sampled nor scored
        scores = torch.log_softmax(logits[-len(tokens) - 1 : -1], dim=-1)
        expected = scores.gather(1, tokens[:, None])[:, 0]
        torch.testing.assert_close(ours[row][out.mask[row]], expected, rtol=0, atol=2e-5)


def test_gemma3_image_tokens_attend_both_ways_in_sampling_and_scoring(tmp_path: Path) -> None:
    """Gemma 3's forward takes ``token_type_ids`` marking image tokens (bidirectional
    attention among them); the adapter rebuilds them from the ids."""
    from vision_tiny import build_gemma3

    gemma = build_gemma3(tmp_path / "gemma3")
    prompts = [
        Prompt("What colour is this picture?", {"images": [picture((200, 0, 0), (40, 40))]}),
        Prompt("Count.", {"images": [picture((0, 0, 200), (32, 48))]}),
        Prompt("Same text, another image?", {"images": [picture((0, 90, 9), (20, 20))]}),
    ]
    sample_and_check_against_direct_forwards(gemma, prompts, {"pixel_values", "images_per_prompt"})
    # The types mark the prompt's image tokens only: an image id sampled in a completion is text.
    policy = build_policy("vlm", pretrained=str(gemma))
    ids, mask = policy.encode_prompts(prompts)
    extras = policy.model_inputs(prompts)
    image = policy.base_model.config.image_token_id
    completion = torch.tensor([[image, 21, 22]] * 3)
    full = torch.cat([ids, completion], 1)
    attention = torch.cat([mask, torch.ones_like(completion)], 1)
    types = policy._model_kwargs(full, attention, extras, 3)["token_type_ids"]
    assert types[:, -3:].sum() == 0 and types.sum(1).tolist() == [4, 4, 4]
    assert torch.equal(types[:, :-3].bool(), ids == image)
    completion[:, 0] = 20  # the forward would take an image id for an image position
    full = torch.cat([ids, completion], 1)
    # Without them the image tokens attend causally and the scores differ (slightly, in a tiny
    # random model).
    with_types = policy.token_log_probs(full, attention, completion, 1.0, extras)
    policy.family = VLMFamily()  # no token types
    causal = policy.token_log_probs(full, attention, completion, 1.0, extras)
    assert (with_types - causal).abs().max() > 1e-5


def test_idefics3_split_images_in_uneven_counts_score_like_direct_forwards(
    tmp_path: Path,
) -> None:
    """Idefics3 (SmolVLM's layout) splits each image into tiles plus a global view: its pixels
    are ``[B, images, 3, H, W]`` with a ``pixel_attention_mask``, the images dimension
    zero-padded to the prompt with the most tiles (which the model drops)."""
    from vision_tiny import build_idefics3

    idefics = build_idefics3(tmp_path / "idefics3")
    prompts = [
        Prompt("What colour is this picture?", {"images": [picture((200, 0, 0), (64, 30))]}),
        Prompt("Two: same?", {"images": [picture((0, 0, 200), (20, 20))] * 2}),
        Prompt("Count.", {"images": [picture((0, 90, 9), (24, 20))]}),
    ]
    sample_and_check_against_direct_forwards(
        idefics, prompts, {"pixel_values", "pixel_attention_mask"}
    )
    policy = build_policy("vlm", pretrained=str(idefics))
    pixels = policy.model_inputs(prompts)["pixel_values"]
    real = pixels.flatten(2).abs().sum(-1) > 0
    assert pixels.shape[:2] == (3, 10) and real.sum(1).tolist() == [3, 10, 5]
