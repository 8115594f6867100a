"""Phases 1-4 with the replay store (``replay.*``): ExGRPO's replayed questions and AR3PO's
reuse of earlier correct completions, mixed into an iteration's groups.

An iteration with the store (``ReplayRound.collect``, called by ``BatchCollector.collect``):

1. prompts: the iteration's ``P`` prompts as usual; with ExGRPO (``replay.ratio > 0``, once the
   delayed start is over) ``n = min(#replayable, int(P * ratio))`` questions are drawn from the
   store by bucket (``ReplayStore.draw_questions``) and take the place of the last ``n`` fresh
   prompts (the released collate function keeps the first ``P - n`` of the loader's prompts);
   each such group's first member is the question's stored completion of lowest entropy
   (``replay.entropy``), the other ``G - 1`` are sampled (the released rollout puts the whole
   stored trajectory as the first of the ``n`` responses, ``n_prefix=1``, prefix ratio 1).
2. rollout: only the fresh members are sampled, so an ExGRPO iteration generates ``P G - n``
   completions.
3. rewards: the fresh completions are scored; a replayed one keeps the scores it was stored
   with (the task's verifier is deterministic; the released code scores it again). AR3PO: a
   group whose fresh completions are all wrong gets a stored correct completion of its prompt
   in place of its last member, with that completion's stored scores.
4. advantages over the mixed groups, as the objective computes them (ExGRPO: the group mean
   over fresh and replayed members alike, ``compute_grpo_outcome_advantage`` over the uid).

The batch says which samples were replayed (``TokenRollout.replayed``); their
``sampler_log_probs`` are those of the policy that sampled them, which ExGRPO's objective
divides by (``genrl/objectives/mixed_policy.py``). Then the store learns from the groups
(``ReplayStore.update``) and, with ``replay.start_accuracy``, switches on after the first
iteration whose fraction of correct completions exceeds it (the released trainer's switch).
One process only (``TrainConfig.validate``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import TokenRollout
from genrl.data.rng import Streams, stream_generator
from genrl.distributed.processes import gather
from genrl.loop.groups import expand_groups
from genrl.loop.replay_store import ReplayStore, StoredCompletion
from genrl.loop.reward_overlap import score_in_chunks
from genrl.loop.rounds import CollectedBatch, sampling_context
from genrl.policies.protocols import EntropyTokenPolicy, require
from genrl.prompts.sources import reward_metadata
from tasks.prompt import prompt_id


def stored_rows(
    policy: Any, prompts: list[str], group_ids: torch.Tensor, stored: list[StoredCompletion]
) -> TokenRollout:
    """A ``TokenRollout`` of stored completions, as the rollout would have recorded them: the
    prompts encoded (left-padded), each completion's tokens right-padded, trained up to its
    recorded length, with its recorded sampling log-probs; ``replayed`` all True."""
    device = policy.device
    prompt_ids, prompt_mask = policy.encode_prompts(prompts)
    width = max([1, *(len(c.tokens) for c in stored)])
    n = len(stored)
    tokens = torch.zeros(n, width, dtype=torch.long, device=device)
    attended = torch.zeros(n, width, dtype=prompt_mask.dtype, device=device)
    trained = torch.zeros(n, width, dtype=torch.bool, device=device)
    log_probs = torch.zeros(n, width, dtype=torch.float32, device=device)
    for row, completion in enumerate(stored):
        length = len(completion.tokens)
        tokens[row, :length] = completion.tokens.to(device)
        attended[row, :length] = 1
        trained[row, : completion.trained] = True
        log_probs[row, : completion.trained] = completion.log_probs.to(device)
    not_scored = torch.zeros(n, 0, device=device)
    return TokenRollout(
        prompts=list(prompts),
        completions=policy.decode(tokens, trained),
        group_ids=group_ids.to(device),
        input_ids=torch.cat([prompt_ids, tokens], dim=1),
        attention_mask=torch.cat([prompt_mask, attended], dim=1),
        completion_mask=trained,
        old_log_probs=not_scored,
        ref_log_probs=not_scored,
        finished=torch.tensor([c.finished for c in stored], dtype=torch.bool, device=device),
        advantages=torch.zeros(n, device=device),
        model_inputs=policy.model_inputs(list(prompts)),
        sampler_log_probs=log_probs,
        replayed=torch.ones(n, dtype=torch.bool, device=device),
    )


def completion_of(
    batch: TokenRollout, row: int, scores: dict[str, torch.Tensor], index: int, iteration: int
) -> StoredCompletion:
    """Row ``row`` of a fresh batch as a completion to store (``index``: its position in the
    iteration's ``scores``)."""
    start = batch.completion_start
    attended = int(batch.attention_mask[row, start:].sum())
    trained = int(batch.completion_mask[row].sum())
    assert batch.sampler_log_probs is not None  # the autoregressive rollout records them
    log_probs = batch.sampler_log_probs[row, :trained].detach().float().cpu()
    return StoredCompletion(
        tokens=batch.input_ids[row, start : start + attended].detach().cpu(),
        trained=trained,
        log_probs=log_probs,
        finished=bool(batch.finished[row]),
        scores={name: float(values[index]) for name, values in scores.items()},
        entropy=float(-log_probs.mean()) if trained else 0.0,
        iteration=iteration,
    )


class ReplayRound:
    """The store and the round that mixes it into a ``BatchCollector``'s iterations.

    Args:
        config: the run's ``TrainConfig`` (``replay.*``, ``train.*``, ``seed``).
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.store = ReplayStore(config.replay, config.train.group_size)

    def success(self, scores: dict[str, torch.Tensor], reward_name: str) -> torch.Tensor:
        """``[N]`` bool: the completions ``replay.success_score`` calls correct."""
        r = self.config.replay
        name = r.success_score or reward_name
        if name not in scores:
            raise ConfigError(
                f"replay.success_score={name!r} is not a reward score; scores are: "
                f"{', '.join(scores)}"
            )
        return scores[name].detach().cpu() >= r.success_threshold

    def entropies(self, policy: Any, key: str, prompt: str) -> list[float] | None:
        """``replay.entropy=current``: the mean token entropy of each stored completion of
        ``key`` under the policy about to sample (None: use the recorded ones)."""
        r = self.config.replay
        if r.entropy != "current" or r.trajectory_choice == "random":
            return None
        scorer = require(policy, EntropyTokenPolicy, "replay.entropy=current")
        stored = self.store.completions[key]
        ids = torch.zeros(len(stored), dtype=torch.long)
        rows = stored_rows(policy, [prompt] * len(stored), ids, stored)
        completion = rows.input_ids[:, rows.completion_start :]
        temperature = self.config.generation.temperature
        _, entropy = scorer.token_log_probs_and_entropies(
            rows.input_ids, rows.attention_mask, completion, temperature, rows.model_inputs
        )
        mask = rows.completion_mask.float()
        means = (entropy * mask).sum(1) / mask.sum(1).clamp(min=1)
        return means.tolist()

    def collect(self, collector: Any, iteration: int) -> CollectedBatch:
        """Phases 1-4 of ``iteration`` with replay, for ``collector`` (a ``BatchCollector``)."""
        cfg, store, r = self.config, self.store, self.config.replay
        size, per = cfg.train.group_size, cfg.train.prompts_per_iteration
        policy, rollout, reward = collector.policy, collector.rollout, collector.reward
        t_start = time.perf_counter()
        drawn = collector.draw(iteration, 0)
        generator = stream_generator("genrl", Streams.REPLAY, cfg.seed, iteration)
        policy.module.eval()

        # 1. ExGRPO's questions and their trajectories replace the last fresh prompts.
        keys: list[str] = []
        if store.active and r.ratio > 0:
            wanted = min(len(store.replayable()), int(per * r.ratio))
            keys = store.draw_questions(wanted, generator)
        chosen: dict[int, StoredCompletion] = {}  # global row -> replayed completion
        first = per - len(keys)
        prompts = list(drawn.prompts[::size][:first])
        with sampling_context(collector.accelerator):
            for j, key in enumerate(keys):
                prompt = store.prompt(key)
                prompts.append(prompt)
                chosen[(first + j) * size] = store.choose(
                    key, self.entropies(policy, key, prompt), generator
                )
        global_prompts, group_ids = expand_groups(prompts, size)
        fresh_rows = [i for i in range(len(global_prompts)) if i not in chosen]

        # 2. Sample only the fresh members.
        with sampling_context(collector.accelerator):
            fresh = rollout.collect(
                policy, [global_prompts[i] for i in fresh_rows], group_ids[fresh_rows], drawn.noise
            )
        fresh.replayed = torch.zeros(len(fresh_rows), dtype=torch.bool, device=policy.device)
        t_sampled = time.perf_counter()

        # 3. Score them; replayed members keep their stored scores.
        local_prompts = [global_prompts[i] for i in fresh_rows]
        outputs = rollout.outputs(policy, fresh)
        metadata = reward_metadata(local_prompts, rollout.reward_metadata(fresh))
        chunks = rollout.chunks(len(local_prompts))
        fresh_scores = score_in_chunks(reward, outputs, local_prompts, metadata, chunks)
        fresh_scores = {k: v.detach().float().cpu() for k, v in fresh_scores.items()}
        reward_metrics = reward.update(
            outputs, local_prompts, metadata, lambda t: gather(t, collector.accelerator)
        )
        fresh_correct = self.success(fresh_scores, reward.name)
        position = {row: j for j, row in enumerate(fresh_rows)}

        # AR3PO: a group with no correct fresh member reuses a stored correct completion.
        reused: dict[int, StoredCompletion] = {}
        if r.reuse_correct:
            for g in range(first):
                members = [position[g * size + m] for m in range(size)]
                if bool(fresh_correct[members].any()):
                    continue
                found = store.correct_for_reuse(prompt_id(prompts[g]), generator)
                if found is not None:
                    reused[g * size + size - 1] = found
        replaced = {**chosen, **reused}
        kept = [row for row in fresh_rows if row not in reused]
        parts = [fresh.select(torch.tensor([position[row] for row in kept], dtype=torch.long))]
        placed = list(kept)
        if replaced:
            rows = sorted(replaced)
            parts.append(
                stored_rows(
                    policy,
                    [global_prompts[i] for i in rows],
                    group_ids[rows],
                    [replaced[i] for i in rows],
                )
            )
            placed += rows
        merged = TokenRollout.concatenate(parts) if len(parts) > 1 else parts[0]
        order = torch.empty(len(placed), dtype=torch.long)
        order[torch.tensor(placed)] = torch.arange(len(placed))
        batch = merged.select(order.to(merged.group_ids.device))
        scores = {}
        for name, values in fresh_scores.items():
            full = torch.full((len(global_prompts),), float("nan"))
            full[fresh_rows] = values
            for row, completion in replaced.items():
                full[row] = completion.scores.get(name, float("nan"))
            scores[name] = full
        t_scored = time.perf_counter()

        # 4. Advantages over the mixed groups.
        advantages = collector.advantages(batch, scores, global_prompts, group_ids)

        # The store learns from the groups; the delayed start may end.
        correct = self.success(scores, reward.name)
        for g, prompt in enumerate(prompts):
            group = range(g * size, (g + 1) * size)
            candidates = [
                completion_of(batch, row, scores, row, iteration)
                if bool(correct[row]) and row not in replaced
                else None
                for row in group
            ]
            store.update(prompt, [bool(correct[row]) for row in group], candidates)
        accuracy = float(correct.float().mean())
        start = r.start_accuracy
        if not store.active and start is not None and accuracy > start:
            store.active = True
        extra = {f"reward_update/{k}": v for k, v in reward_metrics.items()}
        extra.update(store.stats())
        extra.update({
            "replay/replayed": float(len(chosen)),
            "replay/reused": float(len(reused)),
            "replay/generated": float(len(fresh_rows)),
            "replay/fresh_accuracy": float(fresh_correct.float().mean()),
        })  # fmt: skip
        return CollectedBatch(
            rollout=batch,
            noise=drawn.noise,
            scores=scores,
            group_ids=group_ids,
            advantages=advantages,
            timings={"rollout_s": t_sampled - t_start, "reward_s": t_scored - t_sampled},
            extra_metrics=extra,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.store.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.store.load_state_dict(state)


__all__ = ["ReplayRound", "completion_of", "stored_rows"]
