"""Chat data -> token ids, assistant loss masks, train/val split, draft vocabulary.

    loaders.py       sources (sharegpt, jsonl, hf_disk) -> Conversation, with a skip report
    conversation.py  what a usable conversation is (role names, skip reasons, repairs)
    json_stream.py   streaming JSON/JSONL reader: a JSON array cut at its end stops cleanly, bad JSONL lines are skipped
    render.py        chat template -> input_ids + loss_mask (generated assistant tokens)
    split.py         hash-based train/val split (stable when max_samples grows)
    vocab.py         token frequencies over loss-masked tokens, draft vocab (d2t, t2d)
    mixture.py       data.mixture: several sources drawn by weight (seeded), ids tagged "<source>/<id>"
    pipeline.py      prepare_samples: load (one source or a mixture) -> [regenerate] -> render -> split

Nothing here runs a model: answers written by the target (eagle3.target_model.generate) come in
as the ``regenerate`` callable of prepare_samples' ``Regeneration``.
"""

from eagle3.data.conversation import Conversation, DataError
from eagle3.data.loaders import LoadReport, LoadResult, iter_conversations, load_conversations
from eagle3.data.pipeline import ChatSource, PreparedData, PreparedSample, PrepareReport, Regeneration, prepare_samples
from eagle3.data.render import (
    ChatRenderer,
    ChatStyle,
    ChatTemplateError,
    RenderedSample,
    RenderResult,
    render_conversation,
)
from eagle3.data.split import is_validation
from eagle3.data.vocab import build_draft_vocab, token_frequencies

__all__ = [
    "ChatRenderer",
    "ChatSource",
    "ChatStyle",
    "ChatTemplateError",
    "Conversation",
    "DataError",
    "LoadReport",
    "LoadResult",
    "PrepareReport",
    "PreparedData",
    "PreparedSample",
    "Regeneration",
    "RenderResult",
    "RenderedSample",
    "build_draft_vocab",
    "is_validation",
    "iter_conversations",
    "load_conversations",
    "prepare_samples",
    "render_conversation",
    "token_frequencies",
]
