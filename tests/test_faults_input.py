"""Faults in what an environment package gives vfops (issue 25, items 7 and 8), through the
real CLI as tests/test_bad_input.py runs it.

The environments live in a module written, with its ``.dist-info``, into a folder on
``PYTHONPATH`` (what ``pip install --target`` leaves, without a build): their
``vfops.environments`` entry points are found as any installed package's are. Refusals are
checked like test_bad_input's cases (one ``error:`` line matching the case, a non-zero
exit, no run recorded, nothing written); the rest run real evals against the stub server
and read back what each store recorded.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.registry_fixtures import DIALECTS, database_url, stored_rollouts
from tests.test_bad_input import ARITHMETIC, Case, package_with, vfops
from tests.test_bad_input import test_bad_input_is_one_line_and_leaves_nothing as check_case
from vfops.testing import StubConfig, StubServer

FAULT_ENVS = '''
"""Environments that load, fail to load or carry text as the fault probes found."""

from __future__ import annotations

import vfops


def correct(completion, answer, parser):
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


def echo(rows):
    """The stub's echo_answer mode replies <answer>x</answer> to 'ANSWER_HINT: x'."""
    parser = vfops.XMLParser(["answer"])
    rubric = vfops.Rubric(funcs=[correct], parser=parser)
    return vfops.SingleTurnEnv(eval_dataset=rows, parser=parser, rubric=rubric)


def load_named(name="nobody", num_examples=2):
    # an environment argument called like the loader's own first parameter
    return echo([{"question": f"Say {name}.\\nANSWER_HINT: {name}", "answer": name}] * num_examples)


def load_surrogate():
    # lone surrogates in the prompt, a text column (task) and info: no UTF-8 encodes them
    row = {"question": "what is \\ud800?\\nANSWER_HINT: 1", "answer": "1",
           "task": "t\\udc80", "info": {"note": "\\udfff"}}
    return echo([row])


def load_lazy():
    def download():  # built on first use, after load_environment returned
        raise ConnectionError("Couldn't reach 'org/data' on the Hub")

    return echo(download)


def load_missing_module():
    import vfops_test_no_such_module  # noqa: F401

    return echo([])


def load_offline(dataset_path="org/data", num_examples=2):
    raise OSError(f"Couldn't reach '{dataset_path}' on the Hub\\n(a second line)")


def load_network_down():
    import httpx

    raise httpx.ConnectError("[Errno 111] Connection refused")


def load_buggy():
    return {}["oops"]
