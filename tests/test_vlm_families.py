"""Every VLM family of ``vlm_family_table.FAMILIES`` through the ``vlm`` policy, one table of
the same checks: a tiny random checkpoint saved with its processor and loaded through genrl's
loader scores a completion as the stock model's own unpadded forward does (on the stock
processor's inputs for the prompt and the completion), samples what it scores, trains a LoRA
for two GRPO iterations with a first-minibatch importance ratio of exactly 1, its reference
policy (the adapter disabled) is the stock base model, and its exported adapter in the stock
classes scores as it does. Each batch holds one-image prompts of different sizes and a
two-image prompt."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_vlm import AnswerMatch, picture, vlm_config
from vlm_family_table import FAMILIES, Family, no_num2words

from genrl import Trainer
from pipelines import build_policy
from reward_models import REWARDS
from samplers.autoregressive import TokenSampler
from tasks.prompt import Prompt

# transformers' PaliGemma processor builds its labels with a call numpy 2 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:transformers.models.paligemma")
# float32 tiny models: a padded batch against one unpadded sequence differs by summation order.
TOLERANCE = 1e-5
# Config ids a completion never holds (the adapter's logits there are -inf).
PLACEHOLDERS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
VISION_SIDE = ("visual", "vision_tower", "vision_model", "multi_modal_projector", "connector")


@pytest.fixture(scope="module", autouse=True)
def smolvlm_without_num2words() -> Iterator[None]:
    """SmolVLM's processor refuses to be built without ``num2words`` (for video prompts only);
    where it is not installed a stand-in that fails if called takes its place."""
    if importlib.util.find_spec("num2words") is not None:
        yield
        return
    from transformers.models.smolvlm import processing_smolvlm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processing_smolvlm, "num2words", no_num2words)
        yield


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Family, Path]:
    row: Family = request.param
    return row, row.build(tmp_path_factory.mktemp(row.name))


def prompts_of() -> list[Prompt]:
    """Two one-image prompts of different sizes and text lengths (left padding, different
    vision token or tile counts where the processor resizes or splits) and a two-image prompt
    (uneven image counts in one batch)."""
    two = [picture((9, 9, 9), (16, 16)), picture((90, 9, 200), (32, 16))]
    return [
        Prompt("What colour?", {"images": [picture((200, 30, 30), (32, 32))]}),
        Prompt("Count the shapes now.", {"images": [picture((20, 200, 30), (24, 40))]}),
        Prompt("Two pictures: same?", {"images": two}),
    ]


COMPLETIONS = ["a red", "3 box", "no ok"]  # characters: one token each


def stock_inputs(processor: Any, row: Family, prompt: Prompt, completion: str) -> Any:
    """The stock processor's inputs for ``prompt`` alone and ``completion`` after it: its own
    chat path (``apply_chat_template(tokenize=True)``, images in the message) with the
    completion's ids appended and the token types extended as text (0); for PaliGemma, which has
    no chat template, its image tokens, the text and the completion as a ``suffix`` (which it
    marks as the causal part and ends with ``<eos>``)."""
    images = prompt.columns["images"]
    tokens = torch.tensor([processor.tokenizer.convert_tokens_to_ids(list(completion))])
    if row.prefix_suffix:
        text = processor.image_token * len(images) + str(prompt)
        return processor(text=[text], images=[images], suffix=[completion], return_tensors="pt")
    content = [*({"type": "image", "image": i} for i in images)]
    message = {"role": "user", "content": [*content, {"type": "text", "text": str(prompt)}]}
    inputs = dict(
        processor.apply_chat_template(
            [message],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
    )
    for key in ("input_ids", "token_type_ids", "mm_token_type_ids"):
        if key in inputs:
            tail = tokens if key == "input_ids" else torch.zeros_like(tokens)
            inputs[key] = torch.cat([inputs[key], tail], 1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return inputs


def stock_log_probs(directory: Path, row: Family, prompts: list[Prompt]):
    """Per prompt, ``log p(completion | prompt)`` from the stock model's forward on
    ``stock_inputs``, unpadded, with the model's default positions and the placeholders'
    logits at -inf; with the ids, to compare with ours."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(directory))
    model = AutoModelForImageTextToText.from_pretrained(str(directory)).eval()
    placeholders = [i for n in PLACEHOLDERS if (i := getattr(model.config, n, None)) is not None]
    results = []
    for prompt, completion in zip(prompts, COMPLETIONS, strict=True):
        inputs = stock_inputs(processor, row, prompt, completion)
        kwargs = {k: v for k, v in inputs.items() if k not in ("input_ids", "labels")}
        ids = inputs["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=ids, **kwargs).logits[0]
        logits[:, placeholders] = float("-inf")
        tokens = torch.tensor(processor.tokenizer.convert_tokens_to_ids(list(completion)))
        start = ids.shape[1] - len(tokens) - (1 if row.prefix_suffix else 0)  # PaliGemma: <eos>
        assert torch.equal(ids[0, start : start + len(tokens)], tokens)
        scores = torch.log_softmax(logits[start - 1 : start + len(tokens) - 1], dim=-1)
        results.append((ids[0, : start + len(tokens)], scores.gather(1, tokens[:, None])[:, 0]))
    return results


def ours(policy: Any, prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's log-probs of ``COMPLETIONS`` after the batch of ``prompts`` (left-padded),
    the full ids and the attention mask."""
    ids, mask = policy.encode_prompts(prompts)
    tokens = [policy.tokenizer.convert_tokens_to_ids(list(c)) for c in COMPLETIONS]
    completion = torch.tensor(tokens)
    full = torch.cat([ids, completion], 1)
    attention = torch.cat([mask, torch.ones_like(completion)], 1)
    extras = policy.model_inputs(prompts)
    return policy.token_log_probs(full, attention, completion, 1.0, extras), full, attention


def test_log_probs_equal_the_stock_forward(family: tuple[Family, Path]) -> None:
    row, directory = family
    policy = build_policy("vlm", pretrained=str(directory))
    prompts = prompts_of()
    scores, full, attention = ours(policy, prompts)
    assert not attention.all()  # left padding is exercised
    stock = stock_log_probs(directory, row, prompts)
    difference = 0.0
    for i, (ids, expected) in enumerate(stock):
        assert torch.equal(full[i][attention[i].bool()], ids)  # the same tokens
        difference = max(difference, float((scores[i] - expected).abs().max()))
    print(f"{row.name}: max |log-prob difference| {difference:.2g}")
    assert difference <= TOLERANCE


def test_sampling_log_probs_equal_the_scoring_forward(family: tuple[Family, Path]) -> None:
    """Generation (prompt forward, then cached steps at continued positions) scores its tokens
    as the training forward does."""
    _, directory = family
    policy = build_policy("vlm", pretrained=str(directory))
    prompts = prompts_of()
    ids, mask = policy.encode_prompts(prompts)
    extras = policy.model_inputs(prompts)
    out = policy.generate(ids, mask, TokenSampler(1.0), 5, torch.Generator().manual_seed(0), extras)
    full = torch.cat([ids, out.tokens], 1)
    attention = torch.cat([mask, out.mask.long()], 1)
    rescored = policy.token_log_probs(full, attention, out.tokens, 1.0, extras)
    torch.testing.assert_close(rescored[out.mask], out.log_probs[out.mask], rtol=0, atol=2e-5)


def test_grpo_trains_a_language_lora_and_the_reference_is_the_base_model(
    family: tuple[Family, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row, directory = family
    monkeypatch.setitem(REWARDS, "answer_match", AnswerMatch)
    trainer = Trainer(vlm_config(tmp_path, directory))
    network = trainer.policy.network
    lora = {n: p.detach().clone() for n, p in network.named_parameters() if p.requires_grad}
    assert lora and all("lora" in n and not any(v in n for v in VISION_SIDE) for n in lora)
    for _ in range(2):
        assert trainer.train_iteration()["loss/first_minibatch_ratio_deviation"] == 0.0
    after = dict(network.named_parameters())
    changed = [n for n, p in lora.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.5 * len(lora)

    policy = trainer.policy
    policy.network.eval()
    prompts = prompts_of()
    with torch.no_grad():
        trained, _, _ = ours(policy, prompts)
        with policy.reference():  # the adapter disabled
            reference, _, _ = ours(policy, prompts)
    stock = stock_log_probs(directory, row, prompts)
    difference = max(float((reference[i] - e).abs().max()) for i, (_, e) in enumerate(stock))
    moved = float((trained - reference).abs().max())
    print(f"{row.name}: reference {difference:.2g} from the base model, trained {moved:.2g}")
    assert difference <= TOLERANCE
    assert moved > 1e-4  # and the trained adapter is not the base model

    # The exported adapter in the stock classes scores as the trained policy.
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    exported = str(trainer.export(tmp_path / "export"))
    base = AutoModelForImageTextToText.from_pretrained(str(directory))
    reloaded = build_policy(
        "vlm",
        model=PeftModel.from_pretrained(base, exported).eval(),
        processor=AutoProcessor.from_pretrained(exported),
    )
    with torch.no_grad():
        torch.testing.assert_close(ours(reloaded, prompts)[0], trained, rtol=0, atol=TOLERANCE)
