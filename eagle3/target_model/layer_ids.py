"""Layer ids: the one convention (vLLM's) and the one place that converts from others.

Aux id ``k`` is the hidden state *entering* decoder layer ``k`` (the residual stream after
layers 0..k-1). Id ``N`` (num_layers) is the final hidden state before the final norm and
is always captured: it produces the training targets. So an aux id is one of 1..N-1: ``N``
among the aux ids is refused with an error naming the range, never silently dropped (the head
would then read one aux layer fewer than the config asks for).
SpecForge and the original EAGLE code count "output of layer j", which is vLLM id j+1.
"""

from __future__ import annotations

from collections.abc import Sequence


class LayerIdError(ValueError):
    pass


def default_aux_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high choice: [2, N//2, N-3]."""
    if num_layers < 2:
        raise LayerIdError(
            f"model.num_layers={num_layers}: no aux layer id exists (expected 1..N-1 = 1..{num_layers - 1}; "
            f"id {num_layers} is the final state, always captured as the training target)"
        )
    if num_layers < 6:
        # the default rule collides for very shallow models: spread what exists instead
        ids = sorted({1, max(1, num_layers // 2), max(1, num_layers - 1)})
        return ids
    return [2, num_layers // 2, num_layers - 3]


def from_output_of_layer(ids: Sequence[int]) -> list[int]:
    """SpecForge/EAGLE "output of layer j" ids -> our (vLLM) ids."""
    return [int(j) + 1 for j in ids]


def validate_aux_ids(ids: Sequence[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in ids]
    if len(ids) < 1:
        raise LayerIdError("layers.aux_ids: expected at least 1 layer id, got an empty list")
    if num_layers in ids:
        raise LayerIdError(
            f"layers.aux_ids: id {num_layers} (= model.num_layers, the final layer's state) is not an aux id; "
            f"expected ids in 1..{num_layers - 1}, got {ids}: id {num_layers} is always captured as the "
            f"training target, so leave it out (vLLM numbering: k = state entering layer k)"
        )
    bad = [i for i in ids if not 1 <= i < num_layers]
    if bad:
        raise LayerIdError(
            f"layers.aux_ids: ids {bad} out of range; expected 1..{num_layers - 1} "
            f"(model.num_layers={num_layers}, vLLM numbering: k = state entering layer k; "
            f"{num_layers} is always captured as the training target), got {ids}"
        )
    if len(set(ids)) != len(ids):
        raise LayerIdError(f"layers.aux_ids: expected unique ids, got duplicates in {ids}")
    if ids != sorted(ids):
        raise LayerIdError(f"layers.aux_ids: expected ascending order, got {ids} (sorted: {sorted(ids)})")
    return ids


def resolve_aux_ids(aux_ids: Sequence[int] | None, numbering: str, num_layers: int) -> list[int]:
    """The validated aux ids in vLLM numbering, from a config's (ids, numbering)."""
    num_layers = int(num_layers)
    if aux_ids is None:
        return default_aux_ids(num_layers)
    numbering = getattr(numbering, "value", numbering)
    if numbering == "output_of_layer":
        aux_ids = from_output_of_layer(aux_ids)
    elif numbering != "vllm":
        raise LayerIdError(f"layers.numbering: expected vllm or output_of_layer, got {numbering!r}")
    return validate_aux_ids(aux_ids, num_layers)


def aux_and_final(aux_layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """What extraction captures: the (validated) aux ids plus N (training targets)."""
    ids = [int(i) for i in aux_layer_ids]
    n = int(num_layers)
    if n in ids:
        raise LayerIdError(
            f"aux ids {ids} contain {n} (= model.num_layers): expected aux ids in 1..{n - 1}; "
            f"{n} is always captured as the training target and is added here once"
        )
    return ids + [n]
