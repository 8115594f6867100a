"""The one training loop. It knows phases, not algorithms (docs/architecture.md, section 2):

1. prompts  2. rollout  3. rewards  4. advantages (``genrl/loop/collection.py``)  5. update
6. bookkeeping

Everything random comes from named streams of ``(seed, iteration, round)`` (``genrl/data/rng.py``):
a resumed run reproduces an uninterrupted one exactly, and a flow run on N processes draws the
same prompts, noise, rewards and advantages as a one-process run with the default
``train.noise_layout=global`` (its minibatches differ, as each process shuffles its own share;
token sampling draws on each process's own stream, so token runs differ across process counts).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch

from genrl.allocation.base import AllocationError
from genrl.checkpoints import checkpoint as ckpt
from genrl.checkpoints import run_dir as rundir
from genrl.checkpoints.resume_layout import layout_notice, restore_weights
from genrl.distributed.deepspeed import refuse_checkpoint, zero3_gathered
from genrl.distributed.launch import build_accelerator
from genrl.distributed.sharding import gathered, is_sharded, save_shards
from genrl.loop.bookkeeping import echo, eval_metrics, eval_record, progress, score_metrics
from genrl.loop.collection import BatchCollector, CollectedBatch
from genrl.loop.interrupt import StopRequest
from genrl.loop.optimization import Updater
from genrl.loop.run_plan import measured, plan_run, summary_line
from genrl.reporting.evaluation import EvalResult, evaluate, without_ddp_wrapper
from genrl.reporting.metrics import console_line, open_writer
from genrl.run.build import build_run
from genrl.run.config import TrainConfig


class Trainer:
    """Builds policy, rewards, algorithm and optimizer from a ``TrainConfig`` and trains.

    Args:
        config: the run's configuration (validated here).
        run_dir: where outputs go; default ``config.output_dir`` or ``runs/<recipe>-<time>``.
            A fresh run (no ``resume_from``) refuses a directory that holds another run
            (``genrl/checkpoints/run_dir.py``) when ``train()`` starts.
        resume_from: a run directory or checkpoint directory to continue from.
        accelerator: an ``accelerate.Accelerator``; one is created when None
            (``build_accelerator``).
        overwrite: let a fresh run delete another run's files from ``run_dir`` (files a run
            does not write are kept).
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path | None = None,
        resume_from: str | Path | None = None,
        accelerator: Any = None,
        overwrite: bool = False,
    ) -> None:
        if overwrite and resume_from:
            raise ValueError("overwrite=True starts a run afresh; it cannot resume one")
        accelerator = accelerator or build_accelerator(config.train.mixed_precision)
        config.validate(accelerator.num_processes)
        self.run_dir = rundir.resolve_run_dir(config, run_dir)
        self.overwrite = overwrite
        self._started = False  # a later train() call continues this run in memory

        # Resolve and verify the checkpoint first so that a bad --resume fails before any heavy
        # work (a run directory falls back to its newest intact checkpoint); a run of another
        # recipe fails here too, not once the models are built.
        self._resume_path = ckpt.resolve_checkpoint(resume_from) if resume_from else None
        if self._resume_path is not None:
            rundir.refuse_other_run(config, self._resume_path, rundir.RESUME_KEYS)

        # Every component, in build_run's order (genrl/run/build.py).
        run = build_run(config, accelerator)
        self.run = run
        self.config, self.accelerator = run.config, run.accelerator
        self.prompts, self.policy, self.reward = run.prompts, run.policy, run.reward
        self.algorithm, self.rollout, self.objective = run.algorithm, run.rollout, run.objective
        self.local = run.local
        self.num_global = config.train.prompts_per_iteration * config.train.group_size
        self.collector = BatchCollector(
            config,
            self.accelerator,
            self.policy,
            self.rollout,
            self.objective,
            self.reward,
            self.prompts,
            self.local,
        )
        units = self.objective.num_units(self.local.stop - self.local.start)
        self.updater = Updater(config, self.policy, self.accelerator, run.optimizer, units)

        self.iteration = 0
        self.eval_history: dict[str, Any] = {}
        self.wall_seconds_before = 0.0
        # Every sample drawn so far (pilots, profiles and refills included; replayed ones not):
        # the rollout budget the allocation and replay methods are compared at.
        self.samples_generated = 0
        self.stop = StopRequest()
        # The planner's row for this run (genrl/loop/run_plan.py), made when train() starts.
        self.plan_record: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.updater.optimizer

    @property
    def ema(self) -> Any:
        return self.updater.ema

    @property
    def optimizer_steps(self) -> int:
        return self.updater.steps

    def collect(self) -> CollectedBatch:
        """Phases 1-4 of the current iteration (``genrl/loop/collection.py``)."""
        return self.collector.collect(self.iteration)

    def train_iteration(self) -> dict[str, float]:
        """One iteration of the six phases; returns its metrics."""
        t_start = time.perf_counter()
        batch = self.collect()

        # 5. Update: training units (with any scoring they compare against, before the first
        # update and with the rollout's numerics), then the optimizer steps.
        t_update = time.perf_counter()
        self.policy.module.eval()
        with torch.no_grad(), self.accelerator.autocast():
            trained = batch.rollout.without_excluded()  # e.g. MC-GRPO's median pivots
            units = self.objective.units(self.policy, trained, batch.noise)
        self.policy.module.train()
        update_metrics = self.updater.update(self.objective, units, batch.noise)
        # An inference engine holds its own copy of the weights: it gets the new ones once per
        # iteration, after the last optimizer step, since only the next rollout reads them.
        # With train.max_staleness the sampling thread syncs it to the version it samples from.
        stale = self.collector.stale
        if stale is None:
            sync_s = self.rollout.sync_weights(self.policy)
        else:
            sync_s = None
            stale.record(self.iteration + 1)

        # 6. Bookkeeping.
        rewards = batch.scores[self.reward.name]
        metrics = score_metrics(batch.scores, rewards, batch.group_ids)
        metrics.update(self.objective.advantage_metrics(batch.advantages))
        metrics.update(update_metrics)
        metrics.update(batch.extra_metrics)
        metrics.update({f"time/{k}": v for k, v in batch.timings.items()})
        metrics["time/update_s"] = time.perf_counter() - t_update
        if sync_s is not None:
            metrics["time/weight_sync"] = sync_s
        metrics["time/iteration_s"] = time.perf_counter() - t_start
        metrics["time/samples_per_s"] = len(rewards) / max(batch.timings["rollout_s"], 1e-9)
        drawn = metrics.get("allocation/samples_generated", metrics.get("replay/generated"))
        self.samples_generated += int(len(rewards) if drawn is None else drawn)
        self.iteration += 1
        return metrics

    # ------------------------------------------------------------------------------------------
    def evaluate(self) -> EvalResult:
        """Held-out reward of the current (or EMA) weights: the chunks are shared out over the
        processes and every process gets the whole result."""
        cfg = self.config
        self.policy.module.eval()
        context = self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()
        prompts, per_prompt = self.prompts.eval, cfg.eval.samples_per_prompt
        outputs_fn = self.rollout.evaluation_outputs(
            self.policy, prompts, per_prompt, cfg.eval.seed
        )
        with context, without_ddp_wrapper(self.policy):
            return evaluate(
                self.reward,
                prompts,
                samples_per_prompt=per_prompt,
                outputs_fn=outputs_fn,
                batch_size=cfg.eval.batch_size,
                accelerator=self.accelerator,
            )

    def export(self, directory: Path) -> Path | None:
        """Save the trained weights in the model ecosystem's own format (e.g. diffusers LoRA
        weights) on the main process; the EMA weights when the run keeps an EMA, since those
        are what the held-out evaluation scores."""
        with zero3_gathered(self.policy.network, self.accelerator):  # a collective under ZeRO-3
            path = self._export(directory)
        self.accelerator.wait_for_everyone()
        return path

    def _export(self, directory: Path) -> Path | None:
        path = None
        if is_sharded(self.policy.network):
            # Every process gathers the full weights (a collective); the main one writes them.
            context = self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()
            with context, gathered(self.policy.network, self.is_main):
                if self.is_main:
                    path = self.policy.export(directory)
        elif self.is_main:
            context = self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()
            with context:
                path = self.policy.export(directory)
        return path

    def state(self) -> dict[str, Any]:
        allocation = self.collector.allocation
        return {
            "optimizer_steps": self.optimizer_steps,
            "rollout": self.rollout.state_dict(),
            "objective": self.objective.state_dict(),
            "reward": self.reward.state_dict(),
            "eval_history": self.eval_history,
            "wall_seconds": self.wall_seconds_before,
            "samples_generated": self.samples_generated,
            # A resume on another count says so (genrl/checkpoints/resume_layout.py).
            "num_processes": self.accelerator.num_processes,
            # train.max_staleness: the older weights later iterations still sample from.
            "stale_versions": self.collector.stale.state_dict() if self.collector.stale else {},
            # replay.*: the store of earlier completions (genrl/loop/replay.py).
            "replay": self.collector.replay.state_dict() if self.collector.replay else {},
            # allocation.name: the policy's buffer (Pilot-Commit) or profile (sGPO).
            "allocation": allocation.state_dict() if allocation is not None else {},
        }

    def save_checkpoint(self, wall_seconds: float = 0.0) -> Path | None:
        self.wall_seconds_before = wall_seconds
        refused = refuse_checkpoint(self.accelerator, "write a checkpoint")
        if refused:  # genrl/distributed/deepspeed.py
            if self.is_main:
                print(f"genrl: warning: {refused}; none written", file=sys.stderr, flush=True)
            return None
        if is_sharded(self.policy.network):
            return self._save_sharded()
        path = None
        if self.is_main:
            path = ckpt.save_checkpoint(
                self.run_dir,
                self.iteration,
                trainable=self.policy.trainable_state_dict(),
                optimizer=self.optimizer.state_dict(),
                state=self.state(),
                ema=self.ema.state_dict() if self.ema is not None else None,
                keep=self.config.logging.keep_checkpoints,
            )
        self.accelerator.wait_for_everyone()
        return path

    def _save_sharded(self) -> Path | None:
        """FSDP2: every process writes its shard of the weights and optimizer state into the
        staging directory; the main process adds the rest, checksums everything and renames
        the directory into place (``genrl/checkpoints/checkpoint.py``)."""
        if self.ema is not None:
            raise ckpt.CheckpointError("EMA weights cannot be checkpointed under FSDP")
        if self.is_main:
            ckpt.begin_staging(self.run_dir, self.iteration)
        self.accelerator.wait_for_everyone()
        save_shards(
            self.policy.network, self.optimizer, ckpt.staging_dir(self.run_dir, self.iteration)
        )
        self.accelerator.wait_for_everyone()
        path = None
        if self.is_main:
            path = ckpt.save_checkpoint(
                self.run_dir,
                self.iteration,
                trainable=None,
                optimizer=None,
                state=self.state(),
                keep=self.config.logging.keep_checkpoints,
                staged=True,
            )
        self.accelerator.wait_for_everyone()
        return path

    def load_checkpoint(self, path: Path, verified: bool = False) -> None:
        """Restore everything from the checkpoint directory ``path``; its files are checked
        against the checksums recorded at save unless ``verified`` (``resolve_checkpoint``
        just did)."""
        refused = refuse_checkpoint(self.accelerator, "resume")
        if refused:
            raise ckpt.CheckpointError(refused)
        data = ckpt.load_checkpoint(path, verified=verified)
        # Another process count or sharded -> whole where DCP reshards (genrl/checkpoints/resume_layout.py).
        restore_weights(self.policy, self.optimizer, data, path)
        notice = layout_notice(data["state"], self.accelerator.num_processes, "sharded" in data)
        if notice and self.is_main:
            print(notice, flush=True)
        if self.ema is not None:
            if "ema" not in data:
                raise ckpt.CheckpointError(f"{path} has no EMA weights but optim.ema_decay is set")
            self.ema.load_state_dict(data["ema"])
        state = data["state"]
        self.iteration = int(state["iteration"])
        self.updater.steps = int(state["optimizer_steps"])
        self.rollout.load_state_dict(state["rollout"])
        self.objective.load_state_dict(state["objective"])
        self.reward.load_state_dict(state["reward"])
        self.eval_history = dict(state.get("eval_history", {}))
        self.samples_generated = int(state.get("samples_generated", 0))
        self.wall_seconds_before = float(state.get("wall_seconds", 0.0))
        if self.collector.stale is not None:
            self.collector.stale.load_state_dict(state.get("stale_versions", {}), self.iteration)
        if self.collector.replay is not None:
            self.collector.replay.load_state_dict(state.get("replay", {}))
        if self.collector.allocation is not None:
            self.collector.allocation.load_state_dict(state.get("allocation", {}))
        ckpt.restore_rng(state)

    def _claim_run_dir(self) -> None:
        """A fresh run starts in a directory that holds no other run (``genrl/checkpoints/run_dir.py``)."""
        if not self.overwrite:
            rundir.refuse_existing_run(self.run_dir)
        elif self.is_main:
            removed = rundir.clear_run(self.run_dir)
            if removed:
                print(
                    f"genrl: overwrite: deleted {', '.join(removed)} from {self.run_dir}",
                    flush=True,
                )
        # Every process looks (and the main one clears) before the main one writes anything.
        self.accelerator.wait_for_everyone()

    # ------------------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, Any]:
        """Run (or continue) training; returns the summary written to ``summary.json``.

        Args:
            stop_after: stop once this many iterations are done in total (for tests and for
                splitting a run); the run stays resumable.
        """
        from genrl.reporting.report import RunReport

        cfg = self.config
        resumed = self._resume_path is not None
        if self._resume_path is not None:
            self.load_checkpoint(self._resume_path, verified=True)
            self._resume_path = None  # a later train() call continues in memory
            if self.is_main:
                for path in ckpt.set_aside_newer(self.run_dir, self.iteration):
                    print(f"genrl: moved later checkpoint {path.name} to {path.parent}", flush=True)
            self.accelerator.wait_for_everyone()
        elif not self._started:
            self._claim_run_dir()
        self._started = True
        report = RunReport(self, self.run_dir) if self.is_main else None
        if report is not None:
            report.start(resumed=resumed)
            if cfg.logging.plan != "off":
                self.plan_record = plan_run(cfg, self.accelerator, self.run_dir)
                if self.plan_record["made"] or self.accelerator.device.type == "cuda":
                    echo(None, summary_line(self.plan_record))
        started = time.perf_counter() - self.wall_seconds_before
        writer = (
            open_writer(cfg, self.run_dir, resume_iteration=self.iteration if resumed else None)
            if self.is_main
            else None
        )

        added = self.collector.fill_offline_store()
        if added and self.is_main:
            echo(None, f"genrl: sampled {added} groups into {cfg.train.offline_store}")

        if "before" not in self.eval_history:
            before = self.evaluate()
            self.eval_history["before"] = eval_record(before)
            if report is not None and writer is not None:
                title = f"before training: {report.evaluated(self.reward.name)} "
                title += f"{before.reward:.3f}"
                report.samples(before, "samples_before", writer, title=title)
                report.evaluation(before, self.iteration, writer)
                writer.write(0, eval_metrics(before))

        end = cfg.train.iterations if stop_after is None else min(stop_after, cfg.train.iterations)
        bar = progress(
            self.iteration, cfg.train.iterations, cfg.logging.progress_bar and self.is_main
        )
        interrupted = False
        try:
            with self.stop.handle_sigint(lambda line: echo(bar, line)):
                while self.iteration < end:
                    metrics = self.train_iteration()
                    every = cfg.eval.every
                    if every and self.iteration % every == 0 and self.iteration < end:
                        result = self.evaluate()
                        metrics.update(eval_metrics(result))
                        if report is not None:  # its samples: report.html and the trackers
                            report.evaluation(result, self.iteration, writer)
                    if writer is not None:
                        writer.write(self.iteration, metrics)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{metrics[self.reward.name + '/mean']:.3f}")
                    if self.is_main and self.iteration % cfg.logging.log_every == 0:
                        echo(bar, console_line(self.iteration, cfg.train.iterations, metrics))
                    if self.stop.agreed(self.accelerator):
                        interrupted = True
                        break
                    ce = cfg.logging.checkpoint_every
                    if ce and self.iteration % ce == 0 and self.iteration < end:
                        self.save_checkpoint(time.perf_counter() - started)
        except AllocationError as err:
            # Keep the finished iterations: the run resumes with a higher cap.
            self.save_checkpoint(time.perf_counter() - started)
            raise type(err)(
                f"{err} Finished iterations are saved; resume with --resume {self.run_dir}"
            ) from None
        finally:
            if bar is not None:
                bar.close()
            if self.collector.stale is not None:  # a round sampled ahead is sampled again
                self.collector.stale.discard()
        wall = time.perf_counter() - started
        self.save_checkpoint(wall)
        if interrupted:
            echo(
                None, f"stopped at iteration {self.iteration}; resume with --resume {self.run_dir}"
            )
        summary: dict[str, Any] = {}
        if self.iteration >= cfg.train.iterations and not interrupted:
            self.export(self.run_dir / "export")
            after = self.evaluate()
            self.eval_history["after"] = eval_record(after)
            if writer is not None:
                writer.write(self.iteration, eval_metrics(after))
            if report is not None:
                plan = (
                    None
                    if self.plan_record is None
                    else measured(self.plan_record, self.accelerator.device)
                )
                summary = report.finish(after, wall, writer, plan)
        if writer is not None:
            writer.close()
        if interrupted:
            raise KeyboardInterrupt
        return summary


__all__ = ["CollectedBatch", "Trainer"]
