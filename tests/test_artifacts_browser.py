"""The sweep and nightly artifacts as a user reads them: headless Chromium on the Prefect UI.

A real ``prefect server start`` (serving both of its UIs, V1 at the root and V2 under
``/v2``), a real ``eval-sweep`` and two real ``nightly-eval`` nights run in this process
against it, with a published environment (so versions read ``browser_env@0.1.0``) and
the stub model. Each report and table artifact page is rendered in both UIs after their
JavaScript ran; screenshots are kept under test-artifacts/.

What is checked is what the issue saw: V1 renders markdown (reports, table cells and the
run form's descriptions) with GFM e-mail autolinks, so ``name@1.2.3`` became a
``mailto:`` link; the chart was an image artifact whose ``data:`` URL showed as text.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from uuid import UUID

# before Prefect is imported: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pytest

from tests.browser import render
from tests.test_flow_nightly import answer_with
from tests.test_prefect_e2e import serve_stack
from vfops.cli._env import init_environment
from vfops.publishing import install_published, publish_environment
from vfops.registry import dispose_engines
from vfops.testing import StubConfig, StubServer

# Prefect's events client (emit_event) leaves its websocket sockets to the server for the
# garbage collector; that is Prefect's, not ours (as in test_flow_nightly.py).
pytestmark = [
    pytest.mark.tracking,  # what these tests check is in MLflow (tests/conftest.py)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    # a server with its UI, a sweep, two nights and eight pages in Chromium (~6 min when
    # the machine is busy)
    pytest.mark.timeout(900),
]

ENV = "browser_env"
VERSION_TEXT = f"{ENV}@0.1.0"  # what the old reports turned into mailto:browser_env@0.1.0
N, R = 12, 2


class _Page(HTMLParser):
    """What a rendered page shows: its visible text (not in ``display: none``, scripts or
    styles), the text and images inside the rendered markdown, its links."""

    VOID = frozenset(
        [
            "area",
            "base",
            "br",
            "col",
            "embed",
            "hr",
            "img",
            "input",
            "link",
            "meta",
            "source",
            "track",
            "wbr",
        ]
    )
    HIDDEN_TAGS = frozenset({"script", "style", "template", "noscript"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._stack: list[tuple[str, bool, bool]] = []  # tag, hidden, inside markdown
        self.text: list[str] = []
        self.markdown_text: list[str] = []
        self.markdown_images: list[str] = []
        self.hrefs: list[str] = []

    def _state(self) -> tuple[bool, bool]:
        return (self._stack[-1][1], self._stack[-1][2]) if self._stack else (False, False)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        hidden, markdown = self._state()
        hidden = (
            hidden
            or tag in self.HIDDEN_TAGS
            or "hidden" in values
            or "display: none" in values.get("style", "").replace("display:none", "display: none")
        )
        # V2: <div data-testid="markdown-display">; V1: <article class="markdown-renderer
        # artifact-data-markdown">
        markdown = markdown or (
            values.get("data-testid") == "markdown-display"
            or "artifact-data-markdown" in values.get("class", "").split()
        )
        if tag == "a" and "href" in values:
            self.hrefs.append(values["href"])
        if tag == "img" and markdown and not hidden:
            self.markdown_images.append(values.get("src", ""))
        if tag not in self.VOID:
            self._stack.append((tag, hidden, markdown))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self._stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._stack) - 1, -1, -1):  # tolerate unclosed tags
            if self._stack[index][0] == tag:
                del self._stack[index:]
                return

    def handle_data(self, data: str) -> None:
        hidden, markdown = self._state()
        if hidden:
            return
        self.text.append(data)
        if markdown:
            self.markdown_text.append(data)

    @property
    def visible(self) -> str:
        return " ".join(" ".join(self.text).split())

    @property
    def markdown(self) -> str:
        return " ".join(" ".join(self.markdown_text).split())


def read_page(url: str, screenshot: str) -> _Page:
    page = _Page()
    page.feed(render(url, screenshot=screenshot, height=1600, budget_ms=15_000))
    page.close()
    return page


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Prefect server with its UI, this process's clients pointed at it, a registry and
    a published environment installed into a folder on sys.path (not the venv)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("browser")
    with serve_stack(root) as stack, pytest.MonkeyPatch.context() as patch:
        patch.setenv("VFOPS_DATABASE_URL", stack["env"]["VFOPS_DATABASE_URL"])
        patch.setenv("VFOPS_ARTIFACTS", (root / "artifacts").as_uri())
        patch.setenv("VFOPS_HOME", str(root / "vfops-home"))
        patch.delenv("OPENAI_API_KEY", raising=False)
        package = init_environment(ENV, root / "src")
        publish_environment(package)
        site = root / "site"
        install_published(f"{ENV}@latest", target=site, no_deps=True)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        try:
            with temporary_settings(updates={PREFECT_API_URL: stack["api"]}):
                yield stack
        finally:
            sys.path.remove(str(site))
    dispose_engines()


async def _artifacts(flow_run_id: str) -> list[Any]:
    """Every artifact of a flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        return list(
            await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)])
                )
            )
        )


