"""Hydra composition of conf/: every preset composes, typos and wrong types fail at compose."""

from __future__ import annotations

import pytest
from conftest import ROOT, compose
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from eagle3.config.errors import ConfigError
from eagle3.stages.compose import machine_overrides, register_evaluate_config, register_polish_config
from eagle3.stages.validate import validate_run_config

GROUPS = ["model", "topology", "sizes", "layers", "data", "capture", "train", "logger", "experiment", "debug"]
NEEDS_PATH = {("model", "hf"), ("data", "jsonl"), ("data", "hf_disk")}
# presets the default capture=hf cannot run, refused at validation naming the route that can:
# Kimi-K2.5's INT4 weights (model.quantization=compressed_tensors) run in vLLM only
NEEDS_VLLM = {("model", "kimi_k2_5")}


# presets of another entrypoint: composed by it, in place of train.py's and extract.py's
OWN_ENTRY = {("experiment", "smollm2_polish"): "polish"}


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("entry", ["train", "extract"])
@pytest.mark.parametrize("group,preset", [(g, p) for g in GROUPS for p in presets(g)])
def test_every_preset_composes_and_resolves(entry, group, preset):
    if (group, preset) in OWN_ENTRY:
        register_polish_config()
        entry = OWN_ENTRY[(group, preset)]
    overrides = [f"{group}={preset}"]
    if (group, preset) in NEEDS_PATH:
        # a path to resolve against: the model facts come from its config.json
        overrides.append(f"{group}.path={ROOT / 'tests' / 'assets' / 'hf_model'}")
    cfg = compose(entry, overrides)
    OmegaConf.resolve(cfg)
    assert cfg.task_name == entry
    if (group, preset) in NEEDS_VLLM:
        with pytest.raises(ConfigError, match=r"with capture=hf: .*Use capture=vllm"):
            validate_run_config(cfg)
    elif not (group == "topology" and preset == "gpu8_tp8"):
        validate_run_config(cfg)


def test_layer_defaults_smollm2_and_kimi():
    cfg = compose("extract")
    assert list(cfg.layers.aux_layer_ids) == [2, 15, 27]
    assert list(cfg.layers.layer_ids) == [2, 15, 27, 30]
    kimi = compose("extract", ["model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm"])
    assert list(kimi.layers.aux_layer_ids) == [2, 30, 58]
    assert list(kimi.layers.layer_ids) == [2, 30, 58, 61]
    assert kimi.topology.extract_tp == 8 and kimi.model.hidden_size == 7168
    assert kimi.capture.dtype == "bfloat16"  # INT4 weights never become the hidden-state dtype
    validate_run_config(kimi)


CPU_SIZES = {
    "data.max_samples": 800,
    "data.max_length": 384,
    "train.max_steps": 800,
    "train.max_tokens_per_batch": 1024,
    "train.lr": 2e-3,
    "eval.max_new_tokens": 64,
}
GPU_SIZES = {
    "data.max_samples": 2000,
    "data.max_length": 2048,
    "train.max_steps": 1000,
    "train.max_tokens_per_batch": 8192,
    "train.lr": 1e-3,
    "eval.max_new_tokens": 128,
}


def _sizes(cfg) -> dict:
    return {k: OmegaConf.select(cfg, k) for k in CPU_SIZES}


def _as_run(entry: str, args: list[str], gpus: int) -> DictConfig:
    """Compose as `python <entry>.py <args>` does on a machine with ``gpus`` GPUs."""
    return compose(entry, args + machine_overrides(args, ROOT / "conf", gpus=gpus))


