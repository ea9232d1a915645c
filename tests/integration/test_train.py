"""train.py on a real extracted dataset (tiny random Llama target, real ShareGPT data):
summary, export, checkpoints, exact resume, W&B offline files."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose
from helpers import TINY
from safetensors.torch import load_file

from eagle3.extraction.identity import DatasetNotFound
from eagle3.stages.train import run as train


def _train(datasets_dir: Path, out: Path, extra: list[str] = ()) -> float:
    return train(compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"] + list(extra), output_dir=str(out)))


def test_the_summary_keeps_the_train_figures_when_a_last_validation_runs(datasets_dir, tmp_path):
    """5 steps with validation every 3: train.py validates once more after fit, which resets
    Lightning's metrics; summary.json still holds the last train/* figures (tokens/s, loss)."""
    _train(datasets_dir, tmp_path, ["train.max_steps=5"])
    final = json.loads((tmp_path / "summary.json").read_text())["final"]
    assert {"train/loss_k0", "train/tokens_per_s", "val/replay_accept_len"} <= set(final)
    assert final["train/tokens_per_s"] > 0


def test_train_writes_summary_export_and_checkpoints(datasets_dir, tmp_path, caplog):
    with caplog.at_level("INFO", logger="eagle3.util.report"):
        metric = _train(datasets_dir, tmp_path)
    # the step path in one log line; the checkpoint records it in place of auto/null
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step path: ")]
    assert line.startswith("step path: cpu, ") and ", sdpa, eager, variable shape, " in line
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 6
    assert metric == pytest.approx(summary["final"]["val/replay_accept_len"])  # the default optimized_metric
    assert summary["best_metric"] == "val/replay_accept_len" and summary["best_metric_value"] >= 1.0
    for k in range(2):  # ttt_steps=2 in tiny_test
        assert f"val/acc_k{k}" in summary["final"] and f"train/loss_k{k}" in summary["final"]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    export = Path(summary["export_dir"])
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3DraftModel"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # tiny_llama N=4: [1,2,3] + 4
    assert cfg["draft_vocab_size"] == 2048
    weights = load_file(str(export / "model.safetensors"))
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["fc.weight"].shape == (64, 3 * 64)
    assert weights["d2t"].shape == (2048,) and weights["t2d"].shape == (49152,)
    assert int(weights["t2d"].sum()) == 2048
    assert not any(k.startswith(("target_", "embed_tokens")) for k in weights)
    # frozen target copies are not stored in checkpoints
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert not any("embed_tokens" in k or "target_lm_head" in k for k in ckpt["state_dict"])
    assert all(v.dtype != torch.bfloat16 for v in ckpt["state_dict"].values())  # fp32 resume state
    recorded = ckpt["hyper_parameters"]["train_cfg"]
    assert (recorded["attention"], recorded["compile"]) == ("sdpa", False)


def test_two_draft_layers_train_export_and_reload(datasets_dir, tmp_path):
    """head.num_draft_layers=2: the export declares two layers and holds the second one's
    weights (no hidden_norm: it sees the hidden stream only); the evaluation loader rebuilds
    the same head from it (same logits as the exported weights give)."""
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head

    _train(datasets_dir, tmp_path, ["head.num_draft_layers=2"])
    export = Path(json.loads((tmp_path / "summary.json").read_text())["export_dir"])
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    weights = load_file(str(export / "model.safetensors"))
    second = {k for k in weights if k.startswith("layers.1.")}
    assert "layers.1.self_attn.q_proj.weight" in second and "layers.1.mlp.down_proj.weight" in second
    assert not any("hidden_norm" in k for k in second)
    assert weights["layers.1.self_attn.q_proj.weight"].shape[1] == 64  # H, not 2H (tiny_llama H=64)
    head, aux_layer_ids = load_exported_head(export, cfg["speculators_config"]["verifier"]["name_or_path"])
    assert len(head.layers) == 2 and aux_layer_ids == [1, 2, 3]
    assert torch.equal(head.layers[1].mlp.down_proj.weight, weights["layers.1.mlp.down_proj.weight"].float())


