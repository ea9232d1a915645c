"""eagle3.target_model.generate.fast_decode: the preallocated-cache decoder must answer exactly as
transformers' generate does for each prompt alone (greedy), whatever the batch, padding,
compaction and prefill chunking."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers.generate import generate_alone

from eagle3.target_model.generate.fast_decode import _chunks, decode, unsupported_reason

PROMPTS = [[5, 17, 3], [9, 8, 7, 6, 5, 4, 3], list(range(10, 22)), [42], [3 * i % 120 + 4 for i in range(20)]]
ROOMS = [12, 7, 16, 1, 10]


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # no eos: generate then runs every answer to its room, and the test picks its own stop id;
    # a wide init gives sharp logits, so no greedy step is a near tie between two kernels
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).float().eval()


@pytest.fixture(scope="module")
def reference(tiny):
    """generate per prompt alone, and a stop id that cuts some answers but not all."""
    full = [generate_alone(tiny, p, r, set()) for p, r in zip(PROMPTS, ROOMS)]
    assert all(len(a) == r for a, r in zip(full, ROOMS))
    stop = full[2][5]  # inside the longest answer, so at least that one stops early
    cut = [a[: a.index(stop)] if stop in a else a for a in full]
    assert len(cut[2]) <= 5 and any(len(a) == r for a, r in zip(cut, ROOMS))
    return {stop}, cut, full


def test_greedy_equals_generate_alone(tiny, reference):
    stop, cut, full = reference
    assert decode(tiny, PROMPTS, ROOMS, stop) == cut
    assert decode(tiny, PROMPTS, ROOMS, set()) == full  # no stop id: every answer fills its room


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_other_llama_family_members_equal_generate_alone(kind):
    """qwen2 (biased q/k/v projections) and mistral (no window in reach) take the same path."""
    import transformers

    cls = {"qwen2": "Qwen2", "mistral": "Mistral"}[kind]
    torch.manual_seed(1)
    cfg = getattr(transformers, f"{cls}Config")(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        initializer_range=0.2,
        sliding_window=None,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = getattr(transformers, f"{cls}ForCausalLM")(cfg).float().eval()
    if kind == "qwen2":  # biases start at zero: make them matter
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.5)
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.5)
    assert unsupported_reason(model) is None
    assert decode(model, PROMPTS, ROOMS, set()) == [generate_alone(model, p, r, set()) for p, r in zip(PROMPTS, ROOMS)]


def test_rooms_of_zero_and_prompt_order_do_not_matter(tiny, reference):
    stop, cut, _ = reference
    order = [4, 0, 3, 2, 1]
    out = decode(tiny, [PROMPTS[i] for i in order] + [PROMPTS[0]], [ROOMS[i] for i in order] + [0], stop)
    assert out == [cut[i] for i in order] + [[]]
    assert decode(tiny, PROMPTS, [0] * len(PROMPTS), stop) == [[]] * len(PROMPTS)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(compact_below=0.0),
        dict(compact_below=1.0),
        dict(prefill_tokens=25),
        dict(prefill_tokens=1, compact_below=1.0),
    ],
)
def test_compaction_and_prefill_chunks_change_nothing(tiny, reference, kwargs):
    stop, cut, _ = reference
    assert _chunks([len(p) for p in PROMPTS], 25) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert decode(tiny, PROMPTS, ROOMS, stop, **kwargs) == cut


def test_sampling_is_reproducible_and_not_greedy(tiny, reference):
    stop, cut, _ = reference

    def sample(seed: int, **kwargs):
        return decode(
            tiny, PROMPTS, ROOMS, stop, temperature=5.0, generator=torch.Generator().manual_seed(seed), **kwargs
        )

    first = sample(1)
    assert sample(1) == first
    assert first != cut and sample(2) != first
    assert all(len(a) <= r and not stop & set(a) for a, r in zip(first, ROOMS))
    # top_k=1 leaves only the argmax to sample: greedy again
    assert sample(3, top_k=1) == cut


def test_unsupported_reason():
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    assert unsupported_reason(LlamaForCausalLM(LlamaConfig(**small))) is None
    reason = unsupported_reason(Qwen3ForCausalLM(Qwen3Config(head_dim=16, **small)))
    assert reason is not None and "q_norm" in reason
    reason = unsupported_reason(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)))
    assert reason is not None and "has no model.embed_tokens" in reason
    mistral = MistralForCausalLM(MistralConfig(sliding_window=64, **small))
    assert "sliding_window=64" in unsupported_reason(mistral)
    assert unsupported_reason(mistral, total_len=64) is None  # a window that cannot bite
    lookalike = SimpleNamespace(
        config=SimpleNamespace(model_type="mixtral"), model=mistral.model, lm_head=mistral.lm_head
    )  # Llama-shaped modules, an unchecked architecture
    assert "model_type 'mixtral'" in unsupported_reason(lookalike)
    with pytest.raises(ValueError, match="sliding_window=64"):
        decode(mistral, [[1] * 60], [8], {0})


def test_generate_settings_follow_the_generation_config(tiny):
    """decode stands in for generate only where the model's generation_config asks for
    nothing decode lacks; sampling then uses generate's top_k (transformers' default 50)."""
    from transformers import GenerationConfig

    from eagle3.target_model.generate.fast_decode import generate_settings

    saved = tiny.generation_config
    try:
        assert generate_settings(tiny, 0.0) == (None, 0)
        assert generate_settings(tiny, 0.7) == (None, 50)
        tiny.generation_config = GenerationConfig(top_k=20, top_p=0.8)
        assert generate_settings(tiny, 0.0) == (None, 0)  # greedy ignores the sampling knobs
        reason, _ = generate_settings(tiny, 0.7)
        assert reason is not None and "top_p=0.8" in reason
        tiny.generation_config = GenerationConfig(top_k=20, repetition_penalty=1.05)
        reason, _ = generate_settings(tiny, 0.0)
        assert reason is not None and "repetition_penalty=1.05" in reason
        tiny.generation_config = GenerationConfig(top_k=20)
        assert generate_settings(tiny, 0.7) == (None, 20)
    finally:
        tiny.generation_config = saved
