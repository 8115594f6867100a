"""``rubric``: a reward from per-prompt rubrics, each criterion routed to a verifier, an
extractor plus a verifier, or an LLM/VLM judge (RLR^3's routes; ``reward_models/rubric/spec.py``
for the format), aggregated with the essential gate and per-group saturation handling
(``reward_models/rubric/aggregate.py``).

Where a sample's rubric comes from, first found wins: ``metadata[i]["rubric"]`` (a dataset
column: a list of criteria, or JSON/YAML text), the ``rubrics`` mapping (prompt text -> rubric,
inline or a JSON/YAML file), the ``rubric`` argument (one rubric for every prompt). The ground
truth is the criterion's ``answer``, else ``metadata[i]["answer"]``.

Minimal exposure (RLR^3, https://arxiv.org/abs/2605.30244, abstract: "masks ground truths from
extractors and images from judges"): the extractor's question is built from the prompt, the
response and the criterion's ``extract`` description only, and the reward refuses a criterion
whose ``extract`` text contains its ground truth; a judge is shown an image only for criteria
with ``needs_image`` (or when the output itself is an image), and never the ground truth unless
the rubric's own criterion text states it.

Batching: every LLM extraction of the batch (samples x criteria) goes to the judge back-end in
one ``generate`` call, every judge question in one ``p_yes`` call (chunks of ``batch_size`` per
forward locally, ``concurrency`` requests in flight for an endpoint); ``batched=False`` asks one
item per call (``benchmarks/rubric.py`` compares the two).

Groups: rewards are not given group ids (``genrl/loop/collection.py`` passes outputs, prompts and
metadata), so samples with the same prompt text form a group here. Each process scores its own
slice of the batch, so a group split across processes is handled per piece.

Scores: ``rubric`` (the reward), ``essential``, ``additional``, ``pitfall_penalty``,
``gate_pass``, ``saturated_fraction`` (of the sample's criteria left out) and, with
``log_criteria``, ``criterion/<id>`` for every criterion id in the batch (NaN and
``applicable=False`` where a sample's rubric lacks it or it does not apply). Per-criterion names
depend on the batch's rubrics: with per-prompt rubrics on several processes, whose score names
must agree when gathered, set ``log_criteria=False``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput, output_kind
from reward_models.judge_backend import JudgeBackend
from reward_models.rubric.aggregate import CATEGORY_CODES, aggregate, saturated
from reward_models.rubric.spec import (
    Criterion,
    extractor_of,
    load_structured,
    parse_rubric,
    verifier_of,
)

JUDGE_TEMPLATE = (
    "Prompt: {prompt}\nResponse: {response}\nCriterion: {criterion}\n"
    "Is the criterion true of the response? Answer Yes or No."
)
IMAGE_JUDGE_TEMPLATE = "Prompt: {prompt}\nCriterion: {criterion}\nIs the criterion true of the image? Answer Yes or No."
EXTRACT_TEMPLATE = (
    "Prompt: {prompt}\nResponse: {response}\n"
    "Extract {what} from the response. Reply with it only, or NONE if there is none."
)


class RubricReward(RewardModel):
    """Rubric reward (module docstring).

    Args:
        rubric: one rubric for every prompt (list of criteria, JSON/YAML text or file path).
        rubrics: prompt text -> rubric (a dict or a JSON/YAML file holding one).
        judge: the judge back-end's arguments (``reward_models.judge_backend.JudgeBackend``:
            ``model`` or ``endpoint`` and their settings), or a built back-end; needed only by
            judge criteria and LLM extractors.
        gate: ``"hierarchical"``, ``"hard"`` or ``"none"`` (``rubric_aggregate``).
        pass_threshold: an essential criterion passes at this score or above.
        saturation: ``"drop"`` (leave out of a group's means the non-essential criteria every
            sample of the group scores the same) or ``"keep"``.
        log_criteria: also return ``criterion/<id>`` scores.
        batched: send the batch's judge items together (False: one per call).
        judge_template, image_judge_template, extract_template: the questions asked.
        rubric_key, answer_key, image_key: the metadata columns read.
    """

    name = "rubric"
    accepts = ("texts", "images")
    adaptive = False  # True when ``weights_for`` is not the human weights (also log ``human``)

    def __init__(
        self,
        rubric: Any = None,
        rubrics: Any = None,
        judge: dict[str, Any] | JudgeBackend | None = None,
        gate: str = "hierarchical",
        pass_threshold: float = 0.5,
        saturation: str = "drop",
        log_criteria: bool = True,
        batched: bool = True,
        judge_template: str = JUDGE_TEMPLATE,
        image_judge_template: str = IMAGE_JUDGE_TEMPLATE,
        extract_template: str = EXTRACT_TEMPLATE,
        rubric_key: str = "rubric",
        answer_key: str = "answer",
        image_key: str = "image",
    ) -> None:
        if saturation not in ("drop", "keep"):
            raise ValueError(f"{self.name}: saturation must be 'drop' or 'keep'")
        self.default = parse_rubric(rubric) if rubric is not None else None
        table = load_structured(rubrics) if isinstance(rubrics, str) else rubrics
        self.by_prompt = {str(k): parse_rubric(v) for k, v in (table or {}).items()}
        if isinstance(judge, dict):
            judge = JudgeBackend(**judge, owner=self.name)
        self.judge = judge
        self.gate, self.pass_threshold, self.saturation = gate, pass_threshold, saturation
        self.log_criteria, self.batched = log_criteria, batched
        self.judge_template, self.image_judge_template = judge_template, image_judge_template
        self.extract_template = extract_template
        self.rubric_key, self.answer_key, self.image_key = rubric_key, answer_key, image_key
        self._parsed: dict[str, list[Criterion]] = {}
        # The last scored batch (outputs, prompts, rubrics, scores), for ``update`` to reuse.
        self._last: tuple[Any, list[str], list[list[Criterion]], torch.Tensor] | None = None
        aggregate(
            torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1, 1), torch.ones(1, 1).bool(), gate
        )

    # -- rubric lookup -----------------------------------------------------------------------
    def rubric_for(self, prompt: str, meta: dict[str, Any]) -> list[Criterion]:
        """The sample's criteria (module docstring for the order of the sources)."""
        raw = meta.get(self.rubric_key)
        if raw is not None:
            key = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
            if key not in self._parsed:
                self._parsed[key] = parse_rubric(raw)
            return self._parsed[key]
        if prompt in self.by_prompt:
            return self.by_prompt[prompt]
        if self.default is None:
            raise ValueError(
                f"{self.name}: no rubric for prompt {prompt!r} (no {self.rubric_key!r} metadata, "
                "no rubrics entry and no default rubric)"
            )
        return self.default

    def weights_for(self, rubric: list[Criterion]) -> list[float]:
        """The weights used for training (the human weights; POW3R adapts them)."""
        return [c.weight for c in rubric]

    def _backend(self, crit: Criterion) -> JudgeBackend:
        if self.judge is None:
            raise ValueError(
                f"{self.name}: criterion {crit.id!r} needs a judge; give judge={{'model': ...}} "
                "or judge={'endpoint': ...}"
            )
        return self.judge

    def _ask(
        self, fn: Callable[[list[str], list[Any]], Any], items: list[tuple[str, Any]]
    ) -> list[Any]:
        """Answers to ``(question, image)`` items: one call, or one call per item."""
        if not items:
            return []
        if self.batched:
            return list(fn([q for q, _ in items], [i for _, i in items]))
        return [next(iter(fn([q], [i]))) for q, i in items]

    # -- scoring -----------------------------------------------------------------------------
    def criterion_scores(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> tuple[list[list[Criterion]], torch.Tensor, list[dict[str, Any]]]:
        """Every criterion of every sample scored: rubrics, ``[B, K]`` scores (NaN: not
        applicable or no such slot) and per-sample info (extracted answers)."""
        images_out = output_kind(outputs) == "images"
        rubrics = [self.rubric_for(p, m) for p, m in zip(prompts, metadata, strict=True)]
        width = max(len(r) for r in rubrics)
        scores = torch.full((len(prompts), width), float("nan"))
        info: list[dict[str, Any]] = [{"extracted": {}} for _ in prompts]
        extract_items: list[tuple[int, int, str]] = []
        judge_items: list[tuple[int, int, str, Any]] = []
        for i, rubric in enumerate(rubrics):
            meta, prompt = metadata[i], prompts[i]
            for k, crit in enumerate(rubric):
                truth = crit.answer if crit.answer is not None else meta.get(self.answer_key)
                if crit.route != "judge" and images_out:
                    raise ValueError(
                        f"{self.name}: criterion {crit.id!r}: only judges score images"
                    )
                if crit.route == "verifier":
                    scores[i, k] = self._verify(crit, outputs[i], truth)
                elif crit.route == "extract":
                    if truth is not None and str(truth) and str(truth) in crit.extract:
                        raise ValueError(
                            f"{self.name}: criterion {crit.id!r}: the extract description "
                            "contains the ground truth (the extractor must not see it)"
                        )
                    rule = extractor_of(crit.extractor)
                    if rule is None:
                        question = self.extract_template.format(
                            prompt=prompt, response=outputs[i], what=crit.extract
                        )
                        extract_items.append((i, k, question))
                    else:
                        found = rule(outputs[i])
                        info[i]["extracted"][crit.id] = found
                        scores[i, k] = 0.0 if found is None else self._verify(crit, found, truth)
                elif images_out:
                    question = self.image_judge_template.format(prompt=prompt, criterion=crit.text)
                    judge_items.append((i, k, question, outputs[i]))
                else:
                    question = self.judge_template.format(
                        prompt=prompt, response=outputs[i], criterion=crit.text
                    )
                    image = meta.get(self.image_key) if crit.needs_image else None
                    judge_items.append((i, k, question, image))
        if extract_items:
            backend = self._backend(rubrics[extract_items[0][0]][extract_items[0][1]])
            answers = self._ask(backend.generate, [(q, None) for _, _, q in extract_items])
            for (i, k, _), answer in zip(extract_items, answers, strict=True):
                crit = rubrics[i][k]
                truth = crit.answer if crit.answer is not None else metadata[i].get(self.answer_key)
                found = None if answer.strip().upper() in ("", "NONE") else answer
                info[i]["extracted"][crit.id] = found
                scores[i, k] = 0.0 if found is None else self._verify(crit, found, truth)
        if judge_items:
            backend = self._backend(rubrics[judge_items[0][0]][judge_items[0][1]])
            values = self._ask(backend.p_yes, [(q, img) for _, _, q, img in judge_items])
            for (i, k, _, _), value in zip(judge_items, values, strict=True):
                scores[i, k] = float(value)
        return rubrics, scores, info

    def _verify(self, crit: Criterion, text: str, truth: Any) -> float:
        assert crit.verifier is not None
        value = verifier_of(crit.verifier)(str(text), truth, **crit.verifier_kwargs)
        return float("nan") if value is None else float(value)

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        metadata = metadata or [{} for _ in prompts]
        rubrics, scores, info = self.criterion_scores(outputs, prompts, metadata)
        self._last = (outputs, list(prompts), rubrics, scores)
        result = self.combine(rubrics, scores, prompts, [self.weights_for(r) for r in rubrics])
        out: dict[str, torch.Tensor] = {self.name: result["reward"]}
        out.update({k: v for k, v in result.items() if k != "reward"})
        if self.adaptive:  # the rubric objective: the same scores under the human weights
            human = [[c.weight for c in r] for r in rubrics]
            out["human"] = self.combine(rubrics, scores, prompts, human)["reward"]
        applicable = {self.name: torch.isfinite(result["reward"])}
        if self.log_criteria:
            for crit_id in dict.fromkeys(c.id for r in rubrics for c in r):
                column = torch.full((len(prompts),), float("nan"))
                for i, rubric in enumerate(rubrics):
                    for k, crit in enumerate(rubric):
                        if crit.id == crit_id:
                            column[i] = scores[i, k]
                out[f"criterion/{crit_id}"] = column
                applicable[f"criterion/{crit_id}"] = torch.isfinite(column)
        for i, rubric in enumerate(rubrics):
            info[i]["criteria"] = {c.id: float(scores[i, k]) for k, c in enumerate(rubric)}
        return RewardOutput(out, applicable, info)

    def combine(
        self,
        rubrics: list[list[Criterion]],
        scores: torch.Tensor,
        prompts: list[str],
        weights: list[list[float]],
    ) -> dict[str, torch.Tensor]:
        """The reward and its parts (``rubric_aggregate.aggregate``) from ``[B, K]`` criterion
        scores with the given per-sample weights; ``saturated_fraction`` ``[B]`` too."""
        shape = scores.shape
        w = torch.zeros(shape)
        cat = torch.zeros(shape, dtype=torch.long)
        present = torch.zeros(shape, dtype=torch.bool)
        for i, rubric in enumerate(rubrics):
            for k, crit in enumerate(rubric):
                w[i, k], cat[i, k], present[i, k] = (
                    weights[i][k],
                    CATEGORY_CODES[crit.category],
                    True,
                )
        active = present & torch.isfinite(scores)
        dropped = torch.zeros(shape, dtype=torch.bool)
        if self.saturation == "drop":
            groups = group_index(prompts, rubrics)
            dropped = saturated(scores, groups) & active & (cat != CATEGORY_CODES["essential"])
        result = aggregate(scores, w, cat, active & ~dropped, self.gate, self.pass_threshold)
        counts = present.sum(dim=1).clamp(min=1)
        result["saturated_fraction"] = dropped.sum(dim=1) / counts
        return result


def group_index(prompts: list[str], rubrics: list[list[Criterion]]) -> list[int]:
    """``[B]`` group of each sample: the first sample with the same prompt text and rubric
    (rewards get no group ids; module docstring)."""
    groups = [prompts.index(p) for p in prompts]
    return [g if rubrics[g] is rubrics[i] else i for i, g in enumerate(groups)]


__all__ = [
    "EXTRACT_TEMPLATE",
    "IMAGE_JUDGE_TEMPLATE",
    "JUDGE_TEMPLATE",
    "RubricReward",
    "group_index",
]