@pytest.mark.parametrize("entry", ["train", "extract"])
def test_the_machine_picks_topology_and_sizes_and_presets_and_keys_win(entry, capsys):
    """No flags: topology=cpu with the CPU sizes where no GPU answers, topology=gpu1 with the GPU
    sizes where one does (printed); a topology, sizes=..., an experiment preset, debug=fast and a
    key on the command line each win over it. A topology sets devices and precision only."""
    assert compose(entry).sizes == "cpu" and _sizes(_as_run(entry, [], gpus=0)) == CPU_SIZES
    on_gpu = _as_run(entry, [], gpus=8)
    assert on_gpu.topology.accelerator == "gpu" and on_gpu.topology.devices == 1
    assert on_gpu.sizes == "gpu" and _sizes(on_gpu) == GPU_SIZES
    said = capsys.readouterr().err
    assert "8 GPU(s) answered: topology=gpu1" in said and "topology=gpu8_tp8 for all 8" in said
    assert _as_run(entry, ["topology=cpu"], gpus=1).topology.accelerator == "cpu"
    assert _sizes(_as_run(entry, ["topology=cpu"], gpus=1)) == CPU_SIZES
    assert _sizes(_as_run(entry, ["topology=cpu_ddp2"], gpus=0)) == CPU_SIZES
    for gpu, n in (("gpu1", 1), ("gpu2_tp2", 2), ("gpu4_tp4", 4), ("gpu8_tp8", 8)):
        cfg = _as_run(entry, [f"topology={gpu}"], gpus=0)  # composing a GPU config on a CPU machine
        assert cfg.sizes == "gpu" and _sizes(cfg) == GPU_SIZES, gpu
        assert (cfg.topology.devices, cfg.topology.extract_tp, cfg.topology.extract_dp) == (n, n, 1), gpu
        # the topology alone (composed without the entrypoint's overrides) leaves the sizes be
        assert compose(entry, [f"topology={gpu}"]).sizes == "cpu", gpu
    assert _sizes(_as_run(entry, ["topology=gpu1", "sizes=cpu"], gpus=1)) == CPU_SIZES
    assert _sizes(compose(entry, ["sizes=gpu"])) == GPU_SIZES
    assert _as_run(entry, ["train.max_steps=7"], gpus=1).train.max_steps == 7

    full = _as_run(entry, ["experiment=smollm2_full"], gpus=0)  # a GPU preset: its own sizes over sizes=gpu
    assert full.sizes == "gpu" and (full.train.max_steps, full.train.max_tokens_per_batch, full.data.max_length) == (
        8800,
        8192,
        1024,
    )
    assert full.head.norm_before_fc and full.head.norm_output and full.train.ttt_steps == 3
    assert compose(entry, ["debug=fast"]).train.max_steps == 10
    demo = compose(entry, ["experiment=demo_cpu"])  # the CPU default, pinned: its samples sized by 20 minutes
    assert _sizes(demo) == {**CPU_SIZES, "data.max_samples": None} and demo.time_budget.minutes == 20
    assert not demo.data.regenerate and demo.tags == ["demo_cpu"]
    assert (
        _as_run(entry, ["data=jsonl", "data.path=x.jsonl", "topology=gpu1"], gpus=1).data.max_samples is None
    )  # all of a file


@pytest.mark.parametrize("args", [[], ["experiment=smollm2_budget"], ["head=compact"], ["head.num_draft_layers=2"]])
def test_the_same_command_builds_the_same_head_on_a_cpu_and_a_gpu(args):
    """The head is the head group's alone: the sizes the machine picks (sizes=gpu where a GPU
    answers) change run sizes, never the architecture vLLM will build, nor the draft vocabulary
    the dataset is extracted with; a user's pick changes it on both alike."""
    from eagle3.training.builder import draft_config

    hf = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    hf |= {"vocab_size": 49152, "model_type": "llama"}
    on_cpu, on_gpu = _as_run("train", args, gpus=0), _as_run("train", args, gpus=1)
    if not any(a.startswith("experiment=") for a in args):  # a recipe may pin its own sizes
        assert (on_cpu.sizes, on_gpu.sizes) == ("cpu", "gpu")
    assert OmegaConf.to_container(on_cpu.head) == OmegaConf.to_container(on_gpu.head)
    assert draft_config(on_cpu.head, hf, 3) == draft_config(on_gpu.head, hf, 3)
    assert _as_run("extract", args, gpus=0).head == _as_run("extract", args, gpus=1).head
    default = compose("train")
    assert default.head.draft_vocab_size == 32000 and default.head.norm_before_fc  # conf/head/eagle3.yaml
    assert compose("train", ["experiment=demo_cpu"]).head.draft_vocab_size == 4096  # the CPU demo's pick


@pytest.mark.parametrize("entry", ["train", "extract"])
def test_the_composed_config_names_the_sizes_and_why(entry):
    """`sizes` names the preset that supplied the sizes and `sizes_source` whether it matches the
    topology's accelerator; sizes=cpu on a GPU topology is honoured and says so; a preset's value
    wins over its sizes preset's."""
    cpu = compose(entry)
    assert (cpu.sizes, cpu.sizes_source) == ("cpu", "topology.accelerator=cpu")
    gpu = _as_run(entry, ["topology=gpu1"], gpus=1)
    assert (gpu.sizes, gpu.sizes_source) == ("gpu", "topology.accelerator=gpu")
    picked = compose(entry, ["sizes=cpu", "topology=gpu1"])
    assert picked.topology.accelerator == "gpu" and _sizes(picked) == CPU_SIZES
    assert (picked.sizes, picked.sizes_source) == ("cpu", "sizes=cpu picked over topology.accelerator=gpu")
    validate_run_config(picked)
    tiny = compose(entry, ["experiment=tiny_test"])  # its overrides of sizes=cpu win
    assert tiny.sizes == "cpu" and (tiny.train.lr, tiny.train.max_steps, tiny.data.max_length) == (3e-4, 6, 128)
    full = compose(entry, ["experiment=smollm2_full"])  # the preset picks sizes=gpu, its steps win
    assert (full.sizes, full.sizes_source, full.train.max_steps) == ("gpu", "topology.accelerator=gpu", 8800)
    assert full.train.lr == GPU_SIZES["train.lr"]  # the budget's, not repeated by the preset