'''

BROKEN_IMPORT = (
    "import vfops_test_missing_dependency  # noqa: F401\n\ndef load_environment(): ...\n"
)

ENTRY_POINTS = """[vfops.environments]
fault_named = fault_envs:load_named
fault_surrogate = fault_envs:load_surrogate
fault_lazy = fault_envs:load_lazy
fault_missing_module = fault_envs:load_missing_module
fault_offline = fault_envs:load_offline
fault_network_down = fault_envs:load_network_down
fault_buggy = fault_envs:load_buggy
fault_broken_import = fault_envs_broken:load_environment
"""

ARITHMETIC_PARAMETERS = (
    "num_examples, num_train_examples, difficulty, max_operand, ops, seed, max_tokens, "
    "system_prompt"
)


def ev(env: str, *more: str) -> tuple[str, ...]:
    return ("eval", env, "-m", "stub-model", "-b", "{stub}", "-o", "{tmp}/out", "-q", *more)


def with_version(version: str) -> str:
    """arithmetic's pyproject.toml with ``version``."""
    text = (ARITHMETIC / "pyproject.toml").read_text()
    assert 'version = "0.1.0"' in text
    return text.replace('version = "0.1.0"', f'version = "{version}"')


CASES = [
    # ------------------------------------------------- 7a: an env arg called "name"
    Case("env-arg-name-not-taken", ev("arithmetic", "-a", '{"name": "x"}'),
         r"^error: load_environment of 'arithmetic' raised TypeError: .*unexpected keyword "
         r"argument 'name'; check --env-args against its load_environment signature "
         rf"\(it accepts: {ARITHMETIC_PARAMETERS}\)$"),
    # ------------------------------------------------- 7c: a dataset built lazily
    Case("lazy-dataset-fails", ev("fault_lazy"),
         r"^error: the eval dataset of environment 'fault_lazy' could not be built: "
         r"ConnectionError: Couldn't reach 'org/data' on the Hub; a dataset or file it needs "
         r"could not be read \(offline\? pass a local path via --env-args if the environment "
         r"takes one\)$"),
    # ------------------------------------------------- 7d: each kind its own fix
    Case("env-arg-unknown", ev("arithmetic", "-a", '{"nope": 1}'),
         r"unexpected keyword argument 'nope'; check --env-args against its load_environment "
         rf"signature \(it accepts: {ARITHMETIC_PARAMETERS}\)$"),
    Case("env-arg-wrong-type", ev("arithmetic", "-a", '{"num_examples": "many"}'),
         rf"raised TypeError: .*; check the values in --env-args \(it accepts: "
         rf"{ARITHMETIC_PARAMETERS}\)$"),
    Case("env-missing-module", ev("fault_missing_module"),
         r"raised ModuleNotFoundError: No module named 'vfops_test_no_such_module'; install "
         r"the missing module 'vfops_test_no_such_module' \(pip install the package that "
         r"provides it, or reinstall the environment package with its dependencies\)$"),
    Case("env-module-does-not-import", ev("fault_broken_import"),
         r"^error: environment 'fault_broken_import' failed to import: ModuleNotFoundError: "
         r".*; install the missing module 'vfops_test_missing_dependency'"),
    Case("env-dataset-offline", ev("fault_offline"),
         r"raised OSError: Couldn't reach 'org/data' on the Hub; a dataset or file it needs "
         r"could not be read \(offline\? pass a local path via --env-args, e\.g\. "
         r"dataset_path\)$"),
    Case("env-network-library-error", ev("fault_network_down"),
         r"raised ConnectError: \[Errno 111\] Connection refused; a dataset or file it needs "
         r"could not be read"),
    Case("env-bug", ev("fault_buggy"),
         r"^error: load_environment of 'fault_buggy' raised KeyError: 'oops'; fix the "
         r"environment package$"),
    # ------------------------------------------------- 8: versions are PEP 440
    Case("publish-version-not-pep440", ("env", "publish", "{tmp}/pkg"),
         r"pyproject\.toml: version '0\.1\.x' is not a valid PEP 440 version; "
         r'set e\.g\. version = "0\.1\.0"$', package_with(with_version("0.1.x"))),
    Case("publish-version-prerelease", ("env", "publish", "{tmp}/pkg"),
         r"pyproject\.toml: version '0\.1\.0rc1' is not a plain MAJOR\.MINOR\.PATCH; "
         r'set e\.g\. version = "0\.1\.0"$', package_with(with_version("0.1.0rc1"))),
]  # fmt: skip


@pytest.fixture(scope="module")
def fault_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fault environments, "installed" into a folder for PYTHONPATH."""
    site = tmp_path_factory.mktemp("fault-site")
    (site / "fault_envs.py").write_text(FAULT_ENVS)
    (site / "fault_envs_broken.py").write_text(BROKEN_IMPORT)
    dist_info = site / "vfops_fault_envs-0.0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vfops-fault-envs\nVersion: 0.0.1\nRequires-Dist: vfops\n"
    )
    (dist_info / "entry_points.txt").write_text(ENTRY_POINTS)
    (dist_info / "top_level.txt").write_text("fault_envs\nfault_envs_broken\n")
    return site


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_fault_is_one_line_and_leaves_nothing(
    case: Case, tmp_path: Path, stub: StubServer, fault_site: Path
) -> None:
    check_case(dataclasses.replace(case, env={"PYTHONPATH": str(fault_site)}), tmp_path, stub)


def test_an_env_arg_called_name_reaches_a_loader_that_takes_it(
    tmp_path: Path, stub: StubServer, fault_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["eval", "fault_named", "-a", '{"name": "zed"}', "-m", "stub-model", "-r", "1",
            "-b", stub.base_url, "-o", str(tmp_path / "out"), "-q"]  # fmt: skip
    proc = vfops(args, tmp_path, {"PYTHONPATH": str(fault_site)})
    assert proc.returncode == 0, proc.stderr
    (results,) = (tmp_path / "out").glob("evals/*/*/results.jsonl")
    rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    assert [row["prompt"][-1]["content"] for row in rows] == ["Say zed.\nANSWER_HINT: zed"] * 2
    assert [row["reward"] for row in rows] == [1.0, 1.0]
    (metadata,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    assert orjson.loads(metadata.read_bytes())["env_args"] == {"name": "zed"}

    # the Python API too: the environment's name is positional, every keyword its argument
    monkeypatch.syspath_prepend(str(fault_site))
    from vfops import load_environment

    env = load_environment("fault_named", name="ada", num_examples=1)
    (example,) = env.iter_eval_examples()
    assert example.prompt[-1]["content"] == "Say ada.\nANSWER_HINT: ada"


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def test_unencodable_text_is_recorded_escaped_in_every_store(
    tmp_path: Path, stub: StubServer, fault_site: Path, db_url: str
) -> None:
    """Lone surrogates in a dataset (prompt, task, info) do not fail the run: each store
    records them as their literal escape, and the model is asked and scores normally."""
    args = ["eval", "fault_surrogate", "-m", "stub-model", "-b", stub.base_url, "-r", "1",
            "-o", str(tmp_path / "out"), "-q"]  # fmt: skip
    extra = {"PYTHONPATH": str(fault_site), "VFOPS_DATABASE_URL": db_url}
    proc = vfops(args, tmp_path, extra)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    prompt = "what is \\ud800?\nANSWER_HINT: 1"  # the six characters \ud800, not a surrogate
    expected = {"prompt": prompt, "task": "t\\udc80", "info": {"note": "\\udfff"}, "reward": 1.0}

    def seen(prompt: object, task: str, info: object, reward: float | None) -> dict[str, object]:
        assert isinstance(prompt, list)
        return {"prompt": prompt[-1]["content"], "task": task, "info": info, "reward": reward}

    (line,) = (run_dir / "results.jsonl").read_bytes().splitlines()
    row = orjson.loads(line)
    assert seen(row["prompt"], row["task"], row["info"], row["reward"]) == expected

    import pyarrow as pa

    with pa.OSFile(str(run_dir / "rollouts.arrow")) as source:
        (arrow,) = pa.ipc.open_stream(source).read_all().to_pylist()
    loads = orjson.loads
    assert seen(loads(arrow["prompt"]), arrow["task"], loads(arrow["info"]), arrow["reward"]) == (
        expected
    )

    from vfops.registry import dispose_engines, get_engine, get_run, session_scope

    engine = get_engine(db_url)
    metadata = orjson.loads((run_dir / "metadata.json").read_bytes())
    (stored,) = stored_rollouts(engine, metadata["run_id"])
    assert seen(stored.prompt, stored.task, stored.info, stored.reward) == expected
    with session_scope(engine, write=False) as session:
        run = get_run(session, metadata["run_id"])
        assert run is not None and run.status == "completed"
    dispose_engines()
    assert metadata["status"] == "completed" and metadata["summary"]["rollouts"] == 1


def test_a_verifiers_env_gets_the_fix_of_its_own_signature(
    tmp_path: Path, stub: StubServer
) -> None:
    """The adapter names the package's parameters, not those of verifiers' loader (which
    wraps the package's error in a RuntimeError of its own)."""
    args = [arg.replace("{stub}", stub.base_url).replace("{tmp}", str(tmp_path))
            for arg in ev("vf_xml_math", "-a", '{"num_examples": "many"}')]  # fmt: skip
    proc = vfops(args, tmp_path, {})
    assert proc.returncode == 2, proc.stderr
    # the environment's own warning comes first (verifiers' XMLParser on its 'think'
    # field); verifiers' log of the failure is not shown: vfops's line says it, last
    assert "Failed to load environment" not in proc.stderr, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert re.fullmatch(
        r"error: load_environment of verifiers environment 'vf_xml_math' raised TypeError: "
        r".*; check the values in --env-args \(it accepts: num_examples, seed, system_prompt, "
        r"\*\*kwargs\)",
        last,
    ), last
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_json_column_of_the_registry_keeps_unencodable_text_escaped(db_url: str) -> None:
    """A run's JSON columns (env args, sampling args) go through the same escaping."""
    from vfops.registry import (
        NewRun,
        create_run,
        dispose_engines,
        get_engine,
        get_run,
        session_scope,
    )

    engine = get_engine(db_url)
    with session_scope(engine) as session:
        run_id = create_run(
            session,
            NewRun(
                environment_name="arithmetic",
                environment_version="0.1.0",
                environment_content_hash="0" * 64,
                model="stub-model",
                num_examples=1,
                rollouts_per_example=1,
                config_fingerprint="f" * 64,
                sampling_args={"stop": ["\ud800"]},
                env_args={"topic": "t\udcff"},
            ),
        ).id
    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id)
        assert run is not None
        assert (run.sampling_args, run.env_args) == ({"stop": ["\\ud800"]}, {"topic": "t\\udcff"})
    dispose_engines()


def test_metadata_json_keeps_unencodable_text_escaped(tmp_path: Path) -> None:
    from vfops.evaluation._store import read_metadata, write_metadata

    write_metadata(tmp_path, {"env_args": {"topic": "t\udcff"}, "model": "m"})
    assert read_metadata(tmp_path) == {"env_args": {"topic": "t\\udcff"}, "model": "m"}
