"""The registry: environments, published versions, eval runs, rollouts, judge cache,
alias events.

SQLite under ``$VFOPS_HOME`` by default, PostgreSQL via ``VFOPS_DATABASE_URL``.
The schema is created on first use and migrated with ``vfops db upgrade``.
Every query on the registry's tables lives in this package, one private module
per entity; other packages call these functions and never build a statement on
the ORM classes (a test checks it).

Registry functions take a :class:`~sqlalchemy.orm.Session`, so a caller can group
several into one transaction (``with session_scope() as session: ...``; ``write=False``
for reads). The rollout functions are the hot path: they run Core statements on the
session's connection instead of building ORM objects. The judge cache and a rollout's
judge cost (:func:`add_rollout_cost`) take an :class:`~sqlalchemy.Engine`: each call
is its own short transaction.
"""

from __future__ import annotations

from vfops._lease import LEASE_TTL_S, LeaseLostError, LeaseOwner, RunBusyError
from vfops.registry._alias_events import AliasEvent, list_alias_events, record_alias_event
from vfops.registry._costs import (
    RESERVATION_TTL_S,
    CostBudget,
    RunCost,
    get_cost_budget,
    release_run_reservations,
    reserve_cost,
    run_cost,
    run_costs,
    set_cost_caps,
    settle_cost,
)
from vfops.registry._db import (
    current_revision,
    dispose_engines,
    downgrade,
    ensure_schema,
    get_engine,
    head_revision,
    is_known_revision,
    mask_url,
    session_scope,
    transaction,
    upgrade,
)
from vfops.registry._environments import (
    NewEnvironmentVersion,
    add_environment_version,
    canonical_version,
    find_version,
    get_or_create_environment,
    list_environments,
    list_versions,
    parse_version,
    referenced_artifact_uris,
)
from vfops.registry._judge_cache import JudgeCacheEntry, RegistryJudgeCache
from vfops.registry._models import (
    AliasEventRow,
    Base,
    CostBudgetRow,
    CostReservationRow,
    EndpointPushbackRow,
    EnvironmentRow,
    EnvironmentVersionRow,
    EvalRunRow,
    JudgeCacheRow,
    RolloutRow,
)
from vfops.registry._pushback import Pushback, bump_pushback, pushback_epoch, read_pushback
from vfops.registry._rollouts import (
    RolloutScore,
    add_rollout_cost,
    completed_keys,
    count_rollouts,
    insert_rollouts,
    iter_rollout_scores,
    iter_rollouts,
    rollouts_for_example,
)
from vfops.registry._runs import (
    RUN_STATUSES,
    STALE,
    NewRun,
    RunFilter,
    add_run_tags,
    create_run,
    find_completed_run,
    find_resumable_run,
    finish_run,
    get_run,
    hold_run_lease,
    list_runs,
    release_run_lease,
    renew_run_lease,
    runs_tagged,
    set_mlflow_run_id,
    set_run_status,
    shown_status,
    take_run_lease,
)
from vfops.registry._transcripts import (
    ArchivedRun,
    TranscriptArchiveError,
    archivable_runs,
    archive_finished_runs,
    archive_run_transcripts,
)

__all__ = [
    "LEASE_TTL_S",
    "RESERVATION_TTL_S",
    "RUN_STATUSES",
    "STALE",
    "AliasEvent",
    "AliasEventRow",
    "ArchivedRun",
    "Base",
    "CostBudget",
    "CostBudgetRow",
    "CostReservationRow",
    "EndpointPushbackRow",
    "EnvironmentRow",
    "EnvironmentVersionRow",
    "EvalRunRow",
    "JudgeCacheEntry",
    "JudgeCacheRow",
    "LeaseLostError",
    "LeaseOwner",
    "NewEnvironmentVersion",
    "NewRun",
    "Pushback",
    "RegistryJudgeCache",
    "RolloutRow",
    "RolloutScore",
    "RunBusyError",
    "RunCost",
    "RunFilter",
    "TranscriptArchiveError",
    "add_environment_version",
    "add_rollout_cost",
    "add_run_tags",
    "archivable_runs",
    "archive_finished_runs",
    "archive_run_transcripts",
    "bump_pushback",
    "canonical_version",
    "completed_keys",
    "count_rollouts",
    "create_run",
    "current_revision",
    "dispose_engines",
    "downgrade",
    "ensure_schema",
    "find_completed_run",
    "find_resumable_run",
    "find_version",
    "finish_run",
    "get_cost_budget",
    "get_engine",
    "get_or_create_environment",
    "get_run",
    "head_revision",
    "hold_run_lease",
    "insert_rollouts",
    "is_known_revision",
    "iter_rollout_scores",
    "iter_rollouts",
    "list_alias_events",
    "list_environments",
    "list_runs",
    "list_versions",
    "mask_url",
    "parse_version",
    "pushback_epoch",
    "read_pushback",
    "record_alias_event",
    "referenced_artifact_uris",
    "release_run_lease",
    "release_run_reservations",
    "renew_run_lease",
    "reserve_cost",
    "rollouts_for_example",
    "run_cost",
    "run_costs",
    "runs_tagged",
    "session_scope",
    "set_cost_caps",
    "set_mlflow_run_id",
    "set_run_status",
    "settle_cost",
    "shown_status",
    "take_run_lease",
    "transaction",
    "upgrade",
]
