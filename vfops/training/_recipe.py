"""The GRPO recipe: setup, train step, save/resume, cleanup.

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import queue
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vfops._errors import VfopsError
from vfops._types import SamplingArgs, State
from vfops.envs import Environment
from vfops.envs._dataset import Example, iter_examples
from vfops.rubrics import RolloutScore
from vfops.training._backend import TOKENS_KEY, GenerationBackend, TurnTokens
from vfops.training._config import GRPOConfig
from vfops.training._loss import LossNorm, group_advantages, policy_loss, token_logprobs
from vfops.training._run import Progress
from vfops.training._tokens import Sequence, rollout_sequences
from vfops.training._tracking import TrainingTracker
from vfops.training._weights import unwrap

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
PENDING_PREFIX = "pending_batches_rank"
MODEL_SUBDIR = "model"
ACCELERATE_SUBDIR = "accelerate"


@dataclass(slots=True)
class _Sample:
    sequence: Sequence
    advantage: float


@dataclass(slots=True)
class _Batch:
    """One step's rollouts, ready to train on."""

    index: int
    samples: list[_Sample]
    rewards: list[float]
    generation_s: float
    generated_tokens: int
    truncated: int
    rollouts: int
    min_policy_version: int


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
        self.model: Any = None
        self.tokenizer: Any = None
        self.accelerator: Any = None
        self.tracker: TrainingTracker | None = None
        self._ref_model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._examples: list[Example] = []
        self._pending: dict[int, concurrent.futures.Future[_Batch]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._limiter: asyncio.Semaphore | None = None
        self._n_micro = 1
        self._main_compute: MainThreadCompute | None = None
        self.stale_batches_dropped = 0
        """Batches dropped over the run for exceeding ``generation.max_staleness``."""

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Load the model, environment, backend and optimizer; start the generation loop."""
        _seed_everything(self.config.run.seed)
        self._setup_accelerator()
        self._setup_model()
        self._setup_environment()
        self._setup_optimizer()
        self._start_loop()
        self._setup_backend()
        if self.config.run.tracking and self.accelerator.is_main_process:
            self.tracker = TrainingTracker.start(
                self.config, base_model=self.base_model_name, env_versions=self.env_versions
            )

    def _setup_accelerator(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin

        cfg = self.config
        total = cfg.generation.prompts_per_step * cfg.generation.group_size
        self._n_micro = max(1, math.ceil(total / cfg.optim.micro_batch_size))
        plugin = None
        if cfg.run.deepspeed:
            if not Path(cfg.run.deepspeed).is_file():
                raise VfopsError(
                    f"[run] deepspeed = {cfg.run.deepspeed!r} does not exist; point it at a "
                    "DeepSpeed JSON such as configs/deepspeed/zero2.json"
                )
            plugin = DeepSpeedPlugin(
                hf_ds_config=cfg.run.deepspeed, gradient_accumulation_steps=self._n_micro
            )
            ds = plugin.deepspeed_config
            if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
                ds["train_micro_batch_size_per_gpu"] = cfg.optim.micro_batch_size
            if ds.get("train_batch_size", "auto") == "auto":
                # DeepSpeed checks micro x accumulation x world; the launcher sets WORLD_SIZE
                world = int(os.environ.get("WORLD_SIZE", "1"))
                ds["train_batch_size"] = (
                    ds["train_micro_batch_size_per_gpu"] * self._n_micro * world
                )
            if ds.get("gradient_clipping", "auto") == "auto":
                ds["gradient_clipping"] = cfg.optim.max_grad_norm
        self.accelerator = Accelerator(
            # without a GPU, cpu=True is what makes several launched processes one
            # gloo process group (accelerate's MULTI_CPU) instead of N lone copies;
            # DeepSpeed sets up its own (gloo on a CPU), and cpu=True would bypass it
            cpu=plugin is None and not torch.cuda.is_available(),
            mixed_precision=_mixed_precision(cfg.run.precision),
            gradient_accumulation_steps=self._n_micro,
            step_scheduler_with_optimizer=False,
            deepspeed_plugin=plugin,
        )
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.accelerator.num_processes:
            # e.g. DeepSpeed with several processes on a machine without GPUs: accelerate
            # leaves each process alone, which would train N unsynchronised copies
            raise VfopsError(
                f"{launched} processes were launched but accelerate joined "
                f"{self.accelerator.num_processes}; several DeepSpeed processes need GPUs: "
                "on a CPU drop --deepspeed, or run it with --num-processes 1"
            )

    def _setup_model(self) -> None:
        import transformers

        cfg = self.config
        path = Path(cfg.model.path)
        if not path.is_dir():
            if not cfg.model.build_tiny_if_missing:
                raise VfopsError(
                    f"[model] path {str(path)!r} does not exist; build one with "
                    "`vfops model build-tiny DIR` or set build_tiny_if_missing = true"
                )
            from vfops.local import build_tiny_model

            if self.accelerator.is_main_process:
                build_tiny_model(path, seed=cfg.model.tiny_seed)
            self.accelerator.wait_for_everyone()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(path), local_files_only=True
        )
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32
        )
        if cfg.loss.beta > 0:
            self._ref_model = _frozen_copy(model).to(self.accelerator.device)
        if cfg.run.gradient_checkpointing:
            # transformers 5.2x renamed it (the old name warns); older releases lack the new one
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable({"use_reentrant": False})
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            with warnings.catch_warnings():
                # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing``.
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
                model = self._peft(model, get_peft_model, LoraConfig)
        model.train()
        self.model = model

    def _peft(self, model: Any, get_peft_model: Any, lora_config: Any) -> Any:
        cfg = self.config
        return get_peft_model(
            model,
            lora_config(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=list(cfg.lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )

    def _setup_environment(self) -> None:
        if self.env is None:
            from vfops.envs import load_environment

            self.env = load_environment(self.config.environment.id, **self.config.environment.args)
        dataset = self.env.dataset
        if dataset is None:
            raise VfopsError(
                f"environment {self.env.name!r} has no train split; pick an environment with a "
                "dataset or pass num_train_examples in [environment] args"
            )
        self._examples = list(iter_examples(dataset))
        if not self._examples:
            raise VfopsError(f"environment {self.env.name!r} has an empty train split")

    def _setup_optimizer(self) -> None:
        import transformers

        cfg = self.config.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
        )
        scheduler = transformers.get_scheduler(
            cfg.scheduler,
            optimizer,
            num_warmup_steps=cfg.warmup_steps,
            num_training_steps=max(self.config.run.steps, 1),
        )
        self.model, self._optimizer, self._scheduler = self.accelerator.prepare(
            self.model, optimizer, scheduler
        )

    def _setup_backend(self) -> None:
        cfg = self.config.generation
        if self.backend is None:
            if cfg.backend == "hf":
                from vfops.training._generation_hf import HFBackend

                hf = HFBackend(
                    unwrap(self.model),
                    self.tokenizer,
                    max_batch_size=cfg.max_batch_size,
                    multiturn_tokens=cfg.multiturn_tokens,
                    seed=self.config.run.seed,
                )
                if cfg.async_steps == 0:  # nothing overlaps: one thread runs all torch work
                    self._main_compute = MainThreadCompute()
                    hf.run_compute = self._main_compute.run
                self.backend = hf
            else:
                import importlib

                # Imported only for this backend: it needs the vLLM server, not torch.
                vllm: Any = importlib.import_module("vfops.training._vllm")
                vllm_config = vllm.VLLMGenerationConfig(
                    base_url=cfg.base_url,
                    sync=cfg.sync,
                    sync_dir=cfg.sync_dir or str(Path(self.config.run.output_dir) / "weights"),
                    api_key_var=cfg.api_key_var,
                )
                self.backend = vllm.VLLMBackend.from_config(
                    vllm_config, self.tokenizer, multiturn_tokens=cfg.multiturn_tokens
                )
        # No initial sync: the hf backend copies the weights it is built from, and a
        # vLLM server starts from the same base model; resume() syncs restored weights.

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="vfops-generation", daemon=True)
        thread.start()
        self._loop, self._loop_thread = loop, thread

        async def make_limiter() -> asyncio.Semaphore:
            return asyncio.Semaphore(self.config.generation.max_concurrent)

        self._limiter = self._run(make_limiter())

    # ------------------------------------------------------------------ properties

    @property
    def base_model_name(self) -> str:
        return self.config.model.name or Path(self.config.model.path).name

    @property
    def env_versions(self) -> dict[str, str]:
        from vfops.envs._loading import environment_version

        env_id = self.config.environment.id
        return {env_id: environment_version(env_id) or "unknown"} if env_id else {}

    @property
    def policy_model(self) -> Any:
        """The trained module without accelerate/DeepSpeed wrappers."""
        return unwrap(self.model)

    # ------------------------------------------------------------------ train step

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns its metrics (also logged to MLflow when tracking)."""
        started = time.perf_counter()
        self._schedule_generation()
        wait_started = time.perf_counter()
        batch, dropped = self._fresh_batch(self._wait(self._pending.pop(self.step)))
        wait_s = time.perf_counter() - wait_started
        train_started = time.perf_counter()
        stats = self._optimize(batch)
        train_s = time.perf_counter() - train_started
        self.step += 1
        self._finish_generation_on_current_weights()
        sync_s = self._run(self._async_sync(self.step))
        metrics = self._metrics(batch, stats)
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

    def _fresh_batch(self, batch: _Batch) -> tuple[_Batch, int]:
        """``batch``, or when one of its turns is older than ``max_staleness`` steps, a
        batch generated again by the current weights (lag 0); and how many were dropped."""
        bound = self.config.generation.max_staleness
        if bound is None or self.step - batch.min_policy_version <= bound:
            return batch, 0
        logger.info(
            "step %d: dropping a batch generated by the weights of step %d (max_staleness "
            "= %d); generating it again",
            self.step,
            batch.min_policy_version,
            bound,
        )
        self.stale_batches_dropped += 1
        fresh: _Batch = self._run(self._generate_batch(self.step))
        if fresh.min_policy_version != self.step:
            raise VfopsError(
                f"the generation backend reports the weights of step {fresh.min_policy_version} "
                f"after the sync of step {self.step}; check that its weight sync reaches it"
            )
        return fresh, 1

    def _finish_generation_on_current_weights(self) -> None:
        """Wait for every batch that must be generated by the weights about to be replaced.

        Batch ``j`` is generated by policy version ``max(0, j - k)`` exactly: it starts
        after that version is synced (it is scheduled one step later), and the next
        sync waits here until it is done. So the off-policy lag is deterministic (k
        once the pipeline is full), not a matter of thread timing, and a run with
        ``async_steps = k`` is reproducible and resumes exactly.
        """
        last = self.step - 1 + self.config.generation.async_steps
        for index in sorted(i for i in self._pending if i <= last):
            self._wait(self._pending[index])

    def _schedule_generation(self) -> None:
        """Start generating every batch up to ``step + async_steps`` not yet started."""
        k = self.config.generation.async_steps
        for index in range(self.step, self.step + k + 1):
            if index not in self._pending:
                self._pending[index] = self._submit(self._generate_batch(index))

    async def _generate_batch(self, index: int) -> _Batch:
        assert self.env is not None and self.backend is not None
        started = time.perf_counter()
        examples = self.step_examples(index)
        groups = await asyncio.gather(
            *(
                self.env.run_group_states(
                    self.backend.client,
                    self.base_model_name,
                    example,
                    range(self.config.generation.group_size),
                    sampling_args=self._sampling_args(index, position),
                    limiter=self._limiter,
                )
                for position, example in enumerate(examples)
            )
        )
        generation_s = time.perf_counter() - started
        return self._to_batch(index, groups, generation_s)

    def _sampling_args(self, index: int, position: int) -> SamplingArgs:
        gen = self.config.generation
        args: SamplingArgs = {"max_tokens": gen.max_tokens, "temperature": gen.temperature}
        if gen.backend == "hf":
            # Reproducible draws per (seed, step, prompt); the hf backend varies the
            # stream per rollout itself. Not sent to vLLM, where one seed for every
            # rollout of a group would make them identical.
            args["seed"] = _derive(self.config.run.seed, "batch", index, position)
        return args

    def step_examples(self, index: int) -> list[Example]:
        """The prompts step ``index`` trains on (this rank's share): a seeded permutation
        per epoch, sharded by rank, so a run and its resume see the same data order."""
        per_rank = self.config.generation.prompts_per_step
        world = self.accelerator.num_processes
        start = (index * world + self.accelerator.process_index) * per_rank
        return [self._example_at(p) for p in range(start, start + per_rank)]

    def _example_at(self, position: int) -> Example:
        n = len(self._examples)
        epoch, offset = divmod(position, n)
        order = list(range(n))
        random.Random(_derive(self.config.run.seed, "epoch", epoch)).shuffle(order)
        return self._examples[order[offset]]

    def _to_batch(
        self,
        index: int,
        groups: list[tuple[list[State], list[RolloutScore]]],
        generation_s: float,
    ) -> _Batch:
        cfg = self.config
        samples: list[_Sample] = []
        rewards: list[float] = []
        generated = truncated = rollouts = 0
        min_version = index  # no turn can be newer than the step that trains on it
        for states, scores in groups:
            kept = [
                (state, score.reward)
                for state, score in zip(states, scores, strict=True)
                if state.get("error") is None and score.reward is not None
            ]
            if len(kept) < 2:  # no baseline to compare with
                continue
            advantages = group_advantages([float(r) for _, r in kept], scale=cfg.loss.scale_rewards)
            for (state, reward), advantage in zip(kept, advantages, strict=True):
                turns = _turn_tokens(state)
                rollouts += 1
                rewards.append(float(reward))
                generated += sum(len(t["completion_ids"]) for t in turns)
                is_truncated = state.get("stop_reason") == "length"
                truncated += int(is_truncated)
                for seq in rollout_sequences(turns):
                    if is_truncated and cfg.loss.mask_truncated:
                        seq.loss_mask = [0] * len(seq.loss_mask)
                    min_version = min(min_version, seq.policy_version)
                    samples.append(_Sample(seq, advantage))
        return _Batch(
            index, samples, rewards, generation_s, generated, truncated, rollouts, min_version
        )

    def _optimize(self, batch: _Batch) -> dict[str, float]:
        """Accumulate the loss over micro-batches; one optimizer step."""
        cfg = self.config
        totals = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "ratio_sum": 0.0}
        totals.update(tokens=0.0, entropy_sum=0.0, tokens_total=0.0, grad_norm=0.0)
        totals.update(mismatch_k3_sum=0.0, is_weight_sum=0.0, is_capped_tokens=0.0)
        totals.update(mismatch_ratio_max=-math.inf, mismatch_ratio_min=math.inf)
        norm = LossNorm(
            sequences=sum(1 for s in batch.samples if s.sequence.completion_tokens),
            all_sequences=len(batch.samples),
            tokens=sum(s.sequence.completion_tokens for s in batch.samples),
            max_tokens=cfg.generation.max_tokens,
        )
        for chunk in _split(batch.samples, self._n_micro):
            with self.accelerator.accumulate(self.model):
                loss, sums = self._micro_step(chunk, norm) if chunk else (None, {})
                _accumulate(totals, sums)
                if loss is not None:
                    totals["loss"] += float(loss.detach())
                    # accelerate divides by the accumulation steps; the loss is already
                    # normalised over the whole step, so undo it.
                    self.accelerator.backward(loss * self._n_micro)
                if self.accelerator.sync_gradients and cfg.optim.max_grad_norm > 0:
                    grad_norm = self.accelerator.clip_grad_norm_(
                        self.model.parameters(), cfg.optim.max_grad_norm
                    )
                    totals["grad_norm"] = float(grad_norm) if grad_norm is not None else 0.0
                self._optimizer.step()
                self._optimizer.zero_grad(set_to_none=True)
        self._scheduler.step()
        return totals

    def _micro_step(self, chunk: list[_Sample], norm: LossNorm) -> tuple[Any, dict[str, float]]:
        cfg = self.config
        device = self.accelerator.device
        ids, attention, mask, old = _pad([s.sequence for s in chunk], self.tokenizer, device)
        advantages = torch.tensor([s.advantage for s in chunk], dtype=torch.float32, device=device)
        start = _first_trained_position(mask)
        mask, old = mask[:, start:], old[:, start:]
        temperature = cfg.generation.temperature
        logprobs, entropy = token_logprobs(self.model, ids, attention, temperature, start)
        ref = None
        if self._ref_model is not None:
            with torch.no_grad():
                ref, _ = token_logprobs(self._ref_model, ids, attention, temperature, start)
        loss, sums = policy_loss(
            logprobs,
            old,
            advantages,
            mask,
            loss_type=cfg.loss.type,
            norm=norm,
            clip_low=cfg.loss.clip_low,
            clip_high=cfg.loss.clip_high,
            beta=cfg.loss.beta,
            ref_logprobs=ref,
            correction=cfg.loss.importance_correction,
            importance_cap=cfg.loss.importance_cap,
        )
        sums["entropy_sum"] = float((entropy * mask).sum())
        sums["tokens_total"] = float(attention.sum())
        return loss, sums

    def _metrics(self, batch: _Batch, stats: dict[str, float]) -> dict[str, float]:
        tokens = max(stats["tokens"], 1.0)
        rewards = batch.rewards or [0.0]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        return {
            "reward_mean": mean,
            "reward_std": std,
            "loss": stats["loss"],
            "kl": stats["kl_sum"] / tokens,
            "entropy": stats["entropy_sum"] / tokens,
            "clip_fraction": stats["clipped_tokens"] / tokens,
            "ratio_mean": stats["ratio_sum"] / tokens,
            "grad_norm": stats["grad_norm"],
            "lr": float(self._scheduler.get_last_lr()[0]),
            "trained_tokens": stats["tokens"],
            "sequences": float(len(batch.samples)),
            "rollouts": float(batch.rollouts),
            "truncated_fraction": batch.truncated / max(batch.rollouts, 1),
            "prefix_breaks": float(getattr(self.backend, "prefix_breaks", 0)),
            # sampler vs trainer on the trained tokens (k3 estimate of KL(behaviour ||
            # trainer); ratio = exp(trainer - behaviour log-prob)); with async_steps > 0
            # this includes the lag, not just kernel and precision differences
            "mismatch_kl": stats["mismatch_k3_sum"] / tokens,
            "mismatch_ratio_max": _finite_or(stats["mismatch_ratio_max"], 1.0),
            "mismatch_ratio_min": _finite_or(stats["mismatch_ratio_min"], 1.0),
            "is_weight_mean": stats["is_weight_sum"] / tokens if stats["tokens"] else 1.0,
            "is_capped_fraction": stats["is_capped_tokens"] / tokens,
        }

    # ------------------------------------------------------------------ eval

    def evaluate(self, n: int | None = None) -> dict[str, float]:
        """Mean reward of the current weights on the first ``n`` held-out (eval split) examples."""
        result: dict[str, float] = self._run(
            self._evaluate(self.config.run.eval_examples if n is None else n)
        )
        return result

    async def _evaluate(self, n: int) -> dict[str, float]:
        assert self.env is not None and self.backend is not None
        examples = list(self.env.iter_eval_examples(n))
        args: SamplingArgs = {
            "max_tokens": self.config.generation.max_tokens,
            "temperature": self.config.run.eval_temperature,
        }
        if self.config.generation.backend == "hf":
            args["seed"] = _derive(self.config.run.seed, "eval")
        groups = await asyncio.gather(
            *(
                self.env.run_group_states(
                    self.backend.client,
                    self.base_model_name,
                    ex,
                    [0],
                    sampling_args=args,
                    limiter=self._limiter,
                )
                for ex in examples
            )
        )
        rewards = [float(score.reward or 0.0) for _, scores in groups for score in scores]
        return {"eval_reward": sum(rewards) / max(len(rewards), 1), "eval_examples": len(rewards)}

    # ------------------------------------------------------------------ the whole run

    def train(self, progress: Progress | None = None) -> dict[str, Any]:
        """Baseline eval, ``run.steps`` steps (periodic eval/save), final eval, save, register.

        ``progress(kind, step, metrics)`` is called after every eval (``"eval"``) and
        every step (``"step"``), e.g. to print a line per step.
        """
        cfg = self.config.run
        report = progress or _no_progress
        baseline = self.evaluate()["eval_reward"]
        self._log_eval(baseline)
        report("eval", self.step, {"eval_reward": baseline})
        history: list[dict[str, float]] = []
        while self.step < cfg.steps:
            history.append(self.train_step())
            report("step", self.step, history[-1])
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                reward = self.evaluate()["eval_reward"]
                self._log_eval(reward)
                report("eval", self.step, {"eval_reward": reward})
            if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
                self.save(Path(cfg.output_dir) / f"step-{self.step}")
        final = self.evaluate()["eval_reward"]
        self._log_eval(final)
        report("eval", self.step, {"eval_reward": final})
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
            "history": history,
        }

    def _log_eval(self, reward: float) -> None:
        if self.tracker is not None:
            self.tracker.log_step(self.step, {"eval_reward": reward})

    def register(self, model_dir: Path, name: str) -> str:
        """Register an exported model folder in MLflow; returns ``models:/name/version``."""
        from vfops.checkpoints import register_checkpoint

        info = register_checkpoint(
            model_dir,
            name=name,
            training_run_id=self.tracker.run_id if self.tracker is not None else None,
            base_model=self.base_model_name,
            environment_versions=self.env_versions,
            description=f"GRPO step {self.step} on {self.config.environment.id}",
        )
        if self.tracker is not None:
            self.tracker.set_tag("vfops.registered_model", info.uri)
        return info.uri

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: str | Path) -> Path:
        """Write a resumable checkpoint (model, optimizer, scheduler, RNG, data position,
        step) plus an exported Hugging Face model folder under ``directory/model``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        with _tied_weights_not_reported():
            self.accelerator.save_state(str(out / ACCELERATE_SUBDIR))
        if self.accelerator.is_main_process:
            self._export_model(out / MODEL_SUBDIR)
            state = {
                "step": self.step,
                "data_position": self.step,  # batch index == step: data order is a pure function
                "config": self.config.model_dump(),
                "base_model": self.base_model_name,
                "environment_versions": self.env_versions,
                "mlflow_run_id": self.tracker.run_id if self.tracker is not None else None,
            }
            (out / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        self._save_pending(out)
        self.accelerator.wait_for_everyone()
        return out

    def _pending_file(self, directory: Path) -> Path:
        return directory / f"{PENDING_PREFIX}{self.accelerator.process_index}.pt"

    def _save_pending(self, out: Path) -> None:
        """Keep the batches generated ahead (``async_steps > 0``): their weights are gone
        after this step, so a resume could not generate them again."""
        self._finish_generation_on_current_weights()
        ahead = {
            index: future.result()
            for index, future in self._pending.items()
            if index >= self.step and future.done() and not future.cancelled()
        }
        torch.save(
            {index: dataclasses.asdict(batch) for index, batch in ahead.items()},
            self._pending_file(out),
        )

    def _load_pending(self, src: Path) -> None:
        path = self._pending_file(src)
        if not path.is_file():
            return
        saved: dict[int, dict[str, Any]] = torch.load(path, weights_only=False)
        for index, fields in saved.items():
            done: concurrent.futures.Future[_Batch] = concurrent.futures.Future()
            done.set_result(_batch_from_dict(fields))
            self._pending[int(index)] = done

    def _export_model(self, path: Path) -> None:
        model = self.accelerator.unwrap_model(self.model)
        if hasattr(model, "merge_and_unload"):
            from vfops.training._weights import full_state_dict

            base = _frozen_copy(model.get_base_model())
            base.load_state_dict(full_state_dict(model), strict=False)
            model = base
        from vfops.local._tiny import quiet_progress

        with quiet_progress():
            model.save_pretrained(str(path), safe_serialization=True)
        self.tokenizer.save_pretrained(str(path))

    def resume(self, directory: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` (after :meth:`setup`)."""
        src = Path(directory)
        state_file = src / STATE_FILE
        if not state_file.is_file():
            raise VfopsError(f"{src} is not a vfops training checkpoint (no {STATE_FILE})")
        state = json.loads(state_file.read_text())
        self._drop_pending()
        self.accelerator.load_state(str(src / ACCELERATE_SUBDIR))
        self.step = int(state["step"])
        self._run(self._async_sync(self.step))
        self._load_pending(src)

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        """Stop generation, close the backend and environment, end the MLflow run."""
        self._drop_pending()
        if self._loop is not None:
            if self.backend is not None:
                with contextlib.suppress(Exception):
                    self._run(self.backend.aclose())
            if self.env is not None:
                with contextlib.suppress(Exception):
                    self._run(self.env.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=10)
            self._loop.close()
            self._loop = None
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None

    def __enter__(self) -> GRPORecipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _drop_pending(self) -> None:
        for future in self._pending.values():
            future.cancel()
        for future in self._pending.values():
            with contextlib.suppress(BaseException):
                future.result(timeout=60)
        self._pending.clear()

    async def _async_sync(self, version: int) -> float:
        assert self.backend is not None
        return await self.backend.sync_weights(unwrap(self.model), version)

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        assert self._loop is not None, "call setup() first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Any) -> Any:
        return self._wait(self._submit(coro))

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        if self._main_compute is None:
            return future.result()
        return self._main_compute.wait(future)