def _endpoints(root: Path, stub: StubServer) -> Path:
    path = root / "endpoints.toml"
    path.write_text(
        f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
    )
    return path


def run_sweep(served: dict[str, Any]) -> str:
    """Run an eval sweep; returns its flow run id."""
    from vfops.flows.eval_sweep import eval_sweep
    from vfops.sweeps import SweepSpec

    with StubServer(StubConfig(reply_mode=answer_with(0.7, seed=1))) as stub:
        spec = SweepSpec(
            environments=[f"{ENV}@latest"],
            endpoints=["stub"],
            endpoints_file=str(_endpoints(served["root"], stub)),
            sampling=[{"name": "cold", "args": {"temperature": 0.0}}, {"name": "warm"}],
            num_examples=N,
            rollouts_per_example=R,
            output_dir=str(served["root"] / "sweep-out"),
        )
        state = eval_sweep(spec=spec, return_state=True)
    assert state.is_completed(), state.message
    return str(state.state_details.flow_run_id)


def run_nights(served: dict[str, Any]) -> str:
    """Run two nights; returns the second night's flow run id."""
    from vfops.flows.nightly import NightlyConfig, nightly_eval

    for night, seed in (("2026-11-01", 2), ("2026-11-02", 3)):
        with StubServer(StubConfig(reply_mode=answer_with(0.7, seed=seed))) as stub:
            config = NightlyConfig(
                environments=[ENV],
                endpoints=["stub"],
                endpoints_file=str(_endpoints(served["root"], stub)),
                num_examples=N,
                rollouts_per_example=R,
                date=night,
            )
            state = asyncio.run(nightly_eval(config, return_state=True))
    assert state.is_completed(), state.message
    comparisons = state.result()
    assert comparisons[0]["previous_run_id"] is not None  # the second night compared
    return str(state.state_details.flow_run_id)


UIS = {"v1": "", "v2": "/v2"}
"""Where each Prefect UI is served: V1 at the root, V2 (the default for a new browser)
under /v2."""


def _problems(page: _Page, where: str, *, report: str | None = None) -> list[str]:
    """What is wrong with a rendered page (``report``: the heading of the markdown report
    it shows)."""
    found = []
    mailto = [href for href in page.hrefs if href.startswith("mailto:")]
    if mailto:
        found.append(f"{where}: mailto: links {mailto}")
    if "data:image" in page.visible:
        at = page.visible.index("data:image")
        found.append(f"{where}: a data: URL as text: ...{page.visible[at - 40 : at + 60]}...")
    if report is not None:
        if report not in page.markdown:  # the UI rendered the markdown, not a loading page
            found.append(f"{where}: no rendered report {report!r}: {page.visible[:300]}")
        elif VERSION_TEXT not in page.markdown:
            found.append(f"{where}: {VERSION_TEXT} is not in the text: {page.markdown[:400]}")
        if not any(src.startswith("data:image/png;base64,") for src in page.markdown_images):
            found.append(f"{where}: no chart image in the report")
    return found


def test_reports_render_without_mailto_links_with_their_charts(served: dict[str, Any]) -> None:
    """Every artifact page of a sweep and of a night, in both UIs."""
    runs = {"sweep": run_sweep(served), "night": run_nights(served)}
    root = served["api"].removesuffix("/api")
    headings = {
        "eval-sweep-report": "Eval sweep",
        "nightly-eval-report": "Nightly regression check for 2026-11-02",
    }
    artifacts = {name: asyncio.run(_artifacts(run_id)) for name, run_id in runs.items()}
    keys = {artifact.key for listed in artifacts.values() for artifact in listed}
    assert set(headings) | {"eval-sweep-results", "nightly-eval-cells"} <= keys
    problems: list[str] = []  # every page is checked: one run shows everything wrong
    for ui, base in UIS.items():
        for listed in artifacts.values():
            for artifact in listed:
                where = f"{artifact.key} ({artifact.type}, {ui} UI)"
                page = read_page(
                    f"{root}{base}/artifacts/artifact/{artifact.id}", f"{artifact.key}-{ui}.png"
                )
                problems += _problems(page, where, report=headings.get(artifact.key))
                if artifact.type == "table" and not (
                    "stub" in page.visible and "0.1.0" in page.visible
                ):
                    problems.append(f"{where}: no table rows: {page.visible[:300]}")
    assert not problems, "\n".join(problems)
