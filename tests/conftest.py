"""Shared fixtures: the repo root, Hydra composition of conf/, the materialised SmolLM2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# the cores this session started with, before an xdist worker keeps to its share of them
SESSION_CORES = (
    sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
)
_THREAD_VARS = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")


def _keep_to(cores: list[int]) -> None:
    """This process, and every process it starts, on ``cores``: torch's OpenMP pool sizes itself
    from the affinity mask and vllm-cpu binds its threads to VLLM_CPU_OMP_THREADS_BIND."""
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores)) if len(cores) > 1 else f"{cores[0]}-{cores[0]}"
    if "torch" in sys.modules:  # a plugin imported it first: its pool was sized for every core
        sys.modules["torch"].set_num_threads(len(cores))


def _under_xdist() -> bool:
    return os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and hasattr(os, "sched_setaffinity")


if _under_xdist() and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # worker i keeps to every n-th core: without it each worker's threads spin on every core and
    # two workers take longer together than one alone
    _count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    _keep_to(SESSION_CORES[int(os.environ["PYTEST_XDIST_WORKER"][2:]) % _count :: _count] or SESSION_CORES)


@pytest.fixture
def whole_machine():
    """Every core the session started with, for one test that needs more than its worker's share
    (a vLLM engine at tensor parallel 2); the share back after it."""
    if not hasattr(os, "sched_setaffinity"):
        yield SESSION_CORES
        return
    own, saved = sorted(os.sched_getaffinity(0)), {k: os.environ.get(k) for k in _THREAD_VARS}
    _keep_to(SESSION_CORES)
    try:
        yield SESSION_CORES
    finally:
        _keep_to(own)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def pytest_collection_modifyitems(config, items):
    """Under xdist, modules with a vLLM engine first, then the other slow ones, then the rest, each
    module's own order kept: a worker takes a module whole (--dist loadscope), and the longest
    modules started first leave short ones, not one engine, to fill the end of the run."""
    if not _under_xdist():
        return
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        marks = {m.name for m in item.iter_markers()}
        here = 0 if "vllm" in marks else 1 if "slow" in marks else 2 if "/integration/" in module else 3
        rank[module] = min(rank.get(module, 3), here)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a module's order kept


_RUNS: list[Path] = []  # this process's root of compose's fallback run dirs, once made


def _fallback_run_dir() -> str:
    """A fresh run dir under a root of this process's in the clone's .cache/, removed when the
    process exits (and, if it was killed, by the next one): none is left in /tmp."""
    import atexit
    import shutil
    import tempfile

    from eagle3.util.atomic import pid_alive

    if not _RUNS:
        base = CACHE / "test-runs"
        base.mkdir(parents=True, exist_ok=True)
        for old in base.glob("compose-*-*"):  # of a test process killed before its exit
            pid = old.name.split("-")[1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        _RUNS.append(Path(tempfile.mkdtemp(prefix=f"compose-{os.getpid()}-", dir=base)))
        atexit.register(shutil.rmtree, _RUNS[0], True)
    return tempfile.mkdtemp(prefix="eagle3-run-", dir=_RUNS[0])


def compose(config_name: str = "train", overrides: list[str] | None = None, output_dir: str | None = None):
    """Compose conf/ exactly as the entrypoints do (schemas registered, no run).
    Outside a Hydra run there is no run dir: output_dir stands in for it, and holds the run's
    record of machine rates (paths.machine_rates) unless the overrides name one."""
    overrides = list(overrides or [])
    run_dir = output_dir or _fallback_run_dir()
    overrides.append(f"paths.output_dir={run_dir}")
    # a budget plans from the rates earlier runs recorded: each composition reads its own record
    # (none: the table) unless a test names one, so no plan depends on the tests that ran before
    if not any(o.startswith("paths.machine_rates=") for o in overrides):
        overrides.append(f"paths.machine_rates={run_dir}/machine_rates.json")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from eagle3.stages.compose import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=False)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from eagle3.target_model.resolve import materialize_smollm2

    return Path(materialize_smollm2(CACHE))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """experiment=tiny_test's target (tiny random Llama, SmolLM2's tokenizer), materialised in the
    clone's .cache/ once."""
    from helpers import TINY

    from eagle3.target_model.resolve import resolve_target

    return Path(resolve_target(compose("extract", TINY).model, CACHE))


@pytest.fixture(scope="session")
def datasets_dir(tmp_path_factory) -> Path:
    """A paths.datasets_dir holding experiment=tiny_test's dataset, extracted once a session. Tests
    read it (a training may add a draft vocabulary of another size, built from its token counts:
    the same whichever test adds it); a test that changes a dataset extracts its own."""
    from helpers import TINY

    from eagle3.stages.extract import run as extract

    d = tmp_path_factory.mktemp("data")
    extract(compose("extract", TINY + [f"paths.datasets_dir={d}"]))
    return d


@pytest.fixture(scope="session")
def reference_dataset(tmp_path_factory) -> Path:
    """The dataset of an uninterrupted extraction of helpers.faults.ARGS (one sample per forward:
    a resumed or repaired dataset equals it byte for byte), extracted once a session. Tests
    compare with it, train on it, or damage a copy of it (helpers.faults.copy_dataset)."""
    from helpers.faults import ARGS

    from eagle3.stages.extract import run as extract

    root = tmp_path_factory.mktemp("reference")
    return Path(extract(compose("extract", ARGS + [f"paths.datasets_dir={root}"])))


@pytest.fixture(scope="session")
def tiny_run_dir(datasets_dir, tmp_path_factory) -> Path:
    """train.py's run dir of experiment=tiny_test (6 steps) on datasets_dir, trained once a session:
    summary.json, checkpoints/, export/. Tests read it; one that writes into an export copies it."""
    from helpers import TINY

    from eagle3.stages.train import run as train

    out = tmp_path_factory.mktemp("tiny-run")
    train(compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"], output_dir=str(out)))
    return out
