"""``vfops stack``: the production services as local processes (no containers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Run the production stack (S3, MLflow, Prefect, workers) as local processes.",
    no_args_is_help=True,
)

# the defaults are repeated here (not imported): `vfops --help` must not import the stack
_DIR_HELP = "Folder of the stack's state file and logs."
DirOption = Annotated[Path, typer.Option("--dir", help=_DIR_HELP)]
_DEFAULT_DIR = Path(".vfops-stack")


@app.command("up")
def up_command(
    directory: DirOption = _DEFAULT_DIR,
    workers: Annotated[
        int,
        typer.Option(help="Prefect process workers; on a running stack, the missing ones start."),
    ] = 2,
    name: Annotated[
        str | None,
        typer.Option(
            help="Stack name: prefixes its databases (NAME_registry, ...). [default: vfops_stack]"
        ),
    ] = None,
    postgres_url: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL server to create the databases on, without password (use "
            "PGPASSWORD). [default: VFOPS_STACK_POSTGRES_URL, else "
            "postgresql://postgres@127.0.0.1:5432/postgres]"
        ),
    ] = None,
    pool: Annotated[str, typer.Option(help="The workers' Prefect work pool.")] = "vfops-process",
    worker_heartbeat: Annotated[
        int,
        typer.Option(
            help="Seconds between worker heartbeats; 3 missed: the pool shows it offline."
        ),
    ] = 30,
    worker_limit: Annotated[
        int | None,
        typer.Option(
            help="Flow runs each new worker runs at once (prefect worker start --limit); "
            "more wait for a free worker. [default: no limit]"
        ),
    ] = None,
    flow_run_launcher: Annotated[
        str | None,
        typer.Option(
            help="How workers start a flow run: engine (one interpreter running Prefect's "
            "engine: starts sooner) or workspace (Prefect's own: a supervisor interpreter, "
            "then the engine's). [default: engine]"
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every service to be healthy.")
    ] = 300.0,
    service_env: Annotated[
        list[str] | None,
        typer.Option(
            help="SERVICE:NAME=VALUE (SERVICE: s3, mlflow, prefect, worker): a variable for "
            "the services of that kind started now; repeatable. Not for secrets."
        ),
    ] = None,
) -> None:
    """Start the stack (or the missing workers of a running one) and wait until healthy."""
    from vfops.stack import StackOptions, parse_service_env_option, stack_up

    extra = parse_service_env_option(service_env or [])
    # unset: StackOptions' own default, defined once in vfops.stack
    launcher = {} if flow_run_launcher is None else {"flow_run_launcher": flow_run_launcher}
    options = StackOptions(
        workers=workers,
        name=name,
        postgres_url=postgres_url,
        pool=pool,
        worker_heartbeat_s=worker_heartbeat,
        worker_limit=worker_limit,
        timeout_s=timeout,
        service_env=extra,
        **launcher,
    )
    result = stack_up(directory, options, progress=lambda line: typer.echo(f"  {line}"))
    state = result.state
    if result.already_running:
        added = f"; started {', '.join(result.started)}" if result.started else ""
        typer.echo(
            f"stack {state.name} is already running in {state.dir} "
            f"({len(state.workers())} workers{added})"
        )
    else:
        typer.echo(f"stack {state.name} is up in {state.dir} ({result.seconds:.1f} s)")
    for service in state.services.values():
        where = service.url or f"pool {state.pool}"
        typer.echo(f"  {service.name:<10} {where:<32} pid {service.pid}  log {service.log}")
    typer.echo(f'use it from a shell: eval "$(vfops stack env --dir {state.dir})"')


@app.command("down")
def down_command(
    directory: DirOption = _DEFAULT_DIR,
    purge: Annotated[
        bool, typer.Option(help="Also drop the stack's databases and remove its files.")
    ] = False,
) -> None:
    """Stop every process of the stack (SIGTERM, then SIGKILL)."""
    from vfops.stack import stack_down

    state, count = stack_down(directory, purge=purge)
    if state is None:
        typer.echo(f"no stack in {directory.resolve()}")
        return
    typer.echo(f"stack {state.name}: stopped {count} processes")
    names = ", ".join(state.databases.values())
    if purge:
        typer.echo(f"dropped databases {names}; removed the stack's files in {state.dir}")
    else:
        typer.echo(f"kept databases {names} and the logs in {state.dir} (drop them: --purge)")


@app.command("status")
def status_command(directory: DirOption = _DEFAULT_DIR) -> None:
    """Each service: pid, URL, running and answering; workers as the pool shows them.
    Exits 1 when a service of the stack is not healthy."""
    from vfops.stack import stack_status

    state, services = stack_status(directory)
    if not state.services:
        typer.echo(
            f"stack {state.name} in {state.dir} is stopped; start it: "
            f"vfops stack up --dir {state.dir}"
        )
        raise typer.Exit(1)
    typer.echo(
        f"stack {state.name} in {state.dir} (pool {state.pool}, flow runs started by the "
        f"{state.flow_run_launcher} launcher)"
    )
    unhealthy = False
    for service in services:
        mark = "ok" if service.healthy else "--"
        pid = "-" if service.pid is None else str(service.pid)
        typer.echo(
            f"  {mark} {service.name:<10} pid {pid:<8} {service.url or '':<32} {service.detail}"
        )
        unhealthy |= service.pid is not None and not service.healthy
    if unhealthy:
        raise typer.Exit(1)


@app.command("env")
def env_command(directory: DirOption = _DEFAULT_DIR) -> None:
    """Print `export` lines that point vfops, MLflow, Prefect and boto3 at the stack."""
    from vfops.stack import export_lines, stack_env

    for line in export_lines(stack_env(directory)):
        typer.echo(line)


@app.command("kill-worker")
def kill_worker_command(
    worker: Annotated[str, typer.Argument(help="The worker's name (worker-1, ...).")],
    directory: DirOption = _DEFAULT_DIR,
) -> None:
    """SIGKILL a worker and its flow runs at once, as a lost machine (tests, drills)."""
    from vfops.stack import kill_worker

    state, count = kill_worker(directory, worker)
    typer.echo(
        f"killed {worker} ({count} processes); the pool {state.pool} shows it offline after "
        f"3 missed heartbeats (~{3 * state.worker_heartbeat_s} s)"
    )
