"""What a usable chat conversation is, and how a raw record becomes one.

Every source (ShareGPT JSON, OpenAI-style JSONL, a `datasets` directory) hands us raw
records of one of two shapes:

    {"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}   (ShareGPT)
    {"id": ..., "messages": [{"role": "user", "content": "..."}, ...]}       (OpenAI)

`normalise_record` turns either into a list of {"role", "content"} dicts with roles
system/user/assistant, or names the one reason it cannot (the first rule that fails),
so the loader can count skips per reason. Two cheap repairs keep data that is only
ragged at its ends (ShareGPT splits long chats into parts, and a part often starts with
the model's continuation or ends on an unanswered question):

- leading assistant turns (before the first user turn) are dropped: nothing prompted them;
- trailing user turns are dropped: nothing in them is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

USER, ASSISTANT, SYSTEM = "user", "assistant", "system"

# ShareGPT's speaker names (and OpenAI's) -> the three roles chat templates know.
ROLE_ALIASES: dict[str, str] = {
    "human": USER,
    "user": USER,
    "gpt": ASSISTANT,
    "chatgpt": ASSISTANT,
    "bing": ASSISTANT,
    "bard": ASSISTANT,
    "assistant": ASSISTANT,
    "system": SYSTEM,
}

# Skip reasons, in the order the rules are checked (one reason per record).
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
EMPTY_CONVERSATION = "empty_conversation"
UNKNOWN_ROLE = "unknown_role"
NON_STRING_CONTENT = "non_string_content"
EMPTY_TURN = "empty_turn"
MISPLACED_SYSTEM = "misplaced_system"
NO_EXCHANGE = "no_exchange"  # no user turn answered by an assistant turn
CONSECUTIVE_USER = "consecutive_user"
CONSECUTIVE_ASSISTANT = "consecutive_assistant"

# Repairs (the record is kept).
DROPPED_LEADING_ASSISTANT = "dropped_leading_assistant"
DROPPED_TRAILING_USER = "dropped_trailing_user"


class DataError(RuntimeError):
    """The chat data cannot give a single usable sample; the message says why."""


class DataWarning(UserWarning):
    """Part of the chat data was skipped (the message names the file and the records/lines)."""


@dataclass
class Conversation:
    """One usable conversation.

    id: stable across runs and across `max_samples` (the record's own id, or
        "<file-stem>:<record index>"; a repeated id gets "#2", "#3", ... in file order).
    messages: [{"role": "system"|"user"|"assistant", "content": str}, ...], an optional
        system turn, then user/assistant alternating, starting with user and ending
        with assistant.
    split_key: what the train/val split hashes. Parts of one ShareGPT chat ("abc_0",
        "abc_11") share a key, so a later part never lands in val while its beginning
        is in train; so do the repeats of one id ("x", "x#2": the key is "x").
    """

    id: str
    messages: list[dict[str, str]]
    split_key: str = ""
    # the chat template's extra arguments for this conversation (a data.mixture source's own mode:
    # enable_thinking, tools, ...); None: data.chat_template_kwargs, as every other conversation
    template_kwargs: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if not self.split_key:
            self.split_key = self.id


ANSWER_SEP = "@answer"


def answer_id(conversation_id: str, answer: int) -> str:
    """The sample id of the target's answer number ``answer`` (data.regen_num_answers) to a
    conversation. Answer 0 keeps the conversation's id, so one answer per conversation names
    samples as a dataset without regeneration does."""
    return conversation_id if answer == 0 else f"{conversation_id}{ANSWER_SEP}{answer}"


def conversation_of(sample_id: str) -> str:
    """answer_id's inverse: the conversation a sample answers."""
    head, sep, tail = sample_id.rpartition(ANSWER_SEP)
    return head if sep and tail.isdigit() else sample_id


@dataclass
class Normalised:
    messages: list[dict[str, str]] | None  # None when skipped
    skip_reason: str | None = None
    repairs: list[str] = field(default_factory=list)


def _turn_fields(turn: Any) -> tuple[Any, Any] | None:
    """(role, content) of a turn in either shape, or None when a field is missing."""
    if not isinstance(turn, dict):
        return None
    role = turn.get("from", turn.get("role"))
    if "value" in turn:
        content = turn["value"]
    elif "content" in turn:
        content = turn["content"]
    else:
        return None
    if role is None:
        return None
    return role, content


def normalise_record(record: Any) -> Normalised:
    if not isinstance(record, dict):
        return Normalised(None, NOT_AN_OBJECT)
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        return Normalised(None, MISSING_FIELD)
    if not turns:
        return Normalised(None, EMPTY_CONVERSATION)

    messages: list[dict[str, str]] = []
    for turn in turns:
        fields = _turn_fields(turn)
        if fields is None:
            return Normalised(None, MISSING_FIELD)
        raw_role, content = fields
        role = ROLE_ALIASES.get(str(raw_role).strip().lower())
        if role is None:
            return Normalised(None, UNKNOWN_ROLE)
        if not isinstance(content, str):
            return Normalised(None, NON_STRING_CONTENT)
        if not content.strip():
            return Normalised(None, EMPTY_TURN)
        messages.append({"role": role, "content": content})

    system = messages[:1] if messages[0]["role"] == SYSTEM else []
    body = messages[len(system) :]
    if any(m["role"] == SYSTEM for m in body):
        return Normalised(None, MISPLACED_SYSTEM)

    repairs: list[str] = []
    first_user = next((i for i, m in enumerate(body) if m["role"] == USER), len(body))
    if first_user > 0:
        body = body[first_user:]
        repairs.append(DROPPED_LEADING_ASSISTANT)
    last_assistant = max((i for i, m in enumerate(body) if m["role"] == ASSISTANT), default=-1)
    if last_assistant < len(body) - 1:
        body = body[: last_assistant + 1]
        repairs.append(DROPPED_TRAILING_USER)
    if not body:
        return Normalised(None, NO_EXCHANGE, repairs)

    # body now starts with user and ends with assistant: only repeats can break alternation
    for prev, cur in zip(body, body[1:]):
        if prev["role"] == cur["role"]:
            reason = CONSECUTIVE_USER if cur["role"] == USER else CONSECUTIVE_ASSISTANT
            return Normalised(None, reason, repairs)
    return Normalised(system + body, None, repairs)
