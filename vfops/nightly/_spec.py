"""What the nightly sweep runs and when: ``nightly.toml``, checked before Prefect sees it.

``nightly.toml``::

    [schedule]
    cron = "0 3 * * *"           # optional; `vfops deploy --nightly-cron` overrides it

    [nightly]
    environments = ["arithmetic", "guess_number"]   # evaluated at name@latest
    endpoints = ["small", "models:/tiny@champion"]
    num_examples = 100
    rollouts_per_example = 4

The ``[nightly]`` table is the ``nightly-eval`` flow's ``config`` parameter
(:class:`NightlyConfig`). :func:`load_nightly` refuses a bad cron expression, N or R
not positive, wrong types and unknown keys, every problem at once, before any
deployment is registered.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from vfops._config import ConfigModel, load_toml
from vfops.nightly._nightly import nightly_tags
from vfops.sweeps import EndpointRefs, EnvRefs, SamplingConfig, Samplings, SweepSpec

DEFAULT_NIGHTLY_CRON = "0 3 * * *"


def _iso_date(value: str | None) -> str | None:
    if value is not None:
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"must be a date YYYY-MM-DD, got {value!r}") from None
    return value


def _cron(value: str) -> str:
    # Prefect's own schedule model (vfops.orchestration): exactly what the deployment
    # would accept, checked here without a server
    from vfops.orchestration import check_cron

    return check_cron(value)


class NightlyConfig(ConfigModel):
    """What the nightly sweep runs (the deployment's default parameters)."""

    environments: EnvRefs = Field(
        description="Environment names; each is evaluated at its latest published version "
        "(name@latest) unless a version is pinned (name@VERSION, e.g. 1.2.3)."
    )
    endpoints: EndpointRefs = Field(
        description="Endpoint aliases from the endpoints file, or registry models run "
        "in-process: models:/NAME@champion is whoever holds champion when the night starts."
    )
    endpoints_file: str | None = Field(
        default=None, description="endpoints.toml (default: $VFOPS_ENDPOINTS or ./endpoints.toml)."
    )
    sampling: Samplings = Field(
        default_factory=lambda: [SamplingConfig()], description="Sampling configurations."
    )
    num_examples: int = Field(default=50, gt=0, description="Examples per cell (N).")
    rollouts_per_example: int = Field(default=4, gt=0, description="Rollouts per example (R).")
    max_concurrent: int = Field(default=32, gt=0, description="Rollouts in flight per cell.")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="Significance level.")
    pass_threshold: float | None = Field(
        default=None, description="Mean reward at which an example passes (for McNemar)."
    )
    date: Annotated[str | None, AfterValidator(_iso_date)] = Field(
        default=None, description="Night to run as (YYYY-MM-DD); default: today (UTC)."
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="USD one night may spend over all its cells (needs endpoint prices).",
    )
    cost_scope: str | None = Field(
        default=None,
        description="A ledger name shared with other sweeps (default: one cap per night).",
    )
    archive_transcripts_after_days: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="After the night's comparisons, move the transcripts of completed runs "
        "that finished more than this many days ago to Parquet in the artifact store "
        "(vfops runs archive); the registry keeps their rewards, scores and costs. "
        "Default: keep every transcript in the registry.",
    )

    def sweep(self) -> SweepSpec:
        refs = [ref if "@" in ref else f"{ref}@latest" for ref in self.environments]
        return SweepSpec(
            environments=refs,
            endpoints=self.endpoints,
            endpoints_file=self.endpoints_file,
            sampling=self.sampling,
            num_examples=self.num_examples,
            rollouts_per_example=self.rollouts_per_example,
            max_concurrent=self.max_concurrent,
            tags=nightly_tags(self.night()),
            max_cost=self.max_cost,
            # one cap per night unless a shared scope is named
            cost_scope=self.cost_scope
            or (f"nightly:{self.night().isoformat()}" if self.max_cost is not None else None),
        )

    def night(self) -> dt.date:
        return dt.date.fromisoformat(self.date) if self.date else dt.datetime.now(dt.UTC).date()


class NightlySchedule(ConfigModel):
    """When the nightly sweep runs."""

    cron: Annotated[str, AfterValidator(_cron)] = Field(
        default=DEFAULT_NIGHTLY_CRON,
        description="Cron schedule of nightly-eval (minute hour day-of-month month day-of-week).",
    )


class NightlyFile(ConfigModel):
    """``nightly.toml``: the schedule and the ``[nightly]`` sweep."""

    schedule: NightlySchedule = Field(
        default_factory=NightlySchedule, description="When the nightly sweep runs."
    )
    nightly: NightlyConfig = Field(description="What the nightly sweep runs.")

    def deployment_parameters(self) -> dict[str, Any]:
        """The ``nightly-eval`` deployment's parameters: what the file sets (the rest
        stays the flow's defaults, defined once, in :class:`NightlyConfig`)."""
        return {"config": self.nightly.model_dump(mode="json", exclude_unset=True)}


def load_nightly(path: str | Path, *, cron: str | None = None) -> NightlyFile:
    """Read ``nightly.toml``; ``cron`` (``--nightly-cron``) overrides ``[schedule] cron``."""
    spec = load_toml(path, NightlyFile)
    if cron is None:
        return spec
    # only the schedule is rebuilt: [nightly] keeps track of what the file set
    schedule = spec.schedule.with_overrides({"cron": cron}, source="--nightly-cron")
    return spec.model_copy(update={"schedule": schedule})
