"""How the deployment calls the chat template (data.chat_template_kwargs, data.system_prompt)
reaches every rendering of a prompt: the training samples, the prompts the target answers when
it regenerates, and the acceptance evaluation's prompts (which read it back from the dataset's
manifest). SmolLM2's real tokenizer; a template that reads enable_thinking as Qwen3's does."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from eagle3.data.pipeline import ChatSource, prepare_samples
from eagle3.data.render import ChatStyle
from eagle3.evaluation.prompts import chat_style, heldout_prompts
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.vllm_engine import VLLMRegenerator

# ChatML with a switch the deployment sets per request, as Qwen3's enable_thinking
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'user' and enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KWARGS = {"enable_thinking": False}
SYSTEM = "You answer like a ship's captain."


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def _samples(tmp_path, tokenizer, kwargs=None, system_prompt=None):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": "Name a port."}, {"role": "assistant", "content": "Lisbon."}]}
        )
        + "\n"
    )
    prepared = prepare_samples(
        ChatSource("jsonl", str(chats)),
        tokenizer,
        max_samples=None,
        max_length=256,
        overflow="truncate",
        val_fraction=0.0,
        seed=0,
        style=ChatStyle(TEMPLATE, kwargs, system_prompt),
        progress=False,
    )
    return tokenizer.decode(prepared.train[0].input_ids)


def test_the_training_samples_are_rendered_as_the_deployment_calls_the_template(tmp_path, tokenizer):
    served = _samples(tmp_path, tokenizer, KWARGS, SYSTEM)
    assert served.startswith(
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nName a port. /no_think<|im_end|>"
    )
    plain = _samples(tmp_path, tokenizer)
    assert (
        "/no_think" not in plain
        and SYSTEM not in plain
        and plain.startswith("<|im_start|>user\nName a port.<|im_end|>")
    )


def test_regeneration_prompts_carry_the_template_arguments(tmp_path, smollm2_dir, tokenizer):
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a port."}]
    regen = VLLMRegenerator(
        str(smollm2_dir), tmp_path / "cache", answers=AnswerSettings(chat_template=TEMPLATE, template_kwargs=KWARGS)
    )
    text = tokenizer.decode(regen._prompt_ids(history))  # the engine is not started: only the prompt
    assert text.endswith("Name a port. /no_think<|im_end|>\n<|im_start|>assistant\n")
    plain = VLLMRegenerator(str(smollm2_dir), tmp_path / "cache", answers=AnswerSettings(chat_template=TEMPLATE))
    assert regen.cache_file != plain.cache_file


def test_the_evaluation_renders_its_prompts_as_the_dataset_was(tmp_path, tokenizer):
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    inputs = {"data": {"source": "jsonl", "chat_template_kwargs": KWARGS, "system_prompt": SYSTEM}}
    (dataset / "manifest.json").write_text(json.dumps({"fingerprint_inputs": inputs}))
    kwargs, system = chat_style(dataset)
    assert (kwargs, system) == (KWARGS, SYSTEM)
    assert chat_style(None) == ({}, None)
    held = heldout_prompts(
        None, 0, 0, tokenizer, chat_template=TEMPLATE, suite=1, template_kwargs=kwargs, system_prompt=system
    )
    (prompt,) = held.prompts
    text = tokenizer.decode(prompt.token_ids)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith(" /no_think<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.messages[0] == {"role": "system", "content": SYSTEM}  # second turns are asked after it too
