"""The GRPO recipe: the parts of a run composed in order (torchtune's recipe shape).

Heavy module (torch, transformers, accelerate): imported lazily by
:mod:`vfops.training`.

One step: take the batch generated for this step (rollouts from the
environment's own ``run_group`` machinery through a generation backend), turn
each rollout into token sequences with masks and behaviour log-probabilities,
compute group-relative advantages, accumulate the clipped policy-gradient loss
over micro-batches, take one optimizer step, and sync the new weights to the
generation backend. With ``async_steps = k`` the batches of the next k steps are
already being generated while this one trains: batch ``j`` by exactly the weights
of step ``max(0, j - k)``; a checkpoint keeps the batches generated ahead, so a
resumed run continues exactly.

Off-policy data is corrected, bounded and measured: the loss weights each token by
its truncated importance ratio between the trainer's and the sampler's log-probs
(``loss.importance_correction``), each step logs that mismatch (``mismatch_*``),
and ``generation.max_staleness`` drops and regenerates a batch whose weights are
too old (``stale_batches_dropped``).

Generation runs on an asyncio event loop in a background thread, so it proceeds
while the main thread trains; the sync API (``train_step`` etc.) submits to it.

The parts, each its own module configured by its ``GRPOConfig`` section:

- :mod:`~vfops.training._setup`: accelerate/DeepSpeed, the model (LoRA, reference
  model), the optimizer and schedule, the generation backend;
- :mod:`~vfops.training._generation`: generation scheduling (batches in flight, their
  policy versions, staleness, data order) on the loop of :mod:`~vfops.training._loop`;
- :mod:`~vfops.training._batch`: rollouts to samples with advantages;
- :mod:`~vfops.training._optimizer_step`: the micro-batched loss and the optimizer step;
- :mod:`~vfops.training._heldout`: held-out eval;
- :mod:`~vfops.training._checkpoint`: save, resume, export, register.

:meth:`GRPORecipe._to_batch` and :meth:`GRPORecipe._optimize` are the recipe's seams
between generation and training: what a step trains on, and how (tests wrap them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfops._types import SamplingArgs
from vfops.envs import Environment, Example
from vfops.training._backend import GenerationBackend
from vfops.training._batch import Batch, Groups, to_batch
from vfops.training._checkpoint import (
    MODEL_SUBDIR,
    Checkpointer,
    TrainerState,
    read_mlflow_run_id,
    read_step,
)
from vfops.training._checkpoint import register as register_model
from vfops.training._config import GRPOConfig
from vfops.training._generation import DataShard, GenerationScheduler, Rollouts
from vfops.training._heldout import HeldOut, HeldOutEval, write_heldout_rows
from vfops.training._loop import GenerationLoop
from vfops.training._optimizer_step import OptimizerStep, step_metrics
from vfops.training._progress import Progress
from vfops.training._setup import (
    Policy,
    attention,
    build_accelerator,
    build_backend,
    load_model,
    load_train_examples,
    prepare_policy,
    seed_everything,
)
from vfops.training._tracking import TrainingTracker
from vfops.training._weights import unwrap


@dataclass(slots=True)
class _Tracking:
    """The MLflow run :attr:`GRPORecipe.tracker` opens at first use."""

    base_model: str
    env_versions: dict[str, str]
    resolved: dict[str, str]
    continue_run: str | None = None
    """The run of the checkpoint resumed from (:meth:`GRPORecipe.resume`)."""


@dataclass(frozen=True, slots=True)
class _Parts:
    """What :meth:`GRPORecipe.setup` builds besides the model and the loop."""

    generation: GenerationScheduler
    trainer: OptimizerStep
    checkpoints: Checkpointer


class GRPORecipe:
    """GRPO on accelerate; see the module docstring.

    Build from a :class:`GRPOConfig` (``load_config(path)`` or in Python). Pass
    ``environment`` or ``backend`` to override what the config would build (tests,
    benchmarks). Call :meth:`setup` once, then :meth:`train_step` repeatedly (or
    :meth:`train` for the whole run), :meth:`save`/:meth:`resume` for checkpoints,
    and :meth:`close` at the end.
    """

    def __init__(
        self,
        config: GRPOConfig,
        *,
        environment: Environment | None = None,
        backend: GenerationBackend | None = None,
    ) -> None:
        self.config = config.validate()
        self.env: Environment | None = environment
        self.backend: GenerationBackend | None = backend
        self.step = 0
        """Optimizer steps taken (= the policy version of the current weights)."""
        self.accelerator: Any = None
        self.tokenizer: Any = None
        self._tracker: TrainingTracker | None = None
        self._tracking: _Tracking | None = None
        self._policy: Policy | None = None
        self._loop: GenerationLoop | None = None
        self._parts: _Parts | None = None
        self._heldout = HeldOutEval(self.config.run, self.config.generation)
        self._weights_loaded = False
        """Whether the backend generates from this recipe's weights (see :meth:`_load_weights`)."""

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Load the model, environment, backend and optimizer; start the generation loop."""
        cfg = self.config
        seed_everything(cfg.run.seed)
        self.accelerator, micro_batches = build_accelerator(cfg)
        attn = attention(cfg, self.accelerator)
        model, self.tokenizer, ref_model = load_model(cfg, self.accelerator, attn)
        if self.env is None:
            from vfops.envs import load_environment

            self.env = load_environment(cfg.environment.id, **cfg.environment.args)
        examples = load_train_examples(self.env)
        self._policy = policy = prepare_policy(
            cfg,
            self.accelerator,
            model,
            tokenizer=self.tokenizer,
            ref_model=ref_model,
            micro_batches=micro_batches,
            attn_implementation=attn,
        )
        self._loop = loop = GenerationLoop(cfg.generation.max_concurrent)
        if self.backend is None:
            self.backend = build_backend(cfg, unwrap(policy.model), self.tokenizer, loop)
        # the backend is given this run's weights before it first generates
        # (_load_weights; resume() gives it the restored ones)
        generation = GenerationScheduler(
            cfg.generation,
            seed=cfg.run.seed,
            loop=loop,
            rollouts=self._rollouts(),
            data=DataShard(
                examples, self.accelerator.num_processes, self.accelerator.process_index
            ),
            # looked up per batch: _to_batch is a seam (tests wrap it after setup)
            to_batch=lambda index, groups, seconds: self._to_batch(index, groups, seconds),
        )
        trainer = OptimizerStep(policy, loss=cfg.loss, optim=cfg.optim, generation=cfg.generation)
        self._parts = _Parts(generation, trainer, Checkpointer(policy))
        if cfg.run.tracking and self.accelerator.is_main_process:
            # opened at first use (:attr:`tracker`): a resume continues its checkpoint's run
            self._tracking = _Tracking(
                base_model=self.base_model_name,
                env_versions=self.env_versions,
                resolved={"attn_implementation": attn},
            )

    def _rollouts(self) -> Rollouts:
        assert self.env is not None and self.backend is not None and self._loop is not None
        return Rollouts(self.env, self.backend, self.base_model_name, self._loop.limiter)

    # ------------------------------------------------------------------ properties

    @property
    def tracker(self) -> TrainingTracker | None:
        """The run's MLflow run (tracking on, main process; None otherwise). Opened at
        first use after :meth:`setup`: a new run, or, after :meth:`resume`, the run the
        checkpoint was trained in, continued (its step numbers go on)."""
        if self._tracker is None and self._tracking is not None:
            plan, self._tracking = self._tracking, None
            self._tracker = TrainingTracker.start(
                self.config,
                base_model=plan.base_model,
                env_versions=plan.env_versions,
                resolved=plan.resolved,
                continue_run=plan.continue_run,
            )
        return self._tracker

    @property
    def model(self) -> Any:
        """The trained model as accelerate wraps it (None before :meth:`setup`)."""
        return self._policy.model if self._policy is not None else None

    @property
    def base_model_name(self) -> str:
        return self.config.model.name or Path(self.config.model.path).name

    @property
    def env_versions(self) -> dict[str, str]:
        from vfops.envs import environment_version

        env_id = self.config.environment.id
        return {env_id: environment_version(env_id) or "unknown"} if env_id else {}

    @property
    def policy_model(self) -> Any:
        """The trained module without accelerate/DeepSpeed wrappers."""
        return unwrap(self.model)

    @property
    def stale_batches_dropped(self) -> int:
        """Batches dropped over the run for exceeding ``generation.max_staleness``."""
        return self._parts.generation.stale_batches_dropped if self._parts is not None else 0

    @property
    def _pending(self) -> dict[int, Any]:
        """The batches in flight by step (futures), generated ahead or being generated."""
        return self._parts.generation.pending if self._parts is not None else {}

    def _set_up(self) -> _Parts:
        if self._parts is None:
            raise RuntimeError("call setup() first")
        return self._parts

    # ------------------------------------------------------------------ train step

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns its metrics (also logged to MLflow when tracking)."""
        parts = self._set_up()
        self._load_weights()
        started = time.perf_counter()
        parts.generation.schedule(self.step)
        wait_started = time.perf_counter()
        batch, dropped = parts.generation.next_batch(self.step)
        wait_s = time.perf_counter() - wait_started
        train_started = time.perf_counter()
        stats = self._optimize(batch)
        train_s = time.perf_counter() - train_started
        self.step += 1
        parts.generation.finish_on_current_weights(self.step)
        sync_s = self._run(self._async_sync(self.step))
        prefix_breaks = int(getattr(self.backend, "prefix_breaks", 0))
        metrics = step_metrics(batch, stats, lr=parts.trainer.lr, prefix_breaks=prefix_breaks)
        metrics.update(
            generation_s=batch.generation_s,
            generation_wait_s=wait_s,
            training_s=train_s,
            weight_sync_s=sync_s,
            step_s=time.perf_counter() - started,
            completion_tokens=float(batch.generated_tokens),
            # end to end: sampled tokens per second of the whole step
            tokens_per_s=batch.generated_tokens / max(time.perf_counter() - started, 1e-9),
            training_tokens_per_s=stats["tokens_total"] / max(train_s, 1e-9),
            generation_tokens_per_s=batch.generated_tokens / max(batch.generation_s, 1e-9),
            policy_lag=float(self.step - 1 - batch.min_policy_version),
            stale_batches_dropped=float(dropped),
            stale_batches_dropped_total=float(self.stale_batches_dropped),
        )
        if self.tracker is not None:
            self.tracker.log_step(self.step, metrics)
        return metrics

    def _to_batch(self, index: int, groups: Groups, generation_s: float) -> Batch:
        """The seam from generation to training: step ``index``'s groups as its batch."""
        return to_batch(index, groups, generation_s, self.config.loss)

    def _optimize(self, batch: Batch) -> dict[str, float]:
        """The seam into the optimiser step: one step on ``batch``; the step's sums."""
        return self._set_up().trainer.run(batch)

    def _sampling_args(self, index: int, position: int) -> SamplingArgs:
        return self._set_up().generation.sampling_args(index, position)

    def step_examples(self, index: int) -> list[Example]:
        """The prompts step ``index`` trains on (this rank's share): a seeded permutation
        per epoch, sharded by rank, so a run and its resume see the same data order."""
        return self._set_up().generation.step_examples(index)

    # ------------------------------------------------------------------ eval

    def evaluate(self, n: int | None = None) -> dict[str, float]:
        """Mean reward of the current weights on the first ``n`` held-out (eval split) examples."""
        return self._evaluate_rows(n).metrics

    def _evaluate_rows(self, n: int | None = None) -> HeldOut:
        self._load_weights()
        result: HeldOut = self._run(self._heldout.evaluate(self._rollouts(), n))
        return result

    # ------------------------------------------------------------------ the whole run

    def train(self, progress: Progress | None = None) -> dict[str, Any]:
        """Baseline eval, ``run.steps`` steps (periodic eval/save), final eval, save, register.

        ``progress(kind, step, metrics)`` is called after every eval (``"eval"``) and
        every step (``"step"``), e.g. to print a line per step.
        """
        cfg = self.config.run
        report = progress or _no_progress
        first = self._eval_and_report(report)
        baseline = first.metrics["eval_reward"]
        history: list[dict[str, float]] = []
        while self.step < cfg.steps:
            history.append(self.train_step())
            report("step", self.step, history[-1])
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self._eval_and_report(report)
            if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
                self.save(Path(cfg.output_dir) / f"step-{self.step}")
        last = self._eval_and_report(report)
        final = last.metrics["eval_reward"]
        paired = self._paired(first, last)
        final_dir = self.save(Path(cfg.output_dir) / "final")
        registered = None
        if cfg.register_as and self.accelerator.is_main_process:
            registered = self.register(final_dir / MODEL_SUBDIR, cfg.register_as)
        return {
            "baseline_eval_reward": baseline,
            "final_eval_reward": final,
            "steps": self.step,
            "processes": self.accelerator.num_processes,
            "checkpoint": str(final_dir),
            "registered": registered,
            "heldout_paired": paired,
            "history": history,
        }

    def _eval_and_report(self, report: Progress) -> HeldOut:
        """A held-out eval, its rows written to ``heldout/step-N.jsonl`` in the output
        folder (and the MLflow run): a paired test of two of them needs them row by row."""
        heldout = self._evaluate_rows()
        reward = heldout.metrics["eval_reward"]
        if self.accelerator.is_main_process:
            rows = write_heldout_rows(Path(self.config.run.output_dir), self.step, heldout.rows)
            if self.tracker is not None:
                self.tracker.log_artifact(rows, "heldout")
        if self.tracker is not None:
            self.tracker.log_step(self.step, {"eval_reward": reward})
        report("eval", self.step, {"eval_reward": reward})
        return heldout

    def _paired(self, first: HeldOut, last: HeldOut) -> dict[str, float] | None:
        """The final held-out eval against the baseline, example by example (a paired
        bootstrap: :func:`vfops.stats.paired_bootstrap`); None without examples or steps."""
        if not first.rows or not last.rows:
            return None
        from vfops.stats import paired_bootstrap

        result = paired_bootstrap(first.rewards(), last.rewards(), seed=self.config.run.seed)
        paired = {
            "heldout_delta": result.delta,
            "heldout_delta_ci_low": result.ci_low,
            "heldout_delta_ci_high": result.ci_high,
            "heldout_p_better": result.p_better,
            "heldout_paired_examples": float(result.n_examples),
        }
        if self.tracker is not None:
            self.tracker.log_step(self.step, paired)
        return paired

    def register(self, model_dir: Path, name: str) -> str:
        """Register an exported model folder in MLflow; returns ``models:/name/version``."""
        uri = register_model(model_dir, name, self._trainer_state())
        if self.tracker is not None:
            self.tracker.set_tag("vfops.registered_model", uri)
        return uri

    # ------------------------------------------------------------------ checkpoints

    def _trainer_state(self) -> TrainerState:
        return TrainerState(
            step=self.step,
            config=self.config,
            base_model=self.base_model_name,
            environment_versions=self.env_versions,
            mlflow_run_id=self.tracker.run_id if self.tracker is not None else None,
        )

    def save(self, directory: str | Path) -> Path:
        """Write a resumable checkpoint (model, optimizer, scheduler, RNG, data position,
        step) plus an exported Hugging Face model folder under ``directory/model``: written
        beside ``directory``, sealed with a manifest, then renamed into place (one there
        already is replaced whole)."""
        parts = self._set_up()
        generation = parts.generation
        return parts.checkpoints.save(
            directory,
            self._trainer_state(),
            ahead=lambda path: generation.save_ahead(path, self.step),
        )

    def resume(self, directory: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` (after :meth:`setup`); a torn or
        damaged one (its manifest missing or not matching) is refused in one line."""
        parts = self._set_up()
        src = Path(directory)
        step = read_step(src)
        if self._tracking is not None:  # its MLflow run continues, wherever it now writes
            self._tracking.continue_run = read_mlflow_run_id(src)
        parts.generation.drop_pending()
        parts.checkpoints.load(src)
        self.step = step
        self._run(self._async_sync(self.step))
        parts.generation.load_ahead(parts.checkpoints.pending_file(src))

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        """Stop generation, close the backend and environment, end the MLflow run."""
        if self._parts is not None:
            self._parts.generation.drop_pending()
        if self._loop is not None:
            backend, env = self.backend, self.env
            self._loop.close(
                *([backend.aclose] if backend is not None else []),
                *([env.aclose] if env is not None else []),
            )
            self._loop = None
        self._tracking = None  # never opened: nothing to end
        if self._tracker is not None:
            self._tracker.finish()
            self._tracker = None

    def __enter__(self) -> GRPORecipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _load_weights(self) -> None:
        """Before the backend first generates: load this run's current weights into it.
        A vLLM server keeps whatever it loaded last (the previous seed's trained policy,
        another run's), and its samples would then be off-policy from the first step on
        and the baseline eval another model's; found by ``bench/real_model_vllm.py``,
        whose second seed started from the first seed's weights. Once per recipe (the
        steps sync after each update); for the in-process backend, one copy."""
        if not self._weights_loaded:
            self._run(self._async_sync(self.step))

    async def _async_sync(self, version: int) -> float:
        assert self.backend is not None
        seconds = await self.backend.sync_weights(unwrap(self.model), version)
        self._weights_loaded = True
        return seconds

    def _run(self, coro: Any) -> Any:
        """Run ``coro`` on the generation loop; wait for its result here."""
        assert self._loop is not None, "call setup() first"
        return self._loop.run(coro)


def _no_progress(kind: str, step: int, metrics: dict[str, float]) -> None:
    return None
