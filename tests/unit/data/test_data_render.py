"""Chat-template rendering and the assistant loss mask, token by token, with the real
SmolLM2 tokenizer: its own ChatML template and a Llama-3 style template."""

from __future__ import annotations

import pytest
import torch

from eagle3.data import ChatRenderer, ChatTemplateError, load_conversations, render_conversation

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "It is 5."},
]

LLAMA3_STYLE = (
    "{{ '<|begin_of_text|>' }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def llama3_tokenizer(smollm2_dir):
    """SmolLM2's vocabulary plus Llama-3's header/turn tokens as special tokens, as the
    real Llama-3 tokenizer has them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    return tok


def _table(tok, result) -> list[tuple[str, int]]:
    ids = result.sample.input_ids.tolist()
    return list(zip(tok.convert_ids_to_tokens(ids), result.sample.loss_mask.int().tolist()))


def test_smollm2_template_mask_token_by_token(tokenizer):
    result = render_conversation(tokenizer, CONVERSATION, max_length=1024)
    assert result.skip_reason is None and not result.truncated
    assert result.sample.input_ids.dtype == torch.long and result.sample.loss_mask.dtype == torch.bool
    # written out by hand: 1 exactly on the answers and the <|im_end|> that ends them
    assert _table(tokenizer, result) == [
        ("<|im_start|>", 0), ("system", 0), ("Ċ", 0), ("Be", 0), ("Ġbrief", 0), (".", 0), ("<|im_end|>", 0), ("Ċ", 0),
        ("<|im_start|>", 0), ("user", 0), ("Ċ", 0), ("Hi", 0), ("Ġthere", 0), ("<|im_end|>", 0), ("Ċ", 0),
        ("<|im_start|>", 0), ("ass", 0), ("istant", 0), ("Ċ", 0),
        ("Hello", 1), ("!", 1), ("<|im_end|>", 1),
        ("Ċ", 0), ("<|im_start|>", 0), ("user", 0), ("Ċ", 0),
        ("Add", 0), ("Ġ", 0), ("2", 0), ("Ġand", 0), ("Ġ", 0), ("3", 0), (".", 0), ("<|im_end|>", 0), ("Ċ", 0),
        ("<|im_start|>", 0), ("ass", 0), ("istant", 0), ("Ċ", 0),
        ("It", 1), ("Ġis", 1), ("Ġ", 1), ("5", 1), (".", 1), ("<|im_end|>", 1),
        ("Ċ", 0),
    ]  # fmt: skip
    # and the ids are the template's own tokenization
    assert result.sample.input_ids.tolist() == tokenizer.apply_chat_template(CONVERSATION)["input_ids"]


def test_smollm2_default_system_prompt_is_scaffolding(tokenizer):
    result = render_conversation(tokenizer, CONVERSATION[1:], max_length=1024)
    text = tokenizer.decode(result.sample.input_ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tokenizer.decode(result.sample.input_ids[result.sample.loss_mask]) == "Hello!<|im_end|>It is 5.<|im_end|>"


def test_llama3_style_template_mask_token_by_token(llama3_tokenizer):
    tok = llama3_tokenizer
    renderer = ChatRenderer(tok, LLAMA3_STYLE)
    assert renderer.end_of_turn.marker == "<|eot_id|>" and renderer.end_of_turn.is_special_token
    result = renderer(
        CONVERSATION[1:]
        + [{"role": "user", "content": " spaces trimmed "}, {"role": "assistant", "content": "  Ok \n"}],
        1024,
    )
    assert _table(tok, result) == [
        ("<|begin_of_text|>", 0),
        ("<|start_header_id|>", 0), ("user", 0), ("<|end_header_id|>", 0), ("Ċ", 0), ("Ċ", 0), ("Hi", 0), ("Ġthere", 0), ("<|eot_id|>", 0),
        ("<|start_header_id|>", 0), ("ass", 0), ("istant", 0), ("<|end_header_id|>", 0), ("ĊĊ", 0),
        ("Hello", 1), ("!", 1), ("<|eot_id|>", 1),
        ("<|start_header_id|>", 0), ("user", 0), ("<|end_header_id|>", 0), ("Ċ", 0), ("Ċ", 0),
        ("Add", 0), ("Ġ", 0), ("2", 0), ("Ġand", 0), ("Ġ", 0), ("3", 0), (".", 0), ("<|eot_id|>", 0),
        ("<|start_header_id|>", 0), ("ass", 0), ("istant", 0), ("<|end_header_id|>", 0), ("ĊĊ", 0),
        ("It", 1), ("Ġis", 1), ("Ġ", 1), ("5", 1), (".", 1), ("<|eot_id|>", 1),
        ("<|start_header_id|>", 0), ("user", 0), ("<|end_header_id|>", 0), ("Ċ", 0), ("Ċ", 0),
        ("spaces", 0), ("Ġtrimmed", 0), ("<|eot_id|>", 0),
        ("<|start_header_id|>", 0), ("ass", 0), ("istant", 0), ("<|end_header_id|>", 0), ("ĊĊ", 0),
        ("Ok", 1), ("<|eot_id|>", 1),
    ]  # fmt: skip


def test_prompt_part_tokenizes_as_the_served_prompt(llama3_tokenizer):
    """The served prompt ends in "\\n\\n"; alone it is one token ("ĊĊ"), inside the whole
    text BPE splits it ("Ċ", "Ċ") because the answer follows. We keep the served form."""
    tok = llama3_tokenizer
    messages = CONVERSATION[1:3]
    result = render_conversation(tok, messages, 1024, chat_template=LLAMA3_STYLE)
    prompt = tok.apply_chat_template(messages[:1], chat_template=LLAMA3_STYLE, add_generation_prompt=True)["input_ids"]
    first = int(result.sample.loss_mask.int().argmax())
    assert result.sample.input_ids[:first].tolist() == prompt
    whole = tok.apply_chat_template(messages, chat_template=LLAMA3_STYLE)["input_ids"]
    assert len(whole) == len(result.sample.input_ids) + 1  # only that one merge differs


def test_plain_text_end_marker_without_special_tokens(tokenizer):
    """Llama-3 markers on a vocabulary that lacks them: the marker is plain text, and the
    tokens that spell it after an answer are generated (1), after a question they are not."""
    renderer = ChatRenderer(tokenizer, LLAMA3_STYLE)
    assert renderer.end_of_turn.marker == "<|eot_id|>" and not renderer.end_of_turn.is_special_token
    result = renderer(CONVERSATION[1:3], 1024)
    masked = tokenizer.decode(result.sample.input_ids[result.sample.loss_mask])
    assert masked == "Hello!<|eot_id|>"
    assert tokenizer.decode(result.sample.input_ids).endswith("Hello!<|eot_id|>")


def test_real_sharegpt_masks_decode_to_the_answers(tokenizer):
    convs = load_conversations("sharegpt", limit=150).conversations
    renderer = ChatRenderer(tokenizer)
    for conv in convs:
        result = renderer(conv.messages, max_length=10**7)
        sample = result.sample
        answers = "".join(m["content"] + "<|im_end|>" for m in conv.messages if m["role"] == "assistant")
        assert tokenizer.decode(sample.input_ids[sample.loss_mask]) == answers, conv.id
        # the header before every answer and the newline after it are never masked
        ids = sample.input_ids.tolist()
        starts = [i for i in range(len(ids)) if sample.loss_mask[i] and (i == 0 or not sample.loss_mask[i - 1])]
        assert len(starts) == sum(m["role"] == "assistant" for m in conv.messages)
        for s in starts:
            assert tokenizer.decode(ids[s - 4 : s]) == "<|im_start|>assistant\n"


def test_truncate_and_drop(tokenizer):
    full = render_conversation(tokenizer, CONVERSATION, max_length=1024).sample
    n = full.input_ids.numel()
    assert n == 46

    exact = render_conversation(tokenizer, CONVERSATION, max_length=n, overflow="drop")
    assert exact.sample is not None and not exact.truncated

    cut = render_conversation(tokenizer, CONVERSATION, max_length=n - 3, overflow="truncate")
    assert cut.truncated and cut.num_tokens == n
    assert torch.equal(cut.sample.input_ids, full.input_ids[: n - 3])
    assert torch.equal(cut.sample.loss_mask, full.loss_mask[: n - 3])

    dropped = render_conversation(tokenizer, CONVERSATION, max_length=n - 1, overflow="drop")
    assert dropped.sample is None and dropped.skip_reason == "too_long" and dropped.num_tokens == n

    # cut before the first answer: nothing left to learn from
    prompt_only = render_conversation(tokenizer, CONVERSATION, max_length=19, overflow="truncate")
    assert prompt_only.sample is None and prompt_only.skip_reason == "no_loss_tokens"
    one_token = render_conversation(tokenizer, CONVERSATION, max_length=20, overflow="truncate")
    assert one_token.sample.loss_mask.sum() == 1

    with pytest.raises(ValueError, match="overflow"):
        render_conversation(tokenizer, CONVERSATION, max_length=10, overflow="wrap")


def test_template_that_raises_skips_the_sample(tokenizer):
    strict = (
        "{% for m in messages %}{% if m['content'] == 'forbidden' %}{{ raise_exception('no') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    ok = render_conversation(tokenizer, CONVERSATION, 1024, chat_template=strict)
    assert ok.sample is not None
    bad = [{"role": "user", "content": "forbidden"}, {"role": "assistant", "content": "a"}]
    result = render_conversation(tokenizer, bad, 1024, chat_template=strict)
    assert result.sample is None and result.skip_reason == "template_rejected"


def test_template_that_rewrites_history_is_refused(tokenizer):
    # writes the number of messages into the first line: earlier prompts are no prefixes
    counting = (
        "{{ 'turns=' + (messages | length | string) + '\n' }}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="not prefix-consistent"):
        render_conversation(tokenizer, CONVERSATION, 1024, chat_template=counting)


def test_template_without_end_marker_is_refused(tokenizer):
    bare = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="writes nothing after an assistant turn"):
        ChatRenderer(tokenizer, bare)


def test_template_that_renders_only_the_last_answer_differently(tokenizer):
    """Qwen3-style: the last answer gets an (empty) think block, earlier answers do not.
    The served prompts are still prefixes, so the mask holds; the think block of the last
    turn is text the model generates after "<|im_start|>assistant\\n", so it is masked."""
    qwen3_like = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
        "{% if m['role'] == 'assistant' and loop.last %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
        "{{ m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    result = render_conversation(tokenizer, CONVERSATION, 1024, chat_template=qwen3_like)
    masked = tokenizer.decode(result.sample.input_ids[result.sample.loss_mask])
    assert masked == "Hello!<|im_end|><think>\n\n</think>\n\nIt is 5.<|im_end|>"
