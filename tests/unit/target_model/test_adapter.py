"""The capture adapter refuses every real failure shape seen in issue 4 and passes good data."""

from __future__ import annotations

import pytest
import torch

from eagle3.target_model.adapter import (
    CapturedSample,
    CaptureError,
    CaptureSpec,
    is_rpc_tensor,
    to_captured_sample,
)

IDS = (2, 15, 27, 30)  # SmolLM2's aux ids + N
T, L, H = 12, len(IDS), 16


def spec(num_tokens: int = T, dtype: torch.dtype = torch.bfloat16) -> CaptureSpec:
    return CaptureSpec(layer_ids=IDS, hidden_size=H, dtype=dtype, num_tokens=num_tokens)


def tokens(n: int = T) -> torch.Tensor:
    return torch.arange(100, 100 + n, dtype=torch.int64)


def mask(n: int = T) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[n // 2 :] = True
    return m


def layers(n_tokens: int = T, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n_tokens, H, generator=g).to(dtype) for _ in IDS]


def capture(hidden, **kw) -> CapturedSample:
    kw.setdefault("spec", spec())
    kw.setdefault("sent_token_ids", tokens())
    kw.setdefault("loss_mask", mask())
    return to_captured_sample(hidden, **kw)


def encode(t: torch.Tensor, buffers: list) -> list:
    """vLLM's msgpack form of a tensor: [dtype, shape, index into aux buffers]."""
    buffers.append(t.contiguous().view(torch.uint8).numpy().tobytes())
    return [str(t.dtype).removeprefix("torch."), list(t.shape), len(buffers) - 1]


# ------------------------------------------------------------------ good data


def test_list_of_layers_is_stacked_in_layer_order_and_converted():
    parts = layers()
    s = capture(parts, returned_token_ids=tokens().tolist())
    assert s.hidden.shape == (T, L, H) and s.hidden.dtype == torch.bfloat16
    assert s.hidden.is_contiguous() and s.hidden.device.type == "cpu"
    for j, p in enumerate(parts):
        assert torch.equal(s.hidden[:, j], p.to(torch.bfloat16))
    assert s.token_ids.dtype == torch.int64 and torch.equal(s.token_ids, tokens())
    assert s.loss_mask.dtype == torch.bool and torch.equal(s.loss_mask, mask())


def test_tensor_t_l_h_passes_and_integer_mask_becomes_bool():
    h = torch.stack(layers(), dim=1)
    s = capture(h, loss_mask=mask().to(torch.int32))
    assert torch.equal(s.hidden, h.to(torch.bfloat16))
    assert s.loss_mask.dtype == torch.bool and int(s.loss_mask.sum()) == T - T // 2


# ------------------------------------------------------------------ wrong shapes


def test_only_the_first_layer_after_indexing_a_single_reply_is_refused():
    # the Kimi-K2.5 bug: reply[0] of a single reply = layer 0 only, [T, H]
    with pytest.raises(CaptureError, match=r"hidden: expected \[T, L, H\] = \[12, 4, 16\].*tensor\[12, 16\]"):
        capture(layers()[0])


def test_flat_tensor_is_never_reshaped():
    flat = torch.stack(layers(), dim=1).flatten()
    with pytest.raises(CaptureError, match="flat tensor is never reshaped"):
        capture(flat)


def test_l_t_h_tensor_is_refused_with_a_hint():
    lth = torch.stack(layers(), dim=0)
    with pytest.raises(CaptureError, match=r"looks like \[L, T, H\]"):
        capture(lth)


def test_list_of_per_token_tensors_is_refused():
    per_token = list(torch.stack(layers(), dim=1).flatten(1))  # T tensors [L*H]
    with pytest.raises(CaptureError, match="one tensor per token"):
        capture(per_token)


def test_771_slices_of_one_layer_are_refused():
    slices = list(torch.randn(771, T))  # what the downstream slicing produced
    with pytest.raises(CaptureError, match=r"a list of 4 layer tensors.*a list of 771"):
        capture(slices)


def test_list_of_replies_passed_as_hidden_is_refused():
    with pytest.raises(CaptureError, match="a list of RPC replies"):
        capture([layers(), layers()])


