"""A vfops plug-in package: an eval sink and a loss variant, each one entry point.

- ``CsvSink`` (``vfops eval --sink csv``): every scored rollout as a row of
  ``rollouts.csv`` in the run folder, headed by the run it belongs to (its id and the
  environment's content hash, from the :class:`vfops.evaluation.RunInfo` it is opened
  with).
- ``RunHeader`` (``vfops eval --middleware run-header``): every model request of the run
  carries an ``X-Experiment`` header (from ``VFOPS_EXPERIMENT``, default ``example``).
- ``HalfDAPO`` (``[loss] type = "half_dapo"``): DAPO's loss at half the step size,
  built on vfops's own variant (a loss variant is a class with ``loss(inputs, config,
  norm)`` and its clip and dynamic-sampling defaults).
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Any

from vfops.evaluation import RunFinish, RunInfo
from vfops.training import TokenPPO


class CsvSink:
    name = "csv"

    def __init__(self, info: RunInfo) -> None:
        self.path = info.run_dir / "rollouts.csv"
        self.handle = self.path.open("w", newline="")
        self.writer = csv.writer(self.handle)
        self.writer.writerow(["# run", info.run_id, info.env_name, info.env_version,
                              info.env_code_hash, info.model])  # fmt: skip
        self.writer.writerow(["example_id", "rollout_index", "reward", "error"])

    async def write_group(self, records: list[Any]) -> None:
        for record in records:
            error = record.error.message if record.error is not None else ""
            self.writer.writerow([record.example_id, record.rollout_index, record.reward, error])
        self.handle.flush()

    async def close(self, finish: RunFinish) -> None:
        self.writer.writerow(["# status", finish.status])
        self.handle.close()


class RunHeader:
    """Adds ``X-Experiment`` to every request (a request middleware wraps the send)."""

    def __init__(self) -> None:
        self.value = os.environ.get("VFOPS_EXPERIMENT", "example")

    def wrap(self, send: Any) -> Any:
        async def with_header(request: Any) -> Any:
            headers = {**(request.headers or {}), "X-Experiment": self.value}
            return await send(dataclasses.replace(request, headers=headers))

        return with_header


class HalfDAPO(TokenPPO):
    """DAPO's token mean over the step, halved: ``L = sum_it m_it l_it / (2 N_tok)``."""

    clip_high = 0.28
    dynamic_sampling = True

    def reduce(self, masked: Any, mask: Any, norm: Any) -> Any:
        return masked.sum() / max(2 * norm.tokens, 1)