def test_the_run_sizes_have_no_schema_default():
    """Only a sizes preset (or the command line) sizes a run: without one the stage stops naming the keys."""
    from eagle3.config.training import TrainConfig

    assert OmegaConf.is_missing(OmegaConf.structured(TrainConfig), "lr")
    cfg = compose("train", ["~sizes"])
    with pytest.raises(ConfigError, match="train.lr.*conf/sizes"):
        validate_run_config(cfg)


def test_typo_in_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException) as e:
        compose("train", ["train.lrr=1"])
    assert "lrr" in str(e.value.__cause__ or e.value)


def test_wrong_type_fails_naming_key():
    with pytest.raises(ConfigCompositionException) as e:
        compose("train", ["model.num_layers=abc"])
    msg = str(e.value.__cause__ or e.value)
    assert "num_layers" in msg and "abc" in msg


def test_wrong_enum_fails():
    with pytest.raises(ConfigCompositionException) as e:
        compose("train", ["data.overflow=chop"])
    assert "overflow" in str(e.value.__cause__ or e.value)


@pytest.mark.parametrize(
    "ids,needle",
    [
        ("[3,15,31]", "out of range"),
        ("[15,3,27]", "ascending"),
        ("[3,3,27]", "unique"),
        ("[]", "at least 1"),
        ("[0,15]", "out of range"),
    ],
)
def test_bad_layer_ids_fail_clearly(ids, needle):
    cfg = compose("extract", [f"layers.aux_ids={ids}"])
    with pytest.raises(InterpolationResolutionError) as e:
        list(cfg.layers.layer_ids)
    assert needle in str(e.value) and "layers.aux_ids" in str(e.value)


@pytest.mark.parametrize("ids,numbering", [("[2,15,30]", "vllm"), ("[30]", "vllm"), ("[1,14,29]", "output_of_layer")])
def test_aux_id_n_is_refused_not_absorbed(ids, numbering):
    """N (= model.num_layers, 30 for SmolLM2) is always captured as the training target: among the
    aux ids it used to be dropped without a word (the head then read one layer fewer than asked)."""
    cfg = compose("extract", [f"layers.aux_ids={ids}", f"layers.numbering={numbering}"])
    with pytest.raises(InterpolationResolutionError) as e:
        list(cfg.layers.layer_ids)
    msg = str(e.value)
    assert "layers.aux_ids: id 30 (= model.num_layers" in msg and "expected ids in 1..29" in msg
    assert "always captured as the training target" in msg


def test_aux_and_final_refuses_n_and_shallow_models_have_no_default():
    from eagle3.target_model.layer_ids import LayerIdError, aux_and_final, default_aux_ids, validate_aux_ids

    assert aux_and_final([2, 15, 27], 30) == [2, 15, 27, 30]
    with pytest.raises(LayerIdError, match=r"contain 30 .* expected aux ids in 1\.\.29"):
        aux_and_final([2, 15, 30], 30)
    assert validate_aux_ids(default_aux_ids(4), 4) == [1, 2, 3]
    assert validate_aux_ids(default_aux_ids(2), 2) == [1]
    with pytest.raises(LayerIdError, match=r"model.num_layers=1: no aux layer id exists"):
        default_aux_ids(1)


def test_explicit_ids_and_output_of_layer_numbering():
    cfg = compose("extract", ["layers.aux_ids=[3,15,26]"])
    assert list(cfg.layers.layer_ids) == [3, 15, 26, 30]
    # SpecForge/EAGLE "output of layer j" ids are vLLM ids j+1
    cfg = compose("extract", ["layers.aux_ids=[1,14,26]", "layers.numbering=output_of_layer"])
    assert list(cfg.layers.aux_layer_ids) == [2, 15, 27]


def test_topology_that_does_not_fit_fails():
    cfg = compose("extract", ["topology=gpu1", "topology.extract_tp=2"])
    with pytest.raises(ConfigError, match="extract_tp x extract_dp"):
        validate_run_config(cfg)


