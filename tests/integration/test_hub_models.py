"""`model=hf model.path=<hub id>`: facts at compose time, the snapshot at materialisation, a
pinned `model.revision`, offline errors, and `model.trust_remote_code` reaching transformers.

The hub is a temporary HF cache in the hub's own layout (models--org--name/snapshots/<commit>,
refs/<branch or tag>) holding real tiny models, read with HF_HUB_OFFLINE=1: nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CACHE, compose
from helpers import add_hub_snapshot
from omegaconf.errors import InterpolationResolutionError

from eagle3.target_model.hub import HubError, resolve_model_dir
from eagle3.target_model.resolve import materialize_tiny, resolve_target

MAIN, V2, REMOTE = "a" * 40, "b" * 40, "c" * 40
REPO, REMOTE_REPO = "my-org/tiny-llama", "my-org/tiny-remote"


def _remote_code_model(src: Path, dst: Path) -> Path:
    """tiny_llama's weights behind a config that names its own code (auto_map), as a hub repo
    with custom modelling code is laid out: transformers runs it only with trust_remote_code."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = "tiny_remote"
    cfg["auto_map"] = {
        "AutoConfig": "configuration_tinyremote.TinyRemoteConfig",
        "AutoModel": "modeling_tinyremote.TinyRemoteModel",
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "configuration_tinyremote.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass TinyRemoteConfig(LlamaConfig):\n    model_type = 'tiny_remote'\n"
    )
    (dst / "modeling_tinyremote.py").write_text(
        "from transformers import LlamaModel\n\nfrom .configuration_tinyremote import TinyRemoteConfig\n\n\n"
        "class TinyRemoteModel(LlamaModel):\n    config_class = TinyRemoteConfig\n"
    )
    return dst


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> dict[str, Path]:
    """my-org/tiny-llama: main = tiny_llama (4 layers), tag v2 = the same preset with 2 layers;
    my-org/tiny-remote: a model with custom code."""
    root = tmp_path_factory.mktemp("hf")
    hub = root / "hub"
    four = materialize_tiny(compose("extract", ["model=tiny_llama"]).model, CACHE)
    two = materialize_tiny(compose("extract", ["model=tiny_llama", "model.num_layers=2"]).model, root / "build")
    return {
        "hub": hub,
        "main": add_hub_snapshot(hub, REPO, MAIN, four, ("main",)),
        "v2": add_hub_snapshot(hub, REPO, V2, two, ("v2",)),
        "remote": add_hub_snapshot(hub, REMOTE_REPO, REMOTE, _remote_code_model(four, root / "remote"), ("main",)),
    }


@pytest.fixture
def offline_hub(hub_cache, monkeypatch) -> dict[str, Path]:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache["hub"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_hub_id_facts_at_compose_time_and_snapshot_at_materialisation(offline_hub, tmp_path):
    cfg = compose("extract", ["model=hf", f"model.path={REPO}"])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.vocab_size) == (4, 64, 49152)
    assert cfg.model.architecture == "LlamaForCausalLM"
    assert list(cfg.layers.layer_ids) == [1, 2, 3, 4]  # tiny_llama N=4: [1, 2, 3] + 4
    assert resolve_target(cfg.model, tmp_path) == str(offline_hub["main"])
    # the export names the target by its hub id, never this machine's snapshot directory
    from eagle3.training.builder import target_name

    assert target_name(compose("train", ["model=hf", f"model.path={REPO}"]).model, str(offline_hub["main"])) == REPO


@pytest.mark.parametrize("revision", ["v2", V2])
def test_revision_selects_another_snapshot(offline_hub, tmp_path, revision):
    cfg = compose("extract", ["model=hf", f"model.path={REPO}", f"model.revision={revision}"])
    assert cfg.model.num_layers == 2 and list(cfg.layers.layer_ids) == [1, 2]  # facts of that snapshot
    assert resolve_target(cfg.model, tmp_path) == str(offline_hub["v2"])


def test_hub_errors_name_the_id_revision_and_the_remedy(offline_hub, tmp_path):
    cfg = compose("extract", ["model=hf", "model.path=my-org/absent"])
    with pytest.raises(
        InterpolationResolutionError,
        match=r"my-org/absent.*revision main.*HF_HUB_OFFLINE=1.*"
        r"run once online.*hf download my-org/absent",
    ):
        _ = cfg.model.num_layers
    with pytest.raises(
        HubError,
        match=r"model.path='my-org/absent' \(revision main\) is not in the hub cache " + str(offline_hub["hub"]),
    ):
        resolve_model_dir("my-org/absent")
    bad_rev = compose("extract", ["model=hf", f"model.path={REPO}", "model.revision=v9"])
    with pytest.raises(
        HubError, match=r"'my-org/tiny-llama' \(revision v9\).*hf download my-org/tiny-llama --revision v9"
    ):
        resolve_target(bad_rev.model, tmp_path)
    with pytest.raises(HubError, match=r"is a local directory, but model.revision='v2' pins a hub revision"):
        resolve_model_dir(str(offline_hub["main"]), "v2")
    with pytest.raises(HubError, match=r"model.path='\./no/such/dir': no such directory, and not a hub id"):
        resolve_model_dir("./no/such/dir")


def test_trust_remote_code_reaches_transformers(offline_hub, tmp_path):
    """A hub model with its own code loads only with model.trust_remote_code=true."""
    from eagle3.target_model.backend import make_backend

    cfg = compose("extract", ["model=hf", f"model.path={REMOTE_REPO}", "capture=hf"])
    target_dir = resolve_target(cfg.model, tmp_path)
    assert target_dir == str(offline_hub["remote"])

    def backend_for(trust_remote_code: bool):
        return make_backend(
            cfg.capture, cfg.topology, target_dir, [1, 2, 3, 4], torch.bfloat16, 64, trust_remote_code=trust_remote_code
        )

    with pytest.raises(ValueError, match="trust_remote_code=True"):
        backend_for(cfg.model.trust_remote_code)
    cfg.model.trust_remote_code = True
    backend = backend_for(cfg.model.trust_remote_code)
    try:
        assert type(backend.model).__name__ == "TinyRemoteModel"  # the repository's class, not transformers'
        (record,) = backend.capture([("s0", torch.arange(1, 9), torch.ones(8, dtype=torch.bool))])
        assert tuple(record.hidden.shape) == (8, 4, 64)  # 8 tokens x 4 captured layers x hidden 64
    finally:
        backend.close()
