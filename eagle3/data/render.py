"""Render a conversation with the target's own chat template: input_ids + assistant loss mask.

``loss_mask[t]`` is 1 exactly when ``input_ids[t]`` is a token the model itself would
generate when serving this conversation: the assistant's answer *and* the end-of-turn
token that stops it (``<|im_end|>`` for SmolLM2). System/user text and the template's
scaffolding (role headers, the newline after ``<|im_end|>``, the next
``<|im_start|>assistant\\n`` header that the server puts in the prompt) are 0.

How the mask is found, for any template, without knowing its syntax:

1. Where generation starts. For assistant turn i the server's prompt is
   ``render(messages[:i], add_generation_prompt=True)``. That text must be a prefix of the
   full rendering ``render(messages)`` (true for ChatML, Llama-3, Mistral, Qwen3, DeepSeek
   templates: a template that rewrote earlier turns once more turns follow would make the
   served prompt differ from our training text, so we refuse it with `ChatTemplateError`
   rather than guess). Its length is where turn i's generated text starts.
2. Where generation stops. A probe renders ``[user, assistant=SENTINEL]``; the text that
   follows the sentinel up to and including the first special token is the end-of-turn
   marker (``<|im_end|>``; ``<|eot_id|>``; ``</s>``, with any space before it). Without a
   special token there (a template that writes plain-text markers) the marker is that
   text minus trailing whitespace. Turn i's generated text ends after the first marker at
   or after its start -- so trailing scaffolding ("\\n") stays out, and an answer that
   itself contains the marker ends there, as the model would have stopped there.
3. Tokens. The rendering is cut at every span boundary and each piece is tokenized on its
   own (``add_special_tokens=False``: the template writes BOS itself, as
   ``apply_chat_template`` does). Pieces tokenized apart mean no token straddles a span
   edge, and the prompt part tokenizes exactly as the served prompt would. For ordinary
   text this equals ``apply_chat_template(messages)`` token for token (tested); it differs
   only where an answer starts with whitespace that BPE would merge into the header's
   newline -- and there the split form is the one the model generates after the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

TOO_LONG = "too_long"
NO_LOSS_TOKENS = "no_loss_tokens"
TEMPLATE_REJECTED = "template_rejected"  # the template itself raised on this conversation
OVERFLOW_MODES = ("truncate", "drop")
_SENTINEL = "EAGLE3_ASSISTANT_SENTINEL_7f3a"


@dataclass(frozen=True)
class ChatStyle:
    """How the deployment calls the chat template: the template, the extra arguments it is called
    with and the system prompt put first in each conversation. Training samples, the target's
    answers and the evaluation's prompts are all rendered so."""

    template: str | None = None  # a Jinja chat template in place of the tokenizer's (model.chat_template)
    kwargs: Mapping[str, Any] | None = None  # data.chat_template_kwargs (enable_thinking, tools, ...)
    system_prompt: str | None = None  # data.system_prompt (None: the conversation's own turns only)


class ChatTemplateError(RuntimeError):
    """The chat template cannot be used to build assistant masks (systematic, not per sample)."""


@dataclass
class RenderedSample:
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool [T], True on generated assistant tokens


@dataclass
class RenderResult:
    sample: RenderedSample | None
    skip_reason: str | None = None  # None, "too_long", "no_loss_tokens", "template_rejected"
    num_tokens: int = 0  # length of the full rendering, before any truncation
    truncated: bool = False


@dataclass(frozen=True)
class EndOfTurn:
    marker: str  # text that ends a generated assistant turn, e.g. "<|im_end|>"
    is_special_token: bool


def _special_token_texts(tokenizer) -> list[str]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    return [t for t in texts if t]


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """``messages`` with data.system_prompt first, unless it is None or they start with a system
    turn of their own (the conversation says how it was asked)."""
    if system_prompt is None or (messages and messages[0].get("role") == "system"):
        return list(messages)
    return [{"role": "system", "content": system_prompt}, *messages]


