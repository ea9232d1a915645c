"""Several serving modes in one dataset: data.mixture sources with a chat_template_kwargs and
system_prompt of their own are rendered, answered and evaluated in their own mode, name another
dataset only when set, and the acceptance evaluation reports the validation prompts per source.
SmolLM2's real tokenizer; a template that reads enable_thinking as Qwen3's does."""

from __future__ import annotations

import json

import pytest
from conftest import compose
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from eagle3.config.schema import run_config
from eagle3.data.conversation import Conversation
from eagle3.data.loaders import LoadReport
from eagle3.data.mixture import Mixture
from eagle3.data.pipeline import ChatSource, prepare_samples
from eagle3.data.render import ChatStyle
from eagle3.evaluation.prompts import heldout_prompts
from eagle3.extraction.identity import fingerprint_inputs
from eagle3.stages.extract import run as extract
from eagle3.stages.narrow import dataset_identity
from eagle3.target_model.generate.common import AnswerSettings, _asked_sha
from eagle3.target_model.generate.vllm_engine import VLLMRegenerator
from eagle3.target_model.resolve import resolve_target

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'user' and enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OFF = {"enable_thinking": False}
SYSTEM = "You answer like a ship's captain."


def _chats(path, n: int, word: str):
    rows = [
        {
            "id": str(i),
            "messages": [{"role": "user", "content": f"{word} {i}?"}, {"role": "assistant", "content": "ok"}],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _entries(tmp_path, off_mode: bool = True) -> list[dict]:
    off = {"chat_template_kwargs": OFF, "system_prompt": SYSTEM} if off_mode else {}
    return [
        {"name": "think", "source": "jsonl", "path": _chats(tmp_path / "a.jsonl", 12, "alpha")},
        {"name": "fast", "source": "jsonl", "path": _chats(tmp_path / "b.jsonl", 12, "beta"), **off},
    ]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_each_source_is_rendered_in_its_own_mode(tmp_path, tokenizer):
    mixture = Mixture(_entries(tmp_path), 0, regenerate=False, max_samples=0)
    prepared = prepare_samples(
        ChatSource("mixture", mixture=mixture), tokenizer, max_samples=24, max_length=128, overflow="truncate",
        val_fraction=0.0, seed=0, style=ChatStyle(TEMPLATE), progress=False,
    )  # fmt: skip
    text = {s.id: tokenizer.decode(s.input_ids) for s in prepared.train}
    assert len(text) == 24
    for sid, t in text.items():
        if sid.startswith("fast/"):
            assert t.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nbeta") and "/no_think" in t
        else:
            assert t.startswith("<|im_start|>user\nalpha") and "/no_think" not in t and SYSTEM not in t


def test_the_target_answers_each_conversation_in_its_mode_and_caches_it_apart(tmp_path, smollm2_dir, tokenizer):
    convs = list(Mixture(_entries(tmp_path), 0, regenerate=True, max_samples=0).stream(LoadReport("m", "")))
    fast = next(c for c in convs if c.id.startswith("fast/"))
    think = next(c for c in convs if c.id.startswith("think/"))
    assert fast.template_kwargs == OFF and think.template_kwargs is None
    assert fast.messages[0] == {"role": "system", "content": SYSTEM}
    regen = VLLMRegenerator(
        str(smollm2_dir), tmp_path / "cache", answers=AnswerSettings(chat_template=TEMPLATE)
    )  # no engine started
    asked = [m for m in fast.messages if m["role"] != "assistant"]
    assert tokenizer.decode(regen._prompt_ids(asked, fast.template_kwargs)).endswith(
        " /no_think<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "/no_think" not in tokenizer.decode(regen._prompt_ids(asked, think.template_kwargs))
    # an answer cached in one mode is not the answer of the same turns in another
    same_turns = Conversation(fast.id, fast.messages, fast.split_key)
    assert _asked_sha(same_turns) != _asked_sha(fast)


def test_a_mode_names_another_dataset_and_unset_keeps_the_name(tmp_path):
    def inputs(entries):
        cfg = compose("extract", ["experiment=tiny_test", "data=jsonl", "data.path=null"])
        OmegaConf.update(cfg, "data.mixture", entries, force_add=True)
        run = run_config(cfg)
        return fingerprint_inputs(dataset_identity(run, resolve_target(run.model, run.paths.cache_dir)))

    plain, moded = inputs(_entries(tmp_path, off_mode=False)), inputs(_entries(tmp_path))
    assert (
        "chat_template_kwargs" not in plain["data"]["mixture"][1] and "system_prompt" not in plain["data"]["mixture"][1]
    )
    assert moded["data"]["mixture"][1]["chat_template_kwargs"] == OFF and moded != plain


def test_the_evaluation_reports_the_validation_prompts_per_mode(tmp_path, tokenizer):
    cfg = compose(
        "extract",
        [
            "experiment=tiny_test",
            "data=jsonl",
            "data.path=null",
            "data.val_fraction=0.5",
            f"paths.datasets_dir={tmp_path / 'data'}",
        ],
    )
    OmegaConf.update(cfg, "data.mixture", _entries(tmp_path), force_add=True)
    OmegaConf.update(cfg, "model.chat_template", TEMPLATE)
    dataset_dir = extract(cfg)
    held = heldout_prompts(dataset_dir, 24, 0, tokenizer, chat_template=TEMPLATE)
    by_category: dict[str, list[str]] = {}
    for p in held.prompts:
        by_category.setdefault(p.category, []).append(tokenizer.decode(p.token_ids))
    assert set(by_category) == {"val/think", "val/fast"}
    assert all("/no_think" in t and SYSTEM in t for t in by_category["val/fast"])  # as that mode was served
    assert not any("/no_think" in t for t in by_category["val/think"])