def test_undecoded_rpc_tensors_are_refused():
    buffers: list = []
    assert is_rpc_tensor(encode(layers()[0], buffers)) and not is_rpc_tensor(layers())
    with pytest.raises(CaptureError, match="decode the RPC tensors"):
        capture([encode(x, buffers) for x in layers()])
    with pytest.raises(CaptureError, match="decode the RPC tensor"):
        capture(encode(torch.stack(layers(), 1), buffers))


def test_wrong_layer_count():
    with pytest.raises(CaptureError, match=r"a list of 4 layer tensors \(layer ids \[2, 15, 27, 30\]\)"):
        capture(layers()[:3])
    with pytest.raises(CaptureError, match="3 layers captured, 4 requested"):
        capture(torch.stack(layers()[:3], dim=1))


def test_wrong_hidden_size():
    with pytest.raises(CaptureError, match=r"hidden\[layer 2\]: expected \[T, H\] = \[12, 16\]"):
        capture([torch.randn(T, H + 1) for _ in IDS])
    with pytest.raises(CaptureError, match="hidden size 17, the model's is 16"):
        capture(torch.randn(T, L, H + 1))


def test_token_count_mismatch_names_lost_tokens():
    # prefix caching ran only the uncached suffix through the model
    with pytest.raises(CaptureError, match="7 of the 12 prompt tokens were captured") as e:
        capture(torch.randn(7, L, H), sample_id="conv-3")
    assert e.value.sample_id == "conv-3" and "sample 'conv-3'" in str(e.value)
    with pytest.raises(CaptureError, match="7 of the 12 prompt tokens"):
        capture(layers(7))
    with pytest.raises(CaptureError, match=r"sent_token_ids: expected 12 tokens \(spec.num_tokens\), got 11"):
        capture(layers(), sent_token_ids=tokens(11))
    with pytest.raises(CaptureError, match="loss_mask: expected 12 entries, got 13"):
        capture(layers(), loss_mask=mask(13))


def test_token_id_mismatch_reports_first_position():
    back = tokens().clone()
    back[5] = 7
    back[9] = 8
    with pytest.raises(
        CaptureError,
        match=r"returned_token_ids: expected the sent ids \(position 5: 105\), "
        r"got 7 at position 5 \(2 positions differ\)",
    ):
        capture(layers(), returned_token_ids=back)
    with pytest.raises(CaptureError, match="returned_token_ids: expected 12 tokens"):
        capture(layers(), returned_token_ids=tokens(10))


def test_nan_and_inf_are_counted_per_layer():
    parts = layers()
    parts[2][3, 0] = float("nan")
    parts[2][4, 1] = float("nan")
    parts[3][6, 5] = float("inf")
    with pytest.raises(CaptureError, match=r"2 NaN and 1 Inf \(layer 27: 2, layer 30: 1; first at token 3\)"):
        capture(parts)


def test_overflow_on_conversion_is_caught():
    parts = layers(dtype=torch.float32)
    parts[0][0, 0] = 3.4e38  # finite in fp32, inf in fp16
    with pytest.raises(CaptureError, match="Inf"):
        capture(parts, spec=spec(dtype=torch.float16))


def test_a_device_verdict_is_explained_from_the_host_copy_or_refused():
    """finite_on_device (host_copy.BatchToHost's check): False is explained from the host copy;
    False on finite bytes means the copy changed them; it only applies to the host copy in the
    stored dtype (a cast after the check could still overflow)."""
    h = torch.stack(layers(dtype=torch.bfloat16), dim=1)
    assert torch.equal(capture(h, finite_on_device=True).hidden, h)
    bad = h.clone()
    bad[5, 1, 0] = float("nan")
    with pytest.raises(CaptureError, match=r"1 NaN and 0 Inf \(layer 15: 1; first at token 5\)"):
        capture(bad, finite_on_device=False)
    with pytest.raises(CaptureError, match="NaN/Inf on the device but not in the host copy"):
        capture(h, finite_on_device=False)
    with pytest.raises(CaptureError, match=r"the host copy in torch.bfloat16 .* got a torch.float32 tensor on cpu"):
        capture(h.float(), finite_on_device=True)


def test_integer_hidden_is_not_converted():
    with pytest.raises(CaptureError, match="hidden dtype: expected a floating dtype"):
        capture(torch.ones(T, L, H, dtype=torch.int32))


def test_spec_refuses_integer_dtype():
    with pytest.raises(CaptureError, match="CaptureSpec.dtype"):
        CaptureSpec(IDS, H, torch.int64, T)
