"""The samples of a config: the chat data rendered (and answered again by the target when
data.regenerate), split into train and validation. Both dataset kinds start here: the one
of stored hidden states (stages/extract.py) and the token-only one of online training."""

from __future__ import annotations

from rich.console import Console

from eagle3.config.schema import RunConfig, plain
from eagle3.data.hf_source import HFOptions
from eagle3.data.pipeline import PreparedData, prepare_samples

console = Console(stderr=True)


def regenerator_for(cfg: RunConfig, model_dir: str):
    """The target answers the user turns itself (data.regenerate=true): vLLM or transformers."""
    if not cfg.data.regenerate:
        return None
    from eagle3.target.generate.dispatch import make_regenerator

    return make_regenerator(
        cfg.data.regen_backend,
        model_dir,
        cfg.paths.cache_dir,
        temperature=cfg.data.regen_temperature,
        num_answers=cfg.data.regen_num_answers,
        max_tokens=cfg.data.regen_max_tokens,
        seed=cfg.data.seed,
        max_model_len=cfg.data.max_length,
        chat_template=cfg.model.chat_template,
        max_turns=cfg.data.regen_max_turns,
        gen_batch_size=cfg.data.regen_batch_size,
        static_cache=cfg.data.regen_static_cache,
        cpu_kvcache_space_gb=cfg.capture.cpu_kvcache_space_gb,
        gpu_memory_utilization=cfg.capture.gpu_memory_utilization,
        tensor_parallel_size=cfg.topology.extract_tp,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def prepare(cfg: RunConfig, tokenizer, regenerator) -> PreparedData:
    """Render (and regenerate) the config's chat data; closes the regenerator when done."""
    data = prepare_samples(
        cfg.data.source,
        cfg.data.path,
        tokenizer,
        max_samples=cfg.data.max_samples,
        max_length=cfg.data.max_length,
        overflow=cfg.data.overflow.value,
        val_fraction=cfg.data.val_fraction,
        seed=cfg.data.seed,
        chat_template=cfg.model.chat_template,
        regenerate=regenerator,
        regenerate_batch_size=cfg.data.regen_batch_size,
        hf=HFOptions.from_data(plain(cfg.data)),
    )
    if regenerator is not None:
        console.print(
            f"regenerated {regenerator.generated} conversations, {regenerator.new_tokens} new tokens "
            f"({regenerator.backend}; {regenerator.cache_file})"
        )
        regenerator.close()
    return data
