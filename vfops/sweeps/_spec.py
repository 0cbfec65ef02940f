"""What a sweep is: environments x endpoints x sampling configs, and its cells.

The models double as the Prefect UI form of the ``eval-sweep`` flow: every field
has a ``description`` and JSON-schema bounds, so the form explains and checks
itself. Nothing here touches the registry, the network or Prefect.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from vfops._config import ConfigModel, load_toml
from vfops._errors import VfopsError
from vfops._sampling import sampling_problems

ENDPOINTS_ENV_VAR = "VFOPS_ENDPOINTS"
DEFAULT_ENDPOINTS_FILE = "endpoints.toml"

RefKind = Literal["installed", "latest", "pinned"]

MODEL_REF_TAG = "model-ref:"
"""Run tag prefix naming the registry alias a cell's model was pinned from."""


def _valid_sampling_args(args: dict[str, Any]) -> dict[str, Any]:
    problems = sampling_problems(args)
    if problems:
        raise ValueError("; ".join(f"{name} {problem}" for name, problem in problems))
    return args


class SamplingConfig(ConfigModel):
    """One named set of sampling arguments (a column of the sweep)."""

    name: str = Field(
        default="default",
        min_length=1,
        description="Short label of this sampling configuration, shown in tables and charts.",
    )
    args: Annotated[dict[str, Any], AfterValidator(_valid_sampling_args)] = Field(
        default_factory=dict,
        description=(
            "Sampling arguments sent with every request, e.g. "
            '{"temperature": 0.7, "max_tokens": 512}.'
        ),
    )


def _default_sampling() -> list[SamplingConfig]:
    return [SamplingConfig(name="default", args={})]


def _unique(values: list[str]) -> list[str]:
    repeated = sorted(v for v, count in Counter(v.strip() for v in values).items() if count > 1)
    if repeated:
        raise ValueError(f"lists {repeated[0]!r} twice; give each one once")
    return values


def _env_refs(refs: list[str]) -> list[str]:
    for ref in refs:
        try:
            parse_env_ref(ref)
        except VfopsError as exc:
            raise ValueError(str(exc)) from None
    return _unique(refs)


def _distinct_sampling(configs: list[SamplingConfig]) -> list[SamplingConfig]:
    _unique([c.name for c in configs])
    seen: dict[str, str] = {}
    for sampling in configs:
        key = json.dumps(sampling.args, sort_keys=True, default=str)
        if key in seen:
            raise ValueError(
                f"sampling configs {seen[key]!r} and {sampling.name!r} have the same arguments "
                "(they would be one run); drop one or change its args"
            )
        seen[key] = sampling.name
    return configs


EnvRefs = Annotated[list[str], Field(min_length=1), AfterValidator(_env_refs)]
"""Environment references, each NAME, NAME@latest or NAME@1.2.3, each once."""
EndpointRefs = Annotated[list[str], Field(min_length=1), AfterValidator(_unique)]
"""Endpoint aliases or registry model URIs, each once."""
Samplings = Annotated[list[SamplingConfig], Field(min_length=1), AfterValidator(_distinct_sampling)]
"""Sampling configurations with distinct names and distinct arguments."""


def check_env_args(env_args: Mapping[str, Any], refs: list[str]) -> None:
    """Refuse ``env_args`` for an environment that is not among ``refs``."""
    names = {parse_env_ref(ref)[0] for ref in refs}
    stray = sorted(set(env_args) - names)
    if stray:
        raise ValueError(
            f"env_args has arguments for {stray[0]!r}, which is not among the environments "
            f"({', '.join(sorted(names))}); use the environment NAME as the key"
        )