class ChatRenderer:
    """Holds the tokenizer, the template, the extra arguments it is called with
    (data.chat_template_kwargs: enable_thinking, tools, ...) and its end-of-turn marker (probed once)."""

    def __init__(
        self, tokenizer, chat_template: str | None = None, template_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.end_of_turn = self._probe_end_of_turn()

    def render_text(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except ValueError as err:
            if "chat template" in str(err).lower() or "chat_template" in str(err):
                name = getattr(self.tokenizer, "name_or_path", type(self.tokenizer).__name__)
                raise ChatTemplateError(
                    f"tokenizer {name!r} has no chat template and none was given; set model.chat_template ({err})"
                ) from err
            raise
        if not isinstance(text, str):
            raise ChatTemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def _probe_end_of_turn(self) -> EndOfTurn:
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render_text(probe)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ChatTemplateError("the chat template drops the assistant's content (probe rendered without it)")
        suffix = text[at + len(_SENTINEL) :]
        hits = [(suffix.find(tok), -len(tok), tok) for tok in _special_token_texts(self.tokenizer) if tok in suffix]
        if hits:
            pos, _, tok = min(hits)  # earliest; at a tie the longest token
            return EndOfTurn(suffix[: pos + len(tok)], True)
        marker = suffix.rstrip()
        if not marker:
            raise ChatTemplateError(
                "the chat template writes nothing after an assistant turn, so the end of a "
                f"generated answer cannot be told from what follows (rendered probe: {text!r})"
            )
        return EndOfTurn(marker, False)

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The full rendering and the [start, end) character spans the model generates."""
        full = self.render_text(messages)
        marker = self.end_of_turn.marker
        spans: list[tuple[int, int]] = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self.render_text(messages[:i], add_generation_prompt=True)
            if not full.startswith(prompt):
                diff = next((k for k, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
                raise ChatTemplateError(
                    f"the chat template is not prefix-consistent: the served prompt for assistant "
                    f"turn {i} is not a prefix of the whole conversation's rendering (they differ at "
                    f"character {diff}: prompt has {prompt[diff : diff + 40]!r}, conversation has "
                    f"{full[diff : diff + 40]!r}); masks would not match what the model sees"
                )
            start = len(prompt)
            found = full.find(marker, start)
            if found < 0:
                raise ChatTemplateError(
                    f"assistant turn {i}: end-of-turn marker {marker!r} not found after character {start}"
                )
            if spans and start < spans[-1][1]:
                raise ChatTemplateError(f"assistant turn {i} starts before the previous turn's end marker")
            spans.append((start, found + len(marker)))
        return full, spans

    def __call__(self, messages: list[dict], max_length: int, overflow: str = "truncate") -> RenderResult:
        overflow = getattr(overflow, "value", overflow)
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {overflow!r}")
        if max_length <= 0:
            raise ValueError(f"max_length must be positive, got {max_length}")
        try:
            full, spans = self.assistant_spans(messages)
        except ChatTemplateError:
            raise
        except Exception as err:  # the template's own raise_exception (jinja2 TemplateError)
            if type(err).__module__.startswith("jinja2"):
                return RenderResult(None, TEMPLATE_REJECTED)
            raise

        cuts = sorted({0, len(full), *(c for span in spans for c in span)})
        span_starts = {start for start, _ in spans}
        pieces = [full[a:b] for a, b in zip(cuts, cuts[1:])]
        encoded = self.tokenizer(pieces, add_special_tokens=False)["input_ids"] if pieces else []
        ids: list[int] = []
        mask: list[bool] = []
        for a, piece_ids in zip(cuts, encoded):
            ids.extend(piece_ids)
            mask.extend([a in span_starts] * len(piece_ids))

        num_tokens = len(ids)
        truncated = num_tokens > max_length
        if truncated:
            if overflow == "drop":
                return RenderResult(None, TOO_LONG, num_tokens)
            ids, mask = ids[:max_length], mask[:max_length]
        if not any(mask):
            return RenderResult(None, NO_LOSS_TOKENS, num_tokens, truncated)
        sample = RenderedSample(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))
        return RenderResult(sample, None, num_tokens, truncated)


def render_conversation(
    tokenizer: Any,
    messages: list[dict],
    max_length: int,
    overflow: str = "truncate",
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> RenderResult:
    """One-off form of `ChatRenderer` (which probes the template once for many calls)."""
    return ChatRenderer(tokenizer, chat_template, template_kwargs)(messages, max_length, overflow)
