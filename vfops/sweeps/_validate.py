"""Refuse a bad sweep before any model is called, naming the problem and the fix."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vfops._errors import EndpointError, VfopsError
from vfops.sweeps._spec import Cell, SweepSpec, endpoints_path, parse_env_ref, plan_sweep

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def _listing(names: set[str] | list[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def validate_sweep(spec: SweepSpec, *, engine: Engine | None = None) -> list[Cell]:
    """Check everything a sweep needs that can be checked without calling a model.

    First the spec itself, again (a model built without validation, or edited, is
    refused too): N/R/concurrency not positive, malformed references, duplicates,
    ``env_args`` for an environment not in the sweep, as one ConfigError naming every
    bad field. Then, one line each (:class:`VfopsError`, the problem and the fix): an
    unknown environment (neither installed nor published), an unpublished version,
    two different versions of one environment, an unknown endpoint alias, a missing
    API-key variable. Returns the planned cells.
    """
    spec = spec.checked()
    from vfops.evaluation import check_middleware_names, check_sink_names

    check_sink_names(spec.sinks, "sinks")
    check_middleware_names(spec.middleware, "middleware")
    refs = [parse_env_ref(ref) for ref in spec.environments]
    _check_environments(refs, engine)
    _check_endpoints(spec)
    return plan_sweep(spec, pin_registry_models(spec))


def _check_environments(refs: Sequence[tuple[str, str, str | None]], engine: Engine | None) -> None:
    from vfops.envs import installed_environments
    from vfops.registry import get_engine, list_environments, list_versions, session_scope

    installed = set(installed_environments())
    engine = engine or get_engine()
    with session_scope(engine, write=False) as session:
        published = {row.name for row in list_environments(session)}
        versions = {
            name: {v.version: v.code_hash for v in list_versions(session, name)}
            for name, _, _ in refs
        }
    targets: dict[str, set[str]] = {}
    for name, kind, version in refs:
        ref = name if kind == "installed" else f"{name}@{version or 'latest'}"
        known = versions[name]
        if name not in installed and not known:
            raise VfopsError(
                f"unknown environment '{name}' (installed: {_listing(installed)}; "
                f"published: {_listing(published)}); install it with: vfops env install PATH, "
                "or publish it with: vfops env publish PATH"
            )
        if kind == "latest" and not known:
            raise VfopsError(
                f"{ref}: '{name}' has no published version (it is only installed); publish it "
                f"with: vfops env publish PATH, or use '{name}' to run the installed code"
            )
        if kind == "pinned" and version not in known:
            raise VfopsError(
                f"{ref} is not published (published versions of {name}: "
                f"{_listing(list(known))}); use one of them or {name}@latest"
            )
        if kind == "installed" and name in installed:
            target = _installed_hash(name)
        else:
            target = _target_hash(known, "latest" if kind == "installed" else kind, version)
        targets.setdefault(name, set()).add(target)
    for name, wanted in sorted(targets.items()):
        if len(wanted) > 1:
            raise VfopsError(
                f"the sweep asks for different versions of '{name}'; one worker runs one "
                "version of an environment at a time: sweep them in separate runs"
            )


def _installed_hash(name: str) -> str:
    from vfops.publishing import inspect_installed

    return inspect_installed(name).code_hash


def _target_hash(known: dict[str, str], kind: str, version: str | None) -> str:
    if kind == "pinned" and version is not None:
        return known[version]
    from vfops.registry import parse_version

    latest = max(known, key=parse_version)
    return known[latest]


def _check_endpoints(spec: SweepSpec) -> None:
    from vfops.checkpoints import is_model_uri
    from vfops.clients import DEFAULT_API_KEY_VAR, is_loopback, load_endpoints

    aliases = [alias for alias in spec.endpoints if not is_model_uri(alias)]
    if not aliases:
        return
    file = endpoints_path(spec)
    if not file.exists():
        raise EndpointError(
            f"endpoints file {file} not found; point endpoints_file (or $VFOPS_ENDPOINTS) "
            "at a TOML file with an [[endpoint]] per alias"
        )
    endpoints = load_endpoints(file)
    for alias in aliases:
        endpoint = endpoints.get(alias.strip())
        if endpoint is None:
            raise EndpointError(
                f"unknown endpoint alias {alias!r} in {file}; known aliases: "
                f"{_listing(set(endpoints))}; add an [[endpoint]] for it"
            )
        var = endpoint.api_key_var
        if os.environ.get(var):
            continue
        if var == DEFAULT_API_KEY_VAR and is_loopback(endpoint.base_url):
            continue  # a local server (vLLM, the stub) takes the placeholder key
        raise EndpointError(
            f"endpoint {alias!r} needs its API key in the environment variable {var}, which is "
            f"not set on this worker; export {var}=... where the worker runs "
            "(keys are never sweep parameters)"
        )


def pin_registry_models(spec: SweepSpec) -> dict[str, str]:
    """Resolve every ``models:/...`` endpoint to the version it names *now*.

    Called once when a sweep starts: a nightly sweep evaluates whoever holds
    ``champion`` at its start, even if the alias moves while it runs.
    """
    from vfops.checkpoints import is_model_uri, pin_model_uri

    pinned: dict[str, str] = {}
    for ref in spec.endpoints:
        if is_model_uri(ref):
            pinned[ref.strip()] = pin_model_uri(ref.strip()).uri
    return pinned
