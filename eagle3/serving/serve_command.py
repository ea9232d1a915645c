"""What train.py, ``python export.py`` and the serving measurement print from a head's serving
advice (eagle3/serving/advice.py): the ``vllm serve`` command with the advised number of draft
tokens K, the K per load and the loads at which the head pays off. The one place that builds the
command (the model card, eagle3/serving/model_card.py, shows the same lines)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

from eagle3.draft.export_files import ACCEPTANCE, CONFIG, META
from eagle3.serving.advice import ServingAdvice, advice_for
from eagle3.target_model.quantization import serve_flags


def read_acceptance(path: str | Path | None) -> Optional[dict[str, Any]]:
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else None


def serve_command(
    export_dir: str | Path,
    target: str,
    num_draft_tokens: int,
    tensor_parallel_size: int = 1,
    trust_remote_code: bool = False,
    quantization: str | None = None,
) -> str:
    """``vllm serve``, with the head at K draft tokens, or the target alone for K = 0; with the
    tensor parallelism, remote code and quantization (model.quantization) the target ran with in
    extraction. A shell line: ``shlex.split`` of it gives back each argument exactly."""
    args = ["vllm", "serve", str(target)]
    args += ["--tensor-parallel-size", str(int(tensor_parallel_size))] if int(tensor_parallel_size) > 1 else []
    args += ["--trust-remote-code"] if trust_remote_code else []
    args += serve_flags(quantization).split()
    if num_draft_tokens > 0:
        spec = {"model": str(export_dir), "method": "eagle3", "num_speculative_tokens": int(num_draft_tokens)}
        args += ["--speculative-config", json.dumps(spec)]
    # every argument shell-quoted: a path with a space or a quote is one argument, as given
    return " ".join(shlex.quote(a) for a in args)


def serving_lines(
    export_dir: str | Path,
    target: str,
    trained_k: int,
    advice: Optional[ServingAdvice],
    tensor_parallel_size: int = 1,
    trust_remote_code: bool = False,
    quantization: str | None = None,
) -> list[str]:
    """What train.py and ``python export.py`` print: the command with the advised K and
    the loads at which the head pays off (the trained K, and no verdict, without advice)."""

    def command(directory: str | Path, k: int) -> str:
        return serve_command(directory, target, k, tensor_parallel_size, trust_remote_code, quantization)

    if advice is None or not advice.loads:
        return [
            f"serve it: {command(export_dir, trained_k)}",
            "serving advice: none for this head (measure it: python evaluate.py export_dir=<dir> serving.measure=true, "
            "or its acceptance: python evaluate.py); K is the trained one",
        ]
    k = advice.serve_k()
    head = command(export_dir, k or trained_k)
    per_load = "; ".join(
        f"{a.load}: K={a.num_speculative_tokens} ({a.speedup:.2f}x)" if a.num_speculative_tokens else f"{a.load}: none"
        for a in sorted(advice.loads, key=lambda a: a.load)
    )
    predicted_loads = advice.inputs.get("predicted_loads")
    how = (
        "measured by python evaluate.py serving.measure=true"
        + (f"; predicted at {', '.join(map(str, predicted_loads))}" if predicted_loads else "")
        if advice.source == "measured"
        else f"predicted from acceptance and the step costs of the {advice.inputs.get('step_costs_class', 'measured')} "
        f"class (target: {advice.inputs.get('target_size', 'unknown')}; {advice.inputs.get('step_costs_source', '')})"
    )
    pays, not_pays = advice.pays_off(), advice.does_not_pay()
    verdict = (
        f"the head pays off at {', '.join(map(str, pays))} concurrent requests"
        if pays
        else "the head pays off at no load measured"
    )
    if not_pays:
        verdict += f"; at {', '.join(map(str, not_pays))} serve the target alone ({command('', 0)})"
    first = f"serve it: {head}" if k else f"serve it: {command('', 0)} (with the head: {head})"
    return [first, f"serving advice ({how}), K per load: {per_load}", verdict]


def export_serving_lines(
    export_dir: str | Path,
    acceptance_file: str | Path | None = None,
    target_dir: str | Path | None = None,
) -> list[str]:
    """serving_lines for an export as it lies on disk (train.py and export.py print these): the
    target, the trained K and how the target ran (TP, remote code) from its config.json and
    eagle3_meta.json; serving.json where `python evaluate.py serving.measure=true` measured this
    head, else the rule on the acceptance (``acceptance_file``, default its acceptance.json) and the
    step costs of the size class nearest the target (read from ``target_dir``, default the export's
    verifier where that is a directory here)."""
    export_dir = Path(export_dir)
    config = json.loads((export_dir / CONFIG).read_text())["speculators_config"]
    meta_file = export_dir / META
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    target = config["verifier"]["name_or_path"]
    acceptance = read_acceptance(acceptance_file or export_dir / ACCEPTANCE)
    advice = advice_for(export_dir, acceptance, target_dir=target_dir or target)
    return serving_lines(
        export_dir,
        target,
        int(config["proposal_methods"][0]["speculative_tokens"]),
        advice,
        tensor_parallel_size=int(meta.get("serve_tensor_parallel_size", 1)),
        trust_remote_code=bool(meta.get("serve_trust_remote_code", False)),
        quantization=meta.get("serve_quantization"),
    )