class MainThreadCompute:
    """Runs the generation backend's torch work on the training thread while it waits.

    With ``async_steps = 0`` generation and training never overlap, so there is no
    reason to run torch on two threads: each thread running torch ops gets its own
    OpenMP team, and on a few cores the two teams slow each other down (measured:
    sampling took twice as long on a worker thread at 2 threads). The event loop
    still orchestrates rollouts; only the blocking compute is handed back here.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Queue ``fn(*args)`` for the training thread; await its result."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fn, args, done))
        return await asyncio.wrap_future(done)

    def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """Block until ``future`` is done, running queued compute meanwhile."""
        while not future.done():
            try:
                fn, args, done = self._jobs.get(timeout=0.005)
            except queue.Empty:
                continue
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine
                done.set_exception(exc)
        return future.result()


def _accumulate(totals: dict[str, float], sums: dict[str, float]) -> None:
    """Add a micro-batch's sums into the step's; ``*_max``/``*_min`` keep the extreme."""
    for key, value in sums.items():
        if key.endswith("_max"):
            totals[key] = max(totals[key], value)
        elif key.endswith("_min"):
            totals[key] = min(totals[key], value)
        else:
            totals[key] += value


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def _no_progress(kind: str, step: int, metrics: dict[str, float]) -> None:
    return None


def _batch_from_dict(fields: dict[str, Any]) -> _Batch:
    samples = [
        _Sample(Sequence(**sample["sequence"]), sample["advantage"]) for sample in fields["samples"]
    ]
    return _Batch(**{**fields, "samples": samples})


def _turn_tokens(state: State) -> list[TurnTokens]:
    turns: list[TurnTokens] = []
    for response in state.get("responses", []):
        raw = getattr(response, "raw", None) or {}
        tokens = raw.get(TOKENS_KEY)
        if tokens is None:
            raise VfopsError(
                "a model response carries no token ids; train through a training backend "
                "([generation] backend = 'hf' or 'vllm'), not a plain client"
            )
        turns.append(tokens)
    return turns


def _split(samples: list[_Sample], parts: int) -> list[list[_Sample]]:
    """``parts`` contiguous chunks of near-equal size (some may be empty)."""
    size, extra = divmod(len(samples), parts)
    chunks: list[list[_Sample]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(samples[start:end])
        start = end
    return chunks


def _pad(
    sequences: list[Sequence], tokenizer: Any, device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention, and the next-token-aligned loss mask and old logprobs."""
    width = max(len(s.input_ids) for s in sequences)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(sequences), width), int(pad), dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.float32)
    old = torch.zeros((len(sequences), width), dtype=torch.float32)
    for row, seq in enumerate(sequences):
        n = len(seq.input_ids)
        ids[row, :n] = torch.tensor(seq.input_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(seq.loss_mask, dtype=torch.float32)
        old[row, :n] = torch.tensor(seq.old_logprobs, dtype=torch.float32)
    # position t of the logprobs predicts token t+1
    return ids.to(device), attention.to(device), mask[:, 1:].to(device), old[:, 1:].to(device)


def _first_trained_position(mask: torch.Tensor) -> int:
    """The first next-token position any row trains on (0 when none does)."""
    trained = mask.sum(0).nonzero()
    return int(trained[0]) if len(trained) else 0


def _frozen_copy(model: Any) -> Any:
    import copy

    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def _mixed_precision(precision: str) -> str:
    if precision == "bf16":
        return "bf16"
    if precision == "fp32":
        return "no"
    cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if cuda_bf16 else "no"


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


def _derive(seed: int, *parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class _DropTiedWeightsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # accelerate's adapter prefixes "[RANK n] "
        return "Removed shared tensor" not in str(record.msg)


@contextlib.contextmanager
def _tied_weights_not_reported() -> Iterator[None]:
    """Silence accelerate's "Removed shared tensor ... while saving" during a checkpoint.

    A model with tied input and output embeddings stores the tensor once (safetensors
    cannot hold two views of one storage) and ``load_state`` ties them again: the notice
    says nothing a user can act on, on every checkpoint. ``test_resume_is_exact`` checks
    that the reload is exact.
    """
    notice = _DropTiedWeightsNotice()
    accelerate_logger = logging.getLogger("accelerate.utils.other")
    accelerate_logger.addFilter(notice)
    try:
        yield
    finally:
        accelerate_logger.removeFilter(notice)