def test_norm_options_and_a_divergence_loss_train_export_and_reload(datasets_dir, tmp_path):
    """head.fc_norm / norm_output / norm_before_residual reach the head, the export declares
    them and holds the trained fc_norm weights, and the evaluation loader rebuilds that head;
    train.loss=jsd trains (a bounded loss, below log 2 per position)."""
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head

    norms = {"fc_norm": True, "norm_output": True, "norm_before_residual": True}
    _train(datasets_dir, tmp_path, [f"head.{k}=true" for k in norms] + ["train.loss=jsd"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.0 < summary["final"]["val/loss_k0"] < 0.7 and summary["final"]["val/loss"] < summary["initial"]["val/loss"]
    export = Path(summary["export_dir"])
    cfg = json.loads((export / "config.json").read_text())
    assert {k: cfg[k] for k in (*norms, "norm_before_fc")} == {**norms, "norm_before_fc": False}
    weights = load_file(str(export / "model.safetensors"))
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(weights) and "input_norm.weight" not in weights
    # trained (the fp32 checkpoint: 6 small steps move it less than bf16's spacing near 1)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert not torch.equal(ckpt["state_dict"]["head.fc_norm.0.weight"], torch.ones(64))
    head, _ = load_exported_head(export, cfg["speculators_config"]["verifier"]["name_or_path"])
    assert head.cfg.norm_options == {**norms, "norm_before_fc": False}
    assert torch.equal(head.fc_norm[2].weight, weights["fc_norm.2.weight"].float())


def test_export_cli_reproduces_the_export(datasets_dir, tmp_path):
    import subprocess
    import sys

    _train(datasets_dir, tmp_path)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    out = subprocess.run(
        [sys.executable, str(ROOT / "export.py"), f"ckpt={ckpt}", f"out={tmp_path / 'cli_export'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(tmp_path / "cli_export")
    from_cli = load_file(str(tmp_path / "cli_export" / "model.safetensors"))
    # the run exported its best checkpoint; re-export that one for an exact comparison
    summary = json.loads((tmp_path / "summary.json").read_text())
    from eagle3.serving.export_dir import write_export
    from eagle3.training.checkpoint_io import checkpoint_head

    best = write_export(*checkpoint_head(summary["best_checkpoint"]), tmp_path / "best_export").directory
    ref = load_file(str(Path(summary["export_dir"]) / "model.safetensors"))
    again = load_file(str(best / "model.safetensors"))
    assert from_cli.keys() == ref.keys() == again.keys()
    for k in ref:
        assert torch.equal(again[k], ref[k]), k
    cfg_cli = json.loads((tmp_path / "cli_export" / "config.json").read_text())
    assert cfg_cli == json.loads((Path(summary["export_dir"]) / "config.json").read_text())


@pytest.mark.parametrize("total", [6, 16])
def test_resume_equals_uninterrupted(datasets_dir, tmp_path, total):
    """`total` steps in one go == 3 steps, then resume from last.ckpt for the rest. 16 steps
    cross several passes over the data after resuming mid-pass (a bug this guards: every pass after a
    resume was cut to the first pass's remainder, so the resumed run trained on other batches
    and restarted its loader every few steps)."""
    common = ["train.val_check_interval=3", "train.warmup_steps=2", f"train.lr_decay_steps={total}"]
    _train(datasets_dir, tmp_path / "straight", common + [f"train.max_steps={total}"])
    _train(datasets_dir, tmp_path / "split", common + ["train.max_steps=3"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(
            datasets_dir, tmp_path / "split", common + [f"train.max_steps={total}"]
        )  # auto-resume in the same run dir
    # Lightning's "resuming ... before the epoch ended ... unreliable results" does not apply: filtered
    assert not [w for w in caught if "before the epoch ended" in str(w.message)]
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert a["global_step"] == b["global_step"] == total
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][k], v, rtol=1e-5, atol=1e-6, msg=k)
    sa, sb = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert sa.keys() == sb.keys()
    for p in sa:
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sb[p][key], sa[p][key], rtol=1e-5, atol=1e-7)


def test_missing_dataset_says_run_extract(tmp_path):
    with pytest.raises(DatasetNotFound, match="run extract.py"):
        _train(tmp_path / "empty", tmp_path / "out")


def test_wandb_offline_run_records_metrics(datasets_dir, tmp_path):
    from helpers.wandb_offline import read_run

    _train(datasets_dir, tmp_path, ["logger=wandb", "logger.mode=offline", "logger.log_every_n_steps=1"])
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    run = read_run(runs[0], wait_for="val/sim_accept_len")
    train_rows = [r for r in run["history"] if "train/loss_k0" in r]
    assert len(train_rows) == 6  # one row per optimizer step
    assert all("train/acc_k1" in r and "train/tokens_per_s" in r for r in train_rows)
    # from the second step on (the first has no previous step to wait after), a fraction
    assert all(0.0 <= r["train/data_wait_frac"] < 1.0 for r in train_rows[1:])
    val_rows = [r for r in run["history"] if "val/sim_accept_len" in r]
    assert len(val_rows) >= 2 and all(r["val/sim_accept_len"] >= 1.0 for r in val_rows)
    assert "initial/val/acc_k0" in run["summary"] and "val/sim_accept_len" in run["summary"]
    assert all(1.0 <= r["val/replay_accept_len"] <= 3.0 and r["val/replay_rounds"] > 0 for r in val_rows)
    assert run["config"]["train"]["ttt_steps"] == 2 and run["config"]["model"]["name"] == "tiny_llama"
    assert "model:tiny_llama" in run["tags"] and "data:sharegpt" in run["tags"]


def test_flex_attention_is_refused_where_it_cannot_train(datasets_dir, tmp_path):
    """train.attention=flex needs CUDA (no FlexAttention backward on CPU) and 128-token tiles:
    both are clear errors before any step, naming the field."""
    with pytest.raises(
        ValueError, match="train.max_tokens_per_batch: expected a multiple of 128 with train.attention=flex, got 500"
    ):
        _train(datasets_dir, tmp_path / "a", ["train.attention=flex", "train.max_tokens_per_batch=500"])
    if not torch.cuda.is_available():
        with pytest.raises(
            ValueError, match="train.attention=flex: expected a CUDA accelerator, got topology.accelerator=cpu"
        ):
            _train(datasets_dir, tmp_path / "b", ["train.attention=flex"])


@pytest.mark.parametrize("topology,attention,compiled", [("cpu", "sdpa", False), ("gpu1", "flex", True)])
def test_the_step_path_follows_the_accelerator(topology, attention, compiled):
    """Without flags, a GPU topology trains the compiled flex-attention step (the fastest
    measured) and the CPU the eager dense-mask step, each in bf16 autocast where the hardware
    has bf16 matmuls; explicit values are kept. The config itself is left as composed."""
    from eagle3.training.step_path import cpu_has_native_bf16, resolve_step_path

    cfg = compose("train", TINY + [f"topology={topology}"])
    assert str(cfg.train.attention.value) == "auto" and cfg.train.compile is None
    path = resolve_step_path(cfg.train, cfg.topology)
    assert (path.attention.value, path.compile) == (attention, compiled)
    assert str(cfg.train.attention.value) == "auto" and cfg.train.compile is None
    # bf16 autocast where matmuls run natively in bf16 (the GPU; this CPU if it has avx512_bf16)
    native = topology == "gpu1" or cpu_has_native_bf16()
    assert path.precision == ("bf16-mixed" if native else "32-true")
    # a compiled step and flex both pad rows to one shape; flex packs one row per batch
    assert path.fixed_shape == compiled and path.row_tokens is None
    assert path.line().startswith(
        f"step path: {'cuda' if topology == 'gpu1' else 'cpu'}, {path.precision}, {attention}"
    )
    explicit = ["train.attention=sdpa", "train.compile=false", "topology.precision=32-true", "train.row_tokens=256"]
    cfg = compose("train", TINY + [f"topology={topology}"] + explicit)
    path = resolve_step_path(cfg.train, cfg.topology)
    assert (path.attention.value, path.compile, path.precision) == ("sdpa", False, "32-true")
    assert (path.fixed_shape, path.row_tokens) == (False, 256)
    # a batch flex cannot tile falls back to sdpa on auto, and is refused when flex is asked for
    cfg = compose("train", TINY + [f"topology={topology}", "train.max_tokens_per_batch=500"])
    path = resolve_step_path(cfg.train, cfg.topology)
    assert path.attention.value == "sdpa"
    assert ("not a multiple of 128" in path.line()) == (topology == "gpu1")


def test_compiled_step_on_fixed_shape_rows_trains(datasets_dir, tmp_path):
    """train.compile=true: rows padded to max_tokens_per_batch, one static graph; the run
    learns (val sim accept above the random start) and logs the same keys."""
    _train(datasets_dir, tmp_path, ["train.compile=true", "train.max_steps=12", "train.val_check_interval=12"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 12
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]
    assert summary["final"]["train/compiled_graphs"] == 1  # one static shape: no recompile after step 1


def test_replay_export_reads_the_export_back(datasets_dir, tmp_path):
    """eagle3.evaluation.diagnostics.head_replay rebuilds the head from the export alone (bf16 weights,
    frozen parts from the target) and measures what training measured for that checkpoint."""
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head, train_side_figures

    _train(datasets_dir, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    export = Path(summary["export_dir"])
    target = json.loads((export / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    head, aux_layer_ids = load_exported_head(export, target)
    assert aux_layer_ids == [1, 2, 3]
    fig = train_side_figures(head, summary["dataset_dir"], num_draft_tokens=2, max_answer_tokens=128)
    # the export is the best checkpoint by val/replay_accept_len (K = min(3 draft tokens, TTT 2),
    # answers cut at eval.max_new_tokens=128 as in training), in bf16
    assert fig["replay_accept_len"] == pytest.approx(summary["best_metric_value"], abs=0.02)
    assert 1.0 <= fig["replay_accept_len"] <= 3.0 and fig["replay_rounds"] > 0
    # the Hydra CLI: the same figures from keys (target from the export), written to out=
    cli = _replay_export_cli(
        f"export_dir={export}",
        f"dataset_dir={summary['dataset_dir']}",
        "num_draft_tokens=2",
        f"out={tmp_path / 'r.json'}",
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads((tmp_path / "r.json").read_text()) == pytest.approx(fig)
    assert "replay_accept_len" in cli.stdout
    with pytest.raises(ValueError, match="does not fit the head"):
        cfg = json.loads((export / "config.json").read_text())
        cfg["transformer_layer_config"]["intermediate_size"] += 1
        bad = tmp_path / "bad_export"
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps(cfg))
        (bad / "model.safetensors").write_bytes((export / "model.safetensors").read_bytes())
        load_exported_head(bad, target)


def _replay_export_cli(*overrides: str):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "eagle3.stages.replay_export", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_replay_export_cli_names_missing_and_wrong_keys():
    missing = _replay_export_cli("export_dir=/nowhere")
    assert missing.returncode != 0 and "missing required key(s) dataset_dir" in missing.stderr
    wrong = _replay_export_cli("export_dir=/nowhere", "dataset_dir=/nowhere", "split=train")
    assert wrong.returncode != 0 and "expected one of [val, all]" in wrong.stderr
    assert "full_key: split" in wrong.stderr


def test_evaluate_replays_the_val_prompts_it_served(datasets_dir, tmp_path):
    """evaluate's train-side line: the same val samples, first answers only; a dataset
    without shards here (a manifest copied from a GPU machine) is skipped with a note."""
    from eagle3.evaluation.diagnostics.head_replay import replay_for_prompts
    from eagle3.store import HiddenStateDataset

    _train(datasets_dir, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    export = Path(summary["export_dir"])
    target = json.loads((export / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    ds = HiddenStateDataset(summary["dataset_dir"])
    ids = [ds.sample_id(i) for i in ds.val_indices()[:3]]
    fig, note = replay_for_prompts(
        export, target, summary["dataset_dir"], ids, num_draft_tokens=2, max_answer_tokens=16
    )
    assert note is None and fig["samples"] == 3 and 1.0 <= fig["replay_accept_len"] <= 3.0
    # at most one round per 1 + accepted tokens of the first 16 answer tokens, per sample
    assert 0 < fig["replay_rounds"] <= 3 * 16
    manifest_only = tmp_path / "manifest_only"
    manifest_only.mkdir()
    (manifest_only / "manifest.json").write_text((Path(summary["dataset_dir"]) / "manifest.json").read_text())
    fig, note = replay_for_prompts(export, target, manifest_only, ids, num_draft_tokens=2, max_answer_tokens=16)
    assert fig is None and "no shards here" in note
    with pytest.raises(ValueError, match="1 of 1 sample ids not in the dataset"):
        replay_for_prompts(
            export, target, summary["dataset_dir"], ["no-such-id"], num_draft_tokens=2, max_answer_tokens=16
        )


def test_rows_train_and_a_row_shorter_than_a_sample_is_refused(datasets_dir, tmp_path):
    """train.row_tokens: batches of several packed rows train (same metrics keys, export);
    a row that would cut samples is an error naming the field, before any step."""
    _train(datasets_dir, tmp_path / "rows", ["train.row_tokens=128"])
    summary = json.loads((tmp_path / "rows" / "summary.json").read_text())
    assert summary["global_step"] == 6 and summary["final"]["val/tokens"] > 0
    # before the first step the head is the same: rows change no validation loss or count
    _train(datasets_dir, tmp_path / "one")
    one = json.loads((tmp_path / "one" / "summary.json").read_text())["initial"]
    assert summary["initial"]["val/tokens"] == one["val/tokens"]
    assert summary["initial"]["val/loss_k0"] == pytest.approx(one["val/loss_k0"], rel=1e-4)
    with pytest.raises(ValueError, match=r"train.row_tokens=32: shorter than the longest sample"):
        _train(datasets_dir, tmp_path / "short", ["train.row_tokens=32"])


def test_dataset_dir_trains_on_a_moved_dataset_and_refuses_one_of_other_layers(datasets_dir, tmp_path):
    """dataset_dir= takes a dataset from anywhere (copied from another machine: not under
    paths.datasets_dir, so the fingerprint lookup finds nothing); one captured with other layers
    than this config trains on is refused before any step."""
    import shutil

    (source,) = [p.parent for p in datasets_dir.glob("*/manifest.json")]
    moved = shutil.copytree(source, tmp_path / "elsewhere" / "my_dataset")
    empty = tmp_path / "no_datasets_here"
    with pytest.raises(DatasetNotFound, match="pass dataset_dir="):
        train(compose("train", TINY + [f"paths.datasets_dir={empty}"], output_dir=str(tmp_path / "a")))
    train(
        compose("train", TINY + [f"paths.datasets_dir={empty}", f"dataset_dir={moved}"], output_dir=str(tmp_path / "b"))
    )
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["dataset_dir"] == str(moved.resolve()) and summary["global_step"] == 6
    with pytest.raises(ValueError, match=r"holds layers \[1, 2, 3, 4\] .* expects layers \[1, 2, 4\]"):
        train(compose("train", TINY + [f"dataset_dir={moved}", "layers.aux_ids=[1,2]"], output_dir=str(tmp_path / "c")))


def test_the_export_names_the_target_as_the_serving_machine_knows_it(datasets_dir, tmp_path, capsys):
    """config.json names the target by export.target_name_or_path (or the preset's hub id),
    not this machine's cache directory; evaluation here still finds the local copy the run
    read (summary.json), and train.py prints the vllm serve command."""
    from eagle3.evaluation.export_info import read_export
    from eagle3.training.builder import target_name

    _train(datasets_dir, tmp_path, ["export.target_name_or_path=my-org/tiny-llama"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    export = Path(summary["export_dir"])
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "my-org/tiny-llama"
    assert read_export(export).target == str(Path(summary["target_dir"]).resolve())
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == str(export)
    assert any(
        line.startswith("serve it: vllm serve my-org/tiny-llama --speculative-config ")
        and f'"model": "{export}"' in line
        for line in out
    )
    # the embedded default is named by its hub id; a tiny random preset, which no hub has, by its directory
    assert target_name(compose("train", []).model, "/cache/x") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert target_name(compose("train", TINY).model, "/cache/tiny") == "/cache/tiny"
    assert target_name(compose("train", ["model=hf", "model.path=org/name"]).model, "/hub/cache/snap") == "org/name"
    assert target_name(compose("train", TINY).model, "/cache/tiny", "my-org/tiny-llama") == "my-org/tiny-llama"


def test_trainer_arguments_reach_lightning_and_early_stopping_ends_the_run(datasets_dir, tmp_path):
    """trainer.* goes to L.Trainer (limit_val_batches=1: one validation batch of the several);
    callbacks.early_stopping stops on optimized_metric and still exports the best checkpoint;
    callbacks.model_checkpoint keeps the top k; callbacks.extra adds a callback by class path."""
    _train(datasets_dir, tmp_path / "full", ["train.max_steps=3"])
    _train(datasets_dir, tmp_path / "one", ["train.max_steps=3", "trainer.limit_val_batches=1"])
    tokens = [json.loads((tmp_path / r / "summary.json").read_text())["final"]["val/tokens"] for r in ("full", "one")]
    assert 0 < tokens[1] < tokens[0], tokens
    # an improvement of 100 in the replay is impossible: stops after patience + 1 validations
    _train(
        datasets_dir,
        tmp_path / "es",
        [
            "train.max_steps=30",
            "train.val_check_interval=3",
            "callbacks.early_stopping.patience=1",
            "callbacks.early_stopping.min_delta=100",
            "callbacks.model_checkpoint.save_top_k=2",
            "+callbacks.extra.timer._target_=lightning.pytorch.callbacks.Timer",
            "+callbacks.extra.timer.interval=step",
        ],
    )
    summary = json.loads((tmp_path / "es" / "summary.json").read_text())
    assert summary["global_step"] == 6 and Path(summary["export_dir"], "model.safetensors").is_file()
    assert len(list((tmp_path / "es" / "checkpoints").glob("best-step*.ckpt"))) == 2  # top 2 of the 3 validations
    with pytest.raises(
        ValueError,
        match=r"callbacks.model_checkpoint.save_top_k: expected >= 1 \(the exported head "
        r"is the best checkpoint by val/replay_accept_len\), got 0",
    ):
        _train(datasets_dir, tmp_path / "k0", ["callbacks.model_checkpoint.save_top_k=0"])
    with pytest.raises(ValueError, match="callbacks.extra.bad: expected a Lightning Callback, got Counter"):
        _train(datasets_dir, tmp_path / "x", ["+callbacks.extra.bad._target_=collections.Counter"])
    with pytest.raises(Exception, match="gradient_clip_val"):  # its home is train.grad_clip
        _train(datasets_dir, tmp_path / "bad", ["trainer.gradient_clip_val=1.0"])


def test_the_best_metric_is_printed_with_its_measured_error_against_vllm():
    from eagle3.draft.replay import MEASURED_AGAINST_VLLM
    from eagle3.stages.train import best_metric_line

    replay = MEASURED_AGAINST_VLLM["val/replay_accept_len"]
    line = best_metric_line("val/replay_accept_len", 1.5)
    assert line is not None and line.startswith("best val/replay_accept_len: 1.500 (against vLLM")
    assert f"over {replay.heads} heads" in line and f"{replay.mean_error:+.3f} on average" in line
    # where the errors were measured, and each head measured beyond that range with its own error
    low, high = replay.vllm_range
    assert f"measuring {low:.2f}-{high:.2f}" in line and replay.beyond
    for measured, error in replay.beyond:
        assert f"{measured:.2f} (error {error:+.2f})" in line
    assert best_metric_line("val/loss", 2.0) == "best val/loss: 2.000"  # nothing measured for it
    assert best_metric_line("val/replay_accept_len", None) is None  # no validation ran
