"""Weighted composite of several reward models, with per-reward metrics and input checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from loading.extras import MissingExtraError, missing_extra
from loading.hub import ModelNotCachedError
from reward_models.base import RewardInputError, RewardModel, RewardOutput


class RewardError(RuntimeError):
    """A reward model failed or returned unusable values; the message names it and the sample.

    An error about one sample is made with ``about_sample``, which keeps the sample's index
    apart from the text: a batch scored in chunks (``train.overlap_rewards``) renumbers it with
    ``shifted`` so that the message names the sample's row in the whole batch.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.sample: int | None = None
        self._parts = ("", "")

    @classmethod
    def about_sample(cls, head: str, sample: int, tail: str) -> RewardError:
        """The error ``f"{head}{sample}{tail}"`` about sample ``sample`` of the scored batch."""
        error = cls(f"{head}{sample}{tail}")
        error.sample, error._parts = sample, (head, tail)
        return error

    def shifted(self, offset: int) -> RewardError:
        """This error for a batch that starts ``offset`` rows later (itself when the error
        names no sample, or the offset is 0)."""
        if self.sample is None or offset == 0:
            return self
        return RewardError.about_sample(self._parts[0], self.sample + offset, self._parts[1])


class CompositeReward(RewardModel):
    """``reward = sum_k w_k * r_k`` over the primary scores of several reward models.

    Every sub-score appears in the output as ``<reward>/<score>`` (and the primary one also as
    ``<reward>``), so per-reward metrics are logged. A non-finite score that the reward did not
    mark as "not applicable" raises ``RewardError`` naming the reward and the sample; samples for
    which a reward is not applicable get its contribution skipped (weights renormalised over the
    rewards that apply).

    Args:
        rewards: (reward model, weight) pairs.
    """

    name = "reward"

    def __init__(self, rewards: Sequence[tuple[RewardModel, float]]) -> None:
        if not rewards:
            raise ValueError("a composite reward needs at least one reward model")
        names = [r.name for r, _ in rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique, got {names}")
        self.rewards = list(rewards)
        # Calls from several threads at once only when every member allows them.
        self.concurrent_calls = min(max(1, int(r.concurrent_calls)) for r, _ in rewards)
        # One reward (the common case) bounds the total: each sample's total is w * r. With
        # several, the renormalisation over the rewards that apply moves the bounds per
        # sample, so none is declared.
        only, weight = self.rewards[0]
        if len(self.rewards) == 1 and only.score_range is not None:
            ends = (weight * only.score_range[0], weight * only.score_range[1])
            self.score_range = (min(ends), max(ends))
        # Each member's headline score (``RewardModel.headline``) under the composite's name
        # for it, e.g. ``countdown/accuracy``: what a run's closing line quotes.
        self.headlines = [f"{r.name}/{r.headline}" for r, _ in self.rewards if r.headline]
        # Every member scores the same outputs: the composite takes what all of them take.
        self.accepts = tuple(
            kind for kind in rewards[0][0].accepts if all(kind in r.accepts for r, _ in rewards)
        )

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        scores: dict[str, torch.Tensor] = {}
        total = torch.zeros(len(prompts))
        weight_sum = torch.zeros(len(prompts))
        for model, weight in self.rewards:
            try:
                result = model(outputs, prompts, metadata)
            except (MissingExtraError, ModelNotCachedError):
                raise  # one line already, naming the model and the way out
            except RewardInputError as err:  # the caller's input: kept as such (a server's 422)
                raise RewardInputError(f"reward model {model.name!r}: {err}") from err
            except ImportError as err:  # a model that loads its library on first use
                missing = missing_extra(err, f"reward {model.name!r}", "rewards")
                if missing is None:
                    raise RewardError(f"reward model {model.name!r} raised: {err!r}") from err
                raise missing from err
            except Exception as err:  # re-raised with the reward's name for the user
                raise RewardError(f"reward model {model.name!r} raised: {err!r}") from err
            for key, value in result.scores.items():
                scores[key if key == model.name else f"{model.name}/{key}"] = value.float().cpu()
            primary = result.scores[model.name].float().cpu()
            applicable = result.applicable.get(
                model.name, torch.ones(len(prompts), dtype=torch.bool)
            )
            applicable = applicable.cpu()
            bad = (~torch.isfinite(primary)) & applicable
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise RewardError.about_sample(
                    f"reward model {model.name!r} returned {primary[i].item()} for sample ",
                    i,
                    f" (prompt {prompts[i]!r}); rewards must be finite",
                )
            total += torch.where(applicable, weight * primary, torch.zeros_like(primary))
            weight_sum += applicable.float() * abs(weight)
        none_apply = weight_sum == 0
        if bool(none_apply.any()):
            i = int(none_apply.nonzero()[0])
            raise RewardError.about_sample(
                "no reward model applies to sample ", i, f" (prompt {prompts[i]!r})"
            )
        total_weight = sum(abs(w) for _, w in self.rewards)
        scores[self.name] = total * (total_weight / weight_sum)
        return RewardOutput(scores)

    def update(
        self,
        outputs: Any,
        prompts: list[str],
        metadata: Any = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Each reward's ``update``; metrics as ``<reward>/<metric>``."""
        metrics: dict[str, float] = {}
        for model, _ in self.rewards:
            for key, value in model.update(outputs, prompts, metadata, gather).items():
                metrics[f"{model.name}/{key}"] = value
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {m.name: m.state_dict() for m, _ in self.rewards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for model, _ in self.rewards:
            if model.name in state:
                model.load_state_dict(state[model.name])
