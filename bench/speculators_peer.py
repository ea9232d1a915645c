"""The peer in bench/train_throughput.py: speculators 0.9's Eagle3DraftModel and loss, built
with the bench's shapes and weights (imported only when a spec* variant runs)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

import torch


class _StandIn(types.ModuleType):
    """Stands in for a data-pipeline package speculators imports at import time but its
    model never calls (openai, datasets, hs_connectors are absent on the GPU image)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []  # a package, so `from openai.types.chat import X` resolves too

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        pass


def import_speculators() -> list[str]:
    """Import speculators' Eagle3 model; stand-ins only for packages that are missing."""
    missing = set()
    for name in ("openai", "datasets", "hs_connectors"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.add(name)
    if missing:
        sys.meta_path.insert(0, _StandInFinder(missing))
    importlib.import_module("speculators.models.eagle3")
    return sorted(missing)


def build_spec(
    s, x: dict, device: torch.device, ttt: int, attn: str, *, eps: float, rope_theta: float, max_positions: int
):
    """speculators' Eagle3DraftModel with the bench's shapes `s` and the weights in `x`."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    tl = LlamaConfig(
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate_size=s.intermediate,
        vocab_size=s.vocab,
        num_hidden_layers=1,
        rms_norm_eps=eps,
        rope_theta=rope_theta,
        max_position_embeddings=max_positions,
    )
    tl._attn_implementation = attn  # its trainer's default is simple_flex_attention
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl,
        draft_vocab_size=s.draft_vocab,
        norm_before_residual=False,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
    )
    with torch.device(device):
        model = Eagle3DraftModel(config)
    model.load_vocab_mappings(x["t2d"].to(device), x["d2t"].to(device))
    with torch.no_grad():  # what load_verifier_weights would copy from the target
        model.embed_tokens.weight.copy_(x["embed"])
        model.lm_head.weight.copy_(x["lm_rows"])
        model.verifier_lm_head.weight.copy_(x["lm_rows"])
        model.verifier_norm.weight.fill_(1.0)
    return model


def spec_loss_fn(model, ttt: int, loss_impl: str, eager: bool):
    from speculators.losses import resolve_loss_config

    loss_config = resolve_loss_config("kl_div", loss_impl)

    def forward_loss(x: dict) -> torch.Tensor:
        kwargs = dict(
            hidden_states=x["aux_hidden"],
            input_ids=x["input_ids"],
            document_ids=x["segment_ids"],
            loss_mask=x["loss_mask"],
            position_ids=x["position_ids"] + 1,
            verifier_last_hidden_states=x["final_hidden"],
            ttt_steps=ttt,
            ttt_step_loss_decay=1.0,
            loss_config=loss_config,
        )
        if eager:
            with torch.compiler.set_stance("force_eager"):
                return model(**kwargs)[1]
        return model(**kwargs)[1]

    return forward_loss
