"""What tests share, by topic: ``from helpers import make_head`` (or ``from helpers.heads import
...`` for a topic's sizes). No test module imports another; a builder two modules need lives here.

    heads          small random draft heads (tiny_head_with_meta: with an export's metadata), a
                   SmolLM2-shaped head exported (random_head_export), a packed row's masks
    datasets       the tiny_test overrides, a random shard dataset, a chat dataset with a val split
    storage        samples spanning 6 orders of magnitude, written in a storage format
    teacher        the teacher's top-k projection of a small random target, and its states
    chats          tokenized chats, JSONL records, numbered chat files
    hub            a local Hugging Face hub cache
    disk           a disk that fills in the middle of a write
    timing         a clock that ticks on each read, a scripted deadline, a bound on a block's wait
    generate       transformers' generate() on one prompt alone
    printed        numbers as the entrypoints print them, read back
    cpu            a CPU with bf16 matmuls faked present or absent (topic import)
    cards          an export's model card read back (topic import)
    cuda_files     CUDA vLLM's committed connector files, read as the native route reads them (topic import)
    docs           the docs checked like code (topic import)
    faults         the entrypoints in a subprocess with a fault injected, dataset comparisons
    processes      a real vLLM capture to kill, whether a process is gone, waiting with a deadline
    scored_fit     a real Lightning fit whose validation figure is set per step (topic import)
    trainers       a CPU Lightning Trainer that prints and writes nothing of its own (topic import)
    wandb_offline  an offline W&B run file read back
"""

from helpers.chats import (
    CHUNKED_PREFILL_CHATS,
    SHORT_CHATS,
    chat_record,
    chat_samples,
    question_conversation,
    write_numbered_chats,
    write_word_chats,
)
from helpers.datasets import (
    TINY,
    VAL_SPLIT_CONVERSATIONS,
    jsonl_extract_config,
    random_sample,
    two_source_mixture_args,
    write_dataset_with_val_split,
    write_random_dataset,
)
from helpers.disk import tear_writes
from helpers.generate import generate_alone
from helpers.heads import (
    PACKED_ANSWERS,
    PACKED_SEGMENTS,
    VT,
    H,
    V,
    lens_head_export,
    make_head,
    random_draft_vocab,
    random_head_export,
    tiny_head_checkpoint,
    tiny_head_with_meta,
)
from helpers.hub import add_hub_snapshot
from helpers.printed import printed_number
from helpers.storage import (
    ENCODED_STORAGES,
    FP8_ROW_BOUND,
    fp8_row_errors,
    sha256_of,
    wide_range_samples,
    wide_range_states,
    write_in_storage,
)
from helpers.teacher import teacher_projection, teacher_states
from helpers.timing import ScriptedDeadline, TickingClock, at_most

__all__ = [
    "CHUNKED_PREFILL_CHATS",
    "ENCODED_STORAGES",
    "FP8_ROW_BOUND",
    "H",
    "PACKED_ANSWERS",
    "PACKED_SEGMENTS",
    "SHORT_CHATS",
    "TINY",
    "V",
    "VAL_SPLIT_CONVERSATIONS",
    "VT",
    "ScriptedDeadline",
    "TickingClock",
    "add_hub_snapshot",
    "at_most",
    "chat_record",
    "chat_samples",
    "fp8_row_errors",
    "generate_alone",
    "jsonl_extract_config",
    "lens_head_export",
    "make_head",
    "printed_number",
    "question_conversation",
    "random_draft_vocab",
    "random_sample",
    "random_head_export",
    "sha256_of",
    "tear_writes",
    "teacher_projection",
    "teacher_states",
    "tiny_head_checkpoint",
    "tiny_head_with_meta",
    "two_source_mixture_args",
    "wide_range_samples",
    "wide_range_states",
    "write_dataset_with_val_split",
    "write_in_storage",
    "write_numbered_chats",
    "write_random_dataset",
    "write_word_chats",
]
