"""The model card every export carries (eagle3/serving/model_card.py, its training record in
eagle3_meta.json) and push_to_hub (eagle3/serving/hub_push.py), on a real tiny training (a tiny
random Llama target, real ShareGPT samples): the card holds the export's own figures and its
serve command and parses as a Hub card; a new measurement rewrites it; a push without a token or
a network is refused before any work. evaluate.py rewriting the card with what vLLM measured:
integration/vllm/test_evaluate_vllm.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose
from helpers.cards import card_row, card_text

from eagle3.evaluation.figures import Figures, PromptOutcome
from eagle3.evaluation.report import AcceptanceReport, write_json
from eagle3.serving.advice import from_measurements, head_sha256
from eagle3.serving.hub_push import HubPushError, upload_paths
from eagle3.serving.model_card import card_text
from eagle3.serving.serve_command import export_serving_lines
from eagle3.stages.evaluate import refresh_card
from eagle3.stages.extract import run as extract
from eagle3.stages.train import run as train

TINY = ["experiment=tiny_test"]
CAP = 32  # max_new_tokens of the acceptance reports written below


@pytest.fixture(scope="module")
def run_dir(tiny_run_dir) -> Path:
    return tiny_run_dir


@pytest.fixture
def export(run_dir, tmp_path) -> Path:
    """A copy of the trained export (tests below write measurements into it)."""
    return Path(shutil.copytree(run_dir / "export", tmp_path / "export"))


def test_the_card_of_a_trained_export_holds_its_figures_and_serve_command(run_dir):
    from huggingface_hub import ModelCard, metadata_load

    export = run_dir / "export"
    card, summary = card_text(export), json.loads((run_dir / "summary.json").read_text())
    manifest = json.loads((run_dir / "dataset_manifest.json").read_text())
    meta = ModelCard.load(export / "README.md").data.to_dict()
    assert meta == metadata_load(export / "README.md")
    assert meta["library_name"] == "speculators"
    assert {"eagle3", "speculative-decoding", "speculators"} <= set(meta["tags"])
    # the serve command train.py printed, whole
    command = export_serving_lines(export)[0].removeprefix("serve it: ")
    assert f"```bash\n{command}\n```" in card and f'"model": "{export}"' in command
    config = json.loads((export / "config.json").read_text())
    assert card_row(card, "aux layer ids (vLLM numbering)")[1] == str(config["eagle_aux_hidden_state_layer_ids"])
    assert card_row(card, "draft vocabulary")[1] == "2048 of 49152 target tokens"
    weights = manifest["fingerprint_inputs"]["model"]["weights"]["model.safetensors"]
    assert weights in card_row(card, "target revision or weights hash")[1]
    assert card_row(card, "samples")[1].startswith(f"{manifest['num_samples']} ({len(manifest['val_ids'])} of them")
    assert card_row(card, "tokens")[1].startswith(f"{manifest['num_tokens']} ({manifest['num_loss_tokens']} of them")
    assert card_row(card, "answers")[1].startswith("as in the chat data")
    # the run: steps, the checkpoint exported (the best one, at its own step), minutes, machine
    assert card_row(card, "steps")[1] == str(summary["global_step"]) == "6"
    best = Path(summary["best_checkpoint"])
    assert card_row(card, "exported checkpoint")[1] == f"`{best.name}`, at step {best.stem.removeprefix('best-step')}"
    assert summary["fit_seconds"] > 0 and card_row(card, "training minutes")[1] == f"{summary['fit_seconds'] / 60:.1f}"
    assert card_row(card, "machine")[1].startswith(f"1 x {summary['machine']['device_name']} (cpu, ")
    # nothing measured in vLLM yet (tiny_test: eval.enabled=false): the card shows no such figure
    assert "## Acceptance in vLLM\n\nNot measured yet for these weights" in card
    assert "## Serving speed-up\n\nNot measured yet for these weights" in card
    assert re.search(r"\d\.\d\dx", card) is None


def test_the_card_names_each_source_of_a_mixture_with_its_samples(tmp_path):
    chats = tmp_path / "chats.jsonl"
    turns = [f"Question {i}: what is {i} plus {i}?" for i in range(30)]
    chats.write_text(
        "".join(json.dumps({"id": f"c{i}", "messages": _chat(q, f"{2 * i}.")}) + "\n" for i, q in enumerate(turns))
    )
    mixture = (
        f"data.mixture=[{{name: share, source: sharegpt, weight: 3}}, {{name: mine, source: jsonl, path: {chats}}}]"
    )
    overrides = TINY + [f"paths.datasets_dir={tmp_path / 'data'}", mixture]
    extract(compose("extract", overrides))
    train(compose("train", overrides, output_dir=str(tmp_path / "run")))
    manifest = json.loads((tmp_path / "run" / "dataset_manifest.json").read_text())
    counts = manifest["provenance"]["mixture"]
    sources = card_row(card_text(tmp_path / "run" / "export"), "sources")[1]
    assert "share: sharegpt (file_name: `ShareGPT_V3_unfiltered_cleaned_split.json`" in sources
    assert "mine: jsonl (file_name: `chats.jsonl`" in sources
    for name in ("share", "mine"):
        assert f"{counts[name]['samples']} samples ({counts[name]['val']} held out)" in sources
    assert counts["share"]["samples"] + counts["mine"]["samples"] == manifest["num_samples"]


def _chat(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def _figures(length: float, rates: list[float], prompts: int) -> Figures:
    return Figures(
        prompts, 3, length, sum(rates) / 3, rates, 100, 300, round(300 * sum(rates) / 3), [], 400, 10.0, 40.0,
        eval_engines_tok_s_ratio=1.49,  # the evaluation engines' ratio: never on the card
    )  # fmt: skip


def _measure(export: Path, length: float) -> Path:
    """acceptance.json as evaluate.py writes it (the report's own writer): two prompt sets, one
    answer of each ending at EOS and one cut at CAP tokens."""
    rates = [round(length - 1 - 0.3, 3), 0.2, 0.1]
    outcomes = [
        PromptOutcome(source, f"{source}{i}", 12, tokens, length, None, None)
        for source in ("val", "humaneval")
        for i, tokens in enumerate((CAP - 7, CAP))
    ]
    report = AcceptanceReport(
        str(export),
        "tiny",
        3,
        CAP,
        _figures(length, rates, 4),
        {"val": _figures(length + 0.1, rates, 2), "humaneval": _figures(length - 0.1, rates, 2)},
        {"val": 2, "humaneval": 2},
        per_prompt=outcomes,
        engine={"vllm_version": "0.32.0", "platform": "cpu"},
    )
    return write_json(report, export)


def test_a_new_measurement_rewrites_the_card(export):
    target = json.loads((export / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    data = json.loads(_measure(export, 1.8).read_text())
    refresh_card(export, target)
    card = card_text(export)
    label = (data.get("set_labels") or {}).get("val", "val")
    val = card_row(card, label)
    assert val[1:3] == ["2", "**1.900**"] and val[-2:] == ["1", "1"]  # one answer ended at EOS, one cut at 32
    # the acceptance table carries no speed-up: the evaluation engines' tok/s ratio is no serving figure
    assert "1.49" not in card and "| speed-up |" not in card.split("## Serving speed-up")[0]
    assert "| cut at 32 |" in card and "**1.700**" in card and "**1.800**" in card
    # the advice is predicted from this acceptance, said so, with no speed-up figure
    assert "Not measured yet for these weights (`python evaluate.py" in card and "Predicted, not measured" in card
    assert re.search(r"\d\.\d\dx", card) is None
    _measure(export, 2.2)  # measured again: the card follows, the old figures are gone
    refresh_card(export, target)
    card = card_text(export)
    assert "**2.200**" in card and "**2.300**" in card and "**1.800**" not in card and "**1.900**" not in card
    # a measured serving speed-up for these weights shows as measured
    advice = from_measurements({1: {1: 1.12, 3: 1.31}, 8: {3: 0.9}}, device="one test GPU")
    advice.head_sha256 = head_sha256(export)
    advice.write(export)
    refresh_card(export, target)
    card = card_text(export)
    assert "Measured by `python evaluate.py" in card and " on one test GPU " in card
    assert "| 1 | 3 | 1.31x |" in card and "| 8 | none | 1.00x |" in card


def test_the_hub_card_serves_from_the_repo_and_local_files_stay_local(export):
    (export / "acceptance-logs").mkdir()
    (export / "acceptance-logs" / "engine-with-head.log").write_text("log")
    card = card_text(export, model_ref="someone/tiny-eagle3")
    assert '"model": "someone/tiny-eagle3"' in card and str(export) not in card.split("## The head")[0]
    assert [p.as_posix() for p in upload_paths(export)] == [
        "README.md",
        "config.json",
        "eagle3_meta.json",
        "model.safetensors",
    ]


def test_a_re_export_keeps_the_record_of_the_same_weights_only(run_dir, export, tmp_path):
    """A checkpoint moved away from its run dir: exported over the export of the same weights it
    keeps their training record; other weights get none, and the card says so."""
    from eagle3.config.cli import ExportCliConfig
    from eagle3.stages.export import run as export_run

    summary = json.loads((run_dir / "summary.json").read_text())
    moved = tmp_path / "moved"
    moved.mkdir()
    best = Path(shutil.copy(summary["best_checkpoint"], moved / "best.ckpt"))
    last = Path(shutil.copy(run_dir / "checkpoints" / "last.ckpt", moved / "last.ckpt"))
    export_run(ExportCliConfig(ckpt=str(best), out=str(export)))
    assert "## Training data\n\n| " in card_text(export) and "| samples |" in card_text(export)
    other = Path(shutil.copytree(run_dir / "export", tmp_path / "other"))
    export_run(ExportCliConfig(ckpt=str(last), out=str(other)))
    assert "training" not in json.loads((other / "eagle3_meta.json").read_text())
    assert "## Training data\n\nnot recorded" in card_text(other) and "| aux layer ids" in card_text(other)


def _cli(script: str, args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    clean.update(HF_HOME=str(tmp_path / "hf-home"), **env)  # no token file there
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean
    )


def test_export_cli_writes_the_card_from_the_run_dir(run_dir, tmp_path):
    out = tmp_path / "cli"
    proc = _cli("export.py", [f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", f"out={out}"], {}, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    assert card_row(card_text(out), "exported checkpoint")[1] == "`last.ckpt`, at step 6"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, ["no Hugging Face token", "hf auth login", "HF_TOKEN"]),
        (
            {"HF_TOKEN": "hf_not_a_real_token", "HF_ENDPOINT": "http://127.0.0.1:9"},
            ["http://127.0.0.1:9 could not be reached", "nothing was exported"],
        ),
    ],
    ids=["no-token", "no-network"],
)
def test_export_push_is_refused_before_anything_is_written(run_dir, tmp_path, env, expected):
    out = tmp_path / "never"
    args = [f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", f"out={out}", "push_to_hub=someone/tiny-eagle3"]
    proc = _cli("export.py", args, env, tmp_path)
    assert proc.returncode != 0
    assert all(e in proc.stderr for e in ["push_to_hub=someone/tiny-eagle3", *expected]), proc.stderr[-3000:]
    assert not out.exists()


def test_train_push_is_refused_before_training(datasets_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    proc = _cli(
        "train.py",
        TINY + [f"paths.datasets_dir={datasets_dir}", "export.push_to_hub=someone/tiny-eagle3", f"hydra.run.dir={run}"],
        {},
        tmp_path,
    )
    assert proc.returncode != 0 and "export.push_to_hub=someone/tiny-eagle3: no Hugging Face token" in proc.stderr
    assert "nothing was trained" in proc.stderr
    assert not (run / "checkpoints").exists() and not (run / "summary.json").exists()
    # a token, and no network: refused naming the endpoint, before any step
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    cfg = compose("train", TINY + [f"paths.datasets_dir={datasets_dir}", "export.push_to_hub=someone/x"], str(run))
    with pytest.raises(HubPushError, match=r"http://127\.0\.0\.1:9 could not be reached"):
        train(cfg)
    assert not (run / "checkpoints").exists() and not (run / "summary.json").exists()