class SweepSpec(ConfigModel):
    """An evaluation sweep: every environment x every endpoint x every sampling config."""

    environments: EnvRefs = Field(
        description=(
            "Environment references: NAME (the installed code, recorded with its provenance), "
            "NAME@latest (the newest published version) or NAME@VERSION (that published "
            "version, e.g. 1.2.3)."
        ),
        examples=[["arithmetic@latest"]],
    )
    endpoints: EndpointRefs = Field(
        description=(
            "Model endpoint aliases from the endpoints file (never keys: each endpoint names "
            "the environment variable holding its API key on the worker), or MLflow registry "
            "models run in-process on the worker: models:/NAME@champion (the version holding "
            "the alias when the sweep starts) or models:/NAME/3."
        ),
        examples=[["small"], ["models:/tiny@champion"]],
    )
    endpoints_file: str | None = Field(
        default=None,
        description=(
            f"Path of the endpoints TOML file on the worker; default: ${ENDPOINTS_ENV_VAR} "
            f"or ./{DEFAULT_ENDPOINTS_FILE}."
        ),
    )
    sampling: Samplings = Field(
        default_factory=_default_sampling,
        description="Sampling configurations to sweep (each one is a column of the matrix).",
    )
    num_examples: int = Field(
        default=5, gt=0, description="N: examples evaluated per cell (the first N of the eval set)."
    )
    rollouts_per_example: int = Field(
        default=3, gt=0, description="R: rollouts per example (pass@k uses them)."
    )
    max_concurrent: int = Field(
        default=32, gt=0, description="Rollouts in flight at once within one cell."
    )
    max_parallel_cells: int = Field(
        default=4, gt=0, description="Cells evaluated at the same time."
    )
    distribute: bool = Field(
        default=False,
        description=(
            "Run each cell as its own flow run of the eval-sweep-cell deployment, taken by "
            "any worker of the pool (at most max_parallel_cells at a time); a cell whose "
            "worker is lost is rescheduled by the automations vfops deploy creates. Off: "
            "the cells run as tasks on the sweep's own worker."
        ),
    )
    env_args: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Arguments of load_environment per environment NAME, e.g. "
            '{"arithmetic": {"difficulty": "hard"}}.'
        ),
    )
    pass_threshold: float = Field(
        default=1.0, description="A rollout passes (for pass@k) when its reward is at least this."
    )
    reuse_completed: bool = Field(
        default=True,
        description=(
            "Reuse a completed run with the same configuration instead of evaluating again "
            "(unfinished runs are always resumed). Turn off to measure afresh."
        ),
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds before one model request times out (retried)."
    )
    max_retries: int = Field(
        default=5, ge=0, description="Retries per model request on 429/5xx/timeouts."
    )
    output_dir: str | None = Field(
        default=None,
        description="Root folder for run directories on the worker; default: $VFOPS_HOME/outputs.",
    )
    tags: list[str] = Field(
        default_factory=list,
        description=(
            "Tags of the runs (e.g. nightly:2026-11-29); part of a run's identity, so other "
            "tags make new runs while the same tags resume or reuse the earlier ones."
        ),
    )
    image_map: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Image a task names -> the local image its container runs in (vfops eval's "
            "--image-map), for v1 tasks that need a container."
        ),
    )
    sinks: list[str] = Field(
        default_factory=list,
        description=(
            "Plug-in sinks by name (vfops.eval_sinks entry points) every cell's run also "
            "writes to, as vfops eval --sink does."
        ),
    )
    middleware: list[str] = Field(
        default_factory=list,
        description=(
            "Plug-in request middleware by name (vfops.request_middleware entry points) on "
            "every cell's client, as vfops eval --middleware does."
        ),
    )
    max_sandboxes: int = Field(
        default=64,
        gt=0,
        description=(
            "Sandbox containers the sweep's cells may run at once over every worker (the "
            "Prefect global concurrency limit sandbox-containers, created this size when "
            "missing); each worker's host keeps its own VFOPS_SANDBOX_MAX_CONTAINERS too."
        ),
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "USD the whole sweep may spend, over every cell and worker (needs endpoint "
            "prices); a cell that finds no room stops with status budget_exhausted."
        ),
    )
    cost_scope: Annotated[str, AfterValidator(_scope_name)] | None = Field(
        default=None,
        description=(
            "Name of the ledger max_cost is kept in; sweeps (and nightly sweeps) naming the "
            "same scope share one cap. Default: one per sweep (its environments, endpoints, "
            "sampling and tags)."
        ),
    )

    def cost_caps(self) -> dict[str, float | None]:
        """The ledger scopes every cell spends against ({} when the sweep is uncapped)."""
        if self.max_cost is None and self.cost_scope is None:
            return {}
        return {sweep_scope(self): self.max_cost}

    @model_validator(mode="after")
    def _env_args_name_environments(self) -> Self:
        check_env_args(self.env_args, self.environments)
        return self


_SWEEP_IDENTITY = {
    "environments", "endpoints", "sampling", "tags", "num_examples", "rollouts_per_example"
}  # fmt: skip


def sweep_scope(spec: SweepSpec) -> str:
    """The ledger scope of a sweep's cap: ``sweep:<cost_scope>``, or one derived from
    what makes the sweep (so a re-run of it continues the same cap)."""
    if spec.cost_scope is not None:
        return f"sweep:{spec.cost_scope}"
    identity = spec.model_dump(
        mode="json",
        include=_SWEEP_IDENTITY,
    )
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"sweep:{digest}"


def _scope_name(value: str) -> str:
    if not value.strip() or len(value) > 200:
        raise ValueError("must be a non-empty name of at most 200 characters, e.g. team-nightly")
    return value.strip()


def load_sweep(path: str | Path) -> SweepSpec:
    """Read a sweep spec (TOML: the fields of :class:`SweepSpec` at the top level, one
    ``[[sampling]]`` table per sampling config); every problem in one ConfigError."""
    return load_toml(path, SweepSpec)


