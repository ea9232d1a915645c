"""The samples of a config: the chat data rendered (and answered again by the target when
data.regenerate), split into train and validation. Both dataset kinds start here: the one
of stored hidden states (stages/extract.py) and the token-only one of online training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console

from eagle3.config.dataset import DataConfig
from eagle3.config.schema import plain
from eagle3.data.hf_source import HFOptions
from eagle3.data.mixture import Mixture
from eagle3.data.pipeline import ChatSource, PreparedData, Regeneration, prepare_samples
from eagle3.data.render import ChatStyle
from eagle3.extraction.identity import DatasetIdentity
from eagle3.util.clock import Deadline

console = Console(stderr=True)


@dataclass(frozen=True)
class RegenMachine:
    """Where the target answers run: the engine's memory and parallelism on this machine. No
    part of a dataset's identity (answers agree across engines and batch shapes)."""

    cpu_kvcache_space_gb: int
    gpu_memory_utilization: float
    tensor_parallel_size: int


def regenerator_for(identity: DatasetIdentity, machine: RegenMachine) -> Any:
    """The target answers the user turns itself (data.regenerate=true): vLLM or transformers."""
    data, model = identity.data, identity.model
    if not data.regenerate:
        return None
    from eagle3.target_model.generate.common import AnswerSettings
    from eagle3.target_model.generate.dispatch import make_regenerator

    answers = AnswerSettings(
        temperature=data.regen_temperature,
        max_tokens=data.regen_max_tokens,
        seed=data.seed,
        max_model_len=data.max_length,
        max_turns=data.regen_max_turns,
        chat_template=model.chat_template,
        template_kwargs=data.chat_template_kwargs,
        quantization=model.quantization,
    )
    return make_regenerator(
        data.regen_backend,
        identity.target_dir,
        identity.cache_dir,
        answers=answers,
        num_answers=data.regen_num_answers,
        gen_batch_size=data.regen_batch_size,
        static_cache=data.regen_static_cache,
        cpu_kvcache_space_gb=machine.cpu_kvcache_space_gb,
        gpu_memory_utilization=machine.gpu_memory_utilization,
        tensor_parallel_size=machine.tensor_parallel_size,
        trust_remote_code=model.trust_remote_code,
    )


def prepare(
    data: DataConfig,
    tokenizer: Any,
    regenerator: Any,
    *,
    chat_template: str | None,
    regen_deadline: Deadline | None = None,
) -> PreparedData:
    """Render (and regenerate) the chat data of ``data``; closes the regenerator when done.
    ``regen_deadline``: a time budget's end of regeneration (no batch starts that would pass it)."""
    mixture, writers = _mixture(data, regenerator)
    chats = ChatSource(
        data.source, data.path, HFOptions.from_data(plain(data)), mixture, max_bad_fraction=data.max_bad_fraction
    )
    prepared = prepare_samples(
        chats,
        tokenizer,
        max_samples=data.max_samples,
        max_length=data.max_length,
        overflow=data.overflow.value,
        val_fraction=data.val_fraction,
        seed=data.seed,
        style=ChatStyle(chat_template, data.chat_template_kwargs, data.system_prompt),
        regeneration=None if regenerator is None else Regeneration(regenerator, data.regen_batch_size, regen_deadline),
    )
    for writer in writers:
        console.print(writer.summary(), soft_wrap=True)
    if regenerator is not None:
        console.print(
            f"regenerated {regenerator.generated} conversations, {regenerator.new_tokens} new tokens "
            f"({regenerator.backend}; {regenerator.cache_file})"
        )
        regenerator.close()
    if prepared.report.deadline_stop:
        console.print(f"[yellow]regeneration stopped early: {prepared.report.deadline_stop}", soft_wrap=True)
    return prepared


def _mixture(data: DataConfig, regenerator: Any) -> tuple[Mixture | None, list[Any]]:
    """data.mixture's sources (None without one), their self-prompts written by ``regenerator``'s
    engine; and those writers (for their counts)."""
    entries = plain(data).get("mixture")
    if not entries:
        return None, []
    writers: list[Any] = []

    def self_prompts(entry: dict[str, Any]) -> Any:
        from eagle3.target_model.generate.self_prompts import SelfPrompts

        share = sum(float(e["weight"]) for e in entries)
        want = data.max_samples * float(entry["weight"]) / share if data.max_samples else data.regen_batch_size
        # a first batch about the size of this source's share (a few spare for the duplicates dropped)
        batch = max(4, min(data.regen_batch_size, int(want * 1.25) + 4))
        writers.append(SelfPrompts(regenerator, entry, seed=data.seed, batch_size=batch))
        return iter(writers[-1])

    mixture = Mixture(
        entries, data.seed, regenerate=data.regenerate, self_prompts=self_prompts, max_samples=data.max_samples
    )
    return mixture, writers