def test_optimized_metric_must_be_a_validation_metric_the_run_logs():
    validate_run_config(compose("train", []))  # the default: val/replay_accept_len at K=3
    with pytest.raises(ConfigError, match=r"optimized_metric: expected a validation metric .* got 'train/loss'"):
        validate_run_config(compose("train", ["optimized_metric=train/loss"]))
    with pytest.raises(ConfigError, match=r"the replay needs eval.num_draft_tokens >= 1 \(its K\), got 0"):
        validate_run_config(compose("train", ["eval.num_draft_tokens=0"]))
    validate_run_config(compose("train", ["eval.num_draft_tokens=0", "optimized_metric=val/sim_accept_len"]))


@pytest.mark.parametrize("key", ["num_workers", "read_ahead"])
def test_a_negative_loader_setting_is_refused_at_compose_by_name(key):
    validate_run_config(compose("train", [f"train.{key}=0"]))
    with pytest.raises(ConfigError, match=rf"train.{key}: expected >= 0, got -1"):
        validate_run_config(compose("train", [f"train.{key}=-1"]))


def test_model_hf_reads_facts_from_config_json():
    path = ROOT / "tests" / "assets" / "hf_model"
    cfg = compose("extract", ["model=hf", f"model.path={path}"])
    assert cfg.model.num_layers == 4 and cfg.model.hidden_size == 64
    assert cfg.model.architecture == "LlamaForCausalLM"
    assert list(cfg.layers.layer_ids) == [1, 2, 3, 4]


def test_the_vllm_capture_route_follows_the_accelerator():
    assert compose("extract", ["capture=vllm"]).capture.vllm_route == "native_host_copy"  # the CPU build
    assert compose("extract", ["capture=vllm", "topology=gpu1"]).capture.vllm_route == "native"
    assert compose("extract", ["capture=vllm", "capture.vllm_route=auto"]).capture.vllm_route == "auto"


def test_engine_keys_are_the_same_in_train_and_evaluate():
    # one key for one switch: engine.enforce_eager reaches both CLIs' engines; eval.* has none
    register_evaluate_config()
    for entry, extra in (("train", []), ("evaluate", ["export_dir=unused"])):
        assert compose(entry, extra + ["engine.enforce_eager=true"]).engine.enforce_eager is True
        with pytest.raises(ConfigCompositionException, match="enforce_eager"):
            compose(entry, extra + ["eval.enforce_eager=true"])
    # train.py's engines follow the run's own groups unless engine.* says otherwise
    cfg = compose("train", ["topology=gpu8_tp8", "model.trust_remote_code=true", "capture.cpu_kvcache_space_gb=7"])
    assert cfg.engine.tensor_parallel_size == cfg.topology.extract_tp == 8
    assert cfg.engine.gpu_memory_utilization == cfg.capture.gpu_memory_utilization
    assert cfg.engine.cpu_kvcache_space_gb == 7 and cfg.engine.trust_remote_code is True
    assert compose("train", ["topology=gpu8_tp8", "engine.tensor_parallel_size=2"]).engine.tensor_parallel_size == 2
    assert compose("train", ["experiment=smollm2_budget"]).engine.enforce_eager is True


def test_the_datasets_folder_is_paths_datasets_dir():
    # the `data` group is the chat data; where the hidden-state datasets go is paths.datasets_dir
    assert compose("train", ["paths.datasets_dir=/tmp/ds"]).paths.datasets_dir == "/tmp/ds"
    assert str(compose("extract", []).paths.datasets_dir).endswith("/data")  # the folder on disk stays data/
    with pytest.raises(ConfigCompositionException, match="data_dir"):
        compose("train", ["paths.data_dir=/tmp/ds"])


def test_draft_layers_below_one_fail_naming_the_key():
    validate_run_config(compose("train", ["head.num_draft_layers=2"]))
    with pytest.raises(ConfigError, match=r"head.num_draft_layers: expected >= 1, got 0"):
        validate_run_config(compose("train", ["head.num_draft_layers=0"]))


def test_norm_options_are_head_keys_losses_train_keys_and_exclusive_norms_fail_before_any_work():
    cfg = compose(
        "train",
        ["head.norm_before_fc=false", "head.fc_norm=true", "head.norm_output=true", "head.norm_before_residual=true"]
        + ["train.loss=jsd"],
    )
    validate_run_config(cfg)
    assert cfg.head.fc_norm and cfg.head.norm_output and cfg.head.norm_before_residual and not cfg.head.norm_before_fc
    for kind in ("reverse_kl", "tv"):
        assert str(compose("train", [f"train.loss={kind}"]).train.loss.value) == kind
    with pytest.raises(ConfigError, match="head: norm_before_fc and fc_norm are mutually exclusive"):
        validate_run_config(compose("train", ["head.norm_before_fc=true", "head.fc_norm=true"]))