class Cell(BaseModel):
    """One cell of a sweep: one environment ref x one endpoint x one sampling config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_ref: str = Field(description="The environment reference as given in the sweep.")
    env_name: str = Field(description="The environment name.")
    ref_kind: RefKind = Field(description="installed code, the latest or a pinned version.")
    version: str | None = Field(default=None, description="The pinned version, if any.")
    endpoint: str = Field(
        description="The endpoint alias, or a pinned registry model models:/NAME/VERSION."
    )
    model_ref: str | None = Field(
        default=None,
        description="The registry alias the pinned model was resolved from (models:/NAME@ALIAS).",
    )
    endpoints_file: str = Field(description="The endpoints file the alias comes from.")
    sampling: SamplingConfig
    num_examples: int = Field(gt=0)
    rollouts_per_example: int = Field(gt=0)
    max_concurrent: int = Field(gt=0)
    env_args: dict[str, Any] = Field(default_factory=dict)
    pass_threshold: float = 1.0
    reuse_completed: bool = True
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=5, ge=0)
    tags: list[str] = Field(default_factory=list)
    image_map: dict[str, str] = Field(default_factory=dict)
    max_sandboxes: int = Field(default=64, gt=0)
    sinks: list[str] = Field(default_factory=list)
    middleware: list[str] = Field(default_factory=list)
    cost_caps: dict[str, float | None] = Field(
        default_factory=dict, description="Ledger scopes the cell spends against, and caps."
    )

    @property
    def label(self) -> str:
        """``env_ref / endpoint / sampling`` (task run names, table rows)."""
        return f"{self.env_ref} / {self.endpoint} / {self.sampling.name}"


def parse_env_ref(ref: str) -> tuple[str, RefKind, str | None]:
    """``NAME`` / ``NAME@latest`` / ``NAME@1.2.3`` -> (name, kind, pinned version)."""
    from vfops.registry import canonical_version

    name, at, version = ref.strip().partition("@")
    if not name or (at and not version):
        raise VfopsError(
            f"invalid environment reference {ref!r}; use NAME, NAME@latest or NAME@1.2.3"
        )
    if not at:
        return name, "installed", None
    if version == "latest":
        return name, "latest", None
    try:
        version = canonical_version(version)  # as the registry stores it: 1.2.03 is 1.2.3
    except VfopsError:
        raise VfopsError(
            f"invalid version in environment reference {ref!r}; use NAME@latest or "
            "NAME@MAJOR.MINOR.PATCH (e.g. 1.2.3)"
        ) from None
    return name, "pinned", version


def endpoints_path(spec: SweepSpec) -> Path:
    """The endpoints file of ``spec``: explicit, ``$VFOPS_ENDPOINTS`` or ./endpoints.toml."""
    chosen = spec.endpoints_file or os.environ.get(ENDPOINTS_ENV_VAR) or DEFAULT_ENDPOINTS_FILE
    return Path(chosen).expanduser().resolve()


def output_root(spec: SweepSpec) -> Path:
    """Where run directories go: ``spec.output_dir`` or ``$VFOPS_HOME/outputs``."""
    from vfops._settings import vfops_home

    if spec.output_dir:
        return Path(spec.output_dir).expanduser().resolve()
    return vfops_home() / "outputs"


def plan_sweep(spec: SweepSpec, pinned: Mapping[str, str] | None = None) -> list[Cell]:
    """The matrix: environments (outer) x endpoints x sampling configs (inner).

    ``pinned`` maps a ``models:/NAME@ALIAS`` endpoint to the ``models:/NAME/VERSION``
    it resolved to at the start of the sweep; the cell runs that version.
    """
    file = str(endpoints_path(spec))
    pinned = pinned or {}
    cells: list[Cell] = []
    for ref in spec.environments:
        name, kind, version = parse_env_ref(ref)
        for alias in spec.endpoints:
            endpoint = pinned.get(alias.strip(), alias.strip())
            model_ref = alias.strip() if endpoint != alias.strip() else None
            for sampling in spec.sampling:
                cells.append(
                    Cell(
                        env_ref=ref.strip(),
                        env_name=name,
                        ref_kind=kind,
                        version=version,
                        endpoint=endpoint,
                        model_ref=model_ref,
                        endpoints_file=file,
                        sampling=sampling,
                        num_examples=spec.num_examples,
                        rollouts_per_example=spec.rollouts_per_example,
                        max_concurrent=spec.max_concurrent,
                        env_args=dict(spec.env_args.get(name, {})),
                        pass_threshold=spec.pass_threshold,
                        reuse_completed=spec.reuse_completed,
                        request_timeout_s=spec.request_timeout_s,
                        max_retries=spec.max_retries,
                        tags=list(spec.tags),
                        image_map=dict(spec.image_map),
                        max_sandboxes=spec.max_sandboxes,
                        sinks=list(spec.sinks),
                        middleware=list(spec.middleware),
                        cost_caps=spec.cost_caps(),
                    )
                )
    return cells
