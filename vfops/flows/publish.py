"""``publish-environment``: build, hash and register an environment version.

A thin layer over :func:`vfops.publishing.publish_environment` (refuse-first:
a refused publish leaves no trace), with a markdown artifact of the result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from vfops.publishing import publish_environment

REPORT_KEY = "publish-environment"

Bump = Literal["patch", "minor", "major"]


@flow(name="publish-environment", validate_parameters=True)
def publish_environment_flow(path: str, bump: Bump | None = None) -> dict[str, Any]:
    """Publish the environment package at ``path`` (a no-op for content already published).

    Args:
        path: Folder of the environment package on the worker.
        bump: Bump the version first (patch, minor or major); empty: publish the version in
            pyproject.toml, which is refused if that version holds other content.
    """
    result = publish_environment(Path(path), bump=bump)
    verb = "Published" if result.status == "published" else "Unchanged, already published as"
    lines = [
        f"# {verb} `{result.env_name}@{result.version}`",
        "",
        "| field | value |",
        "|---|---|",
        f"| environment | `{result.env_name}` |",
        f"| version | `{result.version}` |",
        f"| status | {result.status} |",
        f"| content hash | `{result.content_hash}` |",
        f"| code hash | `{result.code_hash}` |",
        f"| wheel | `{result.wheel_uri}` |",
    ]
    for split, info in sorted(result.datasets.items()):
        lines.append(
            f"| dataset `{split}` | {info.get('rows', '?')} rows, `{info.get('uri', '')}` |"
        )
    lines += ["", f"Sweep it with the eval-sweep flow: `{result.env_name}@{result.version}`."]
    create_markdown_artifact(
        markdown="\n".join(lines) + "\n",
        key=f"{REPORT_KEY}-{re.sub('[^a-z0-9]+', '-', result.env_name.lower()).strip('-')}",
        # the V1 UI renders descriptions as markdown (name@1.2.3 would be a mailto: link)
        # and V2 as plain text (an escape would show): no @ here
        description=f"{result.env_name} {result.version}: {result.status}",
    )
    return {
        "env_name": result.env_name,
        "version": result.version,
        "status": result.status,
        "content_hash": result.content_hash,
        "code_hash": result.code_hash,
        "wheel_uri": result.wheel_uri,
    }
