"""Give each vfops deployment's flow-run pods the secrets it names, and only those.

    python infra/k8s/set_deployment_secrets.py            # after every `vfops deploy`
    python infra/k8s/set_deployment_secrets.py --print    # the job variables, no change

``deployment-secrets.json`` maps each deployment to credential groups (the Prefect
API's, the registry's, S3's, MLflow's, the model keys); each group is a list of env
names, each name a key of one Kubernetes Secret. This sets the deployment's
``secret_env`` job variable (work-pool-*.json puts it in the pod as ``secretKeyRef``
entries), keeping its other job variables (the image ``vfops deploy --image`` set).
A deployment the file does not name is left alone: its pods get the pool's default,
the Prefect credential alone. Needs PREFECT_API_URL and PREFECT_API_AUTH_STRING.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

MAPPING = Path(__file__).with_name("deployment-secrets.json")


def load_mapping(path: Path = MAPPING) -> dict[str, Any]:
    mapping: dict[str, Any] = json.loads(path.read_text())
    return mapping


def secret_env(deployment: str, mapping: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``secret_env`` job variable of ``deployment``: one secretKeyRef per name."""
    names = [
        name for group in mapping["deployments"][deployment] for name in mapping["groups"][group]
    ]
    return [
        {"name": name, "valueFrom": {"secretKeyRef": dict(mapping["secrets"][name])}}
        for name in dict.fromkeys(names)
    ]


async def apply(mapping: dict[str, Any]) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.exceptions import ObjectNotFound

    done = []
    async with get_client() as client:
        for name in mapping["deployments"]:
            try:
                # vfops names each deployment after its flow
                deployment = await client.read_deployment_by_name(f"{name}/{name}")
            except ObjectNotFound:
                continue
            variables = {
                **(deployment.job_variables or {}),
                "secret_env": secret_env(name, mapping),
            }
            await client.update_deployment(deployment.id, DeploymentUpdate(job_variables=variables))
            done.append(name)
    return done


def main(argv: list[str]) -> int:
    mapping = load_mapping()
    if "--print" in argv:
        print(
            json.dumps(
                {name: secret_env(name, mapping) for name in mapping["deployments"]}, indent=2
            )
        )
        return 0
    for name in asyncio.run(apply(mapping)):
        print(f"{name}: {', '.join(e['name'] for e in secret_env(name, mapping))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
