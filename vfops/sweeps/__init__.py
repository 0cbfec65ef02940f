"""Evaluation sweeps: environments x endpoints x sampling configs, one run per cell.

The library behind the ``eval-sweep`` Prefect flow (no Prefect here): plan the
matrix, refuse bad input before any model call, run a cell resuming or reusing
the registry run with the same configuration. :func:`load_sweep` reads a spec from
TOML.
"""

from vfops.sweeps._run import (
    FLOW_RUN_TAG,
    WORKER_NAME_ENV_VAR,
    WORKER_TAG,
    CellResult,
    PreparedEnvironment,
    cell_result_from_registry,
    prepare_environment,
    record_worker,
    run_cell_async,
    run_of_flow_run,
    sweep_markdown_fallback,
    sweep_table,
    worker_name,
)
from vfops.sweeps._spec import (
    MODEL_REF_TAG,
    Cell,
    EndpointRefs,
    EnvRefs,
    SamplingConfig,
    Samplings,
    SweepSpec,
    endpoints_path,
    load_sweep,
    output_root,
    parse_env_ref,
    plan_sweep,
)
from vfops.sweeps._validate import validate_sweep

__all__ = [
    "FLOW_RUN_TAG",
    "MODEL_REF_TAG",
    "WORKER_NAME_ENV_VAR",
    "WORKER_TAG",
    "Cell",
    "CellResult",
    "EndpointRefs",
    "EnvRefs",
    "PreparedEnvironment",
    "SamplingConfig",
    "Samplings",
    "SweepSpec",
    "cell_result_from_registry",
    "endpoints_path",
    "load_sweep",
    "output_root",
    "parse_env_ref",
    "plan_sweep",
    "prepare_environment",
    "record_worker",
    "run_cell_async",
    "run_of_flow_run",
    "sweep_markdown_fallback",
    "sweep_table",
    "validate_sweep",
    "worker_name",
]
