"""Every `python extract.py|train.py|evaluate.py|export.py ...` line in README.md and docs/ (the
changelog aside: it records what ran then) composes with `--cfg job --resolve` as the entrypoint
would compose it (placeholders filled): some sixty compositions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.docs import compose_as_entrypoint, doc_commands, overrides_of


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A model=hf target's config.json (SmolLM2's shape) for `model.path=...` in the docs."""
    d = tmp_path_factory.mktemp("hf")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30}
    config |= {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    config |= {"vocab_size": 49152, "torch_dtype": "bfloat16", "tie_word_embeddings": True}
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_every_command_in_the_docs_composes(hf_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths of the docs land here, never in the clone
    commands = doc_commands()
    assert len(commands) > 50, commands  # the finder sees the docs' commands
    failures, composed = [], 0
    for where, entry, tokens in commands:
        overrides = overrides_of(tokens, hf_dir)
        if overrides is None:
            continue
        try:
            compose_as_entrypoint(entry, overrides)
            composed += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported together, by line
            failures.append(f"{where}: python {entry}.py {' '.join(tokens)}\n    {type(e).__name__}: {str(e)[:300]}")
    assert not failures, f"{len(failures)} command(s) in the docs do not compose:\n" + "\n".join(failures)
    assert composed > 40
