"""The on-policy objective's walk: the loss (forward + backward) with the rounds walked as tensors
(``eagle3.draft.replay.round_starts``, what ``onpolicy_cells`` reads) against the host walk it
replaced (``walk_rounds``, one Python step per round), each against the supervised
``eagle3_loss`` on the same random logits, all in one run. The host walk is put back by
monkeypatching ``eagle3.draft.onpolicy.round_starts`` inside this script; eagle3 is untouched.
The draft's logits follow the target's shifted rows plus noise (``--noise``), so rounds accept
some drafts and reject others as a trained head's do. Prints a markdown table of best-of times
and the ratios.

    python bench/onpolicy_walk.py --batch 1 --tokens 4096 --vocab 4096 --k 3 --out outputs/bench/onpolicy_walk.json

``--compile`` adds both losses torch.compiled (dynamic=False, as train.compile): what the tensor
walk allows, where the host walk kept the on-policy step eager.
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import add_out, write_json  # beside this file; puts the checkout on sys.path

import eagle3.draft.onpolicy as onpolicy_module
from eagle3.draft.loss import eagle3_loss
from eagle3.draft.onpolicy import onpolicy_loss
from eagle3.draft.replay import round_starts, walk_rounds


def _host_starts(chain: torch.Tensor, starts_ok: torch.Tensor) -> torch.Tensor:
    """[B, T] bool from walk_rounds' tuples: what onpolicy_cells built before round_starts."""
    starts = torch.zeros_like(starts_ok, dtype=torch.bool)  # [B, T]
    rounds = walk_rounds(chain, starts_ok)
    if rounds:
        rows, ts, _ = zip(*rounds)
        starts[list(rows), list(ts)] = True
    return starts


def _case(batch: int, tokens: int, vocab: int, steps: int, noise: float, samples: int, seed: int):
    """(draft step logits with grad, target logits, answers, segment ids): `samples` packed samples a
    row, each a fifth prompt and the rest answer, the last one's tail padding."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, tokens, vocab, generator=g) * 3  # [B, T, V]
    step_logits = []
    for k in range(steps):
        noisy = torch.roll(target, -(1 + k), dims=1) + noise * torch.randn(batch, tokens, vocab, generator=g)
        step_logits.append(noisy.requires_grad_())  # [B, T, V]: step k agrees with p_{t+1+k} where noise allows
    length = tokens // samples
    pos = torch.arange(tokens)  # [T]
    segments = (pos // length).clamp(max=samples - 1).expand(batch, tokens).clone()  # [B, T]
    segments[:, -length // 4 :] = -1  # padding
    answers = ((pos % length) >= length // 5).expand(batch, tokens) & (segments >= 0)  # [B, T]
    return step_logits, target, answers, segments


def _best_s(repeats: int, fns: dict[str, object]) -> dict[str, float]:
    """Best seconds of each callable, the variants taking turns in every repeat: a drift in the
    machine (another process, the allocator) falls on all of them alike."""
    for fn in fns.values():
        fn()  # type: ignore[operator]  # warm: allocator, thread pool
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--k", type=int, default=3, help="TTT steps and the rounds' num_draft_tokens")
    ap.add_argument("--noise", type=float, default=2.5, help="draft logits' noise over the target's rows")
    ap.add_argument("--samples", type=int, default=4, help="packed samples a row")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--compile", action="store_true", help="also both losses torch.compiled (dynamic=False), as train.compile"
    )
    add_out(ap, required=False)
    args = ap.parse_args()
    steps, target, answers, segments = _case(
        args.batch, args.tokens, args.vocab, args.k, args.noise, args.samples, args.seed
    )
    kw = dict(loss_mask=answers, segment_ids=segments)

    def supervised() -> None:
        loss, _ = eagle3_loss(steps, target, **kw, step_decay=0.8)
        loss.backward()

    def onpolicy() -> torch.Tensor:
        out = onpolicy_loss(steps, target, **kw, num_draft_tokens=args.k, decay=0.8)
        out.loss.backward()
        return out.counts

    counts = onpolicy()
    rounds, accepted = float(counts[0]), float(counts[1])

    def host_onpolicy() -> torch.Tensor:
        onpolicy_module.round_starts = _host_starts  # type: ignore[assignment]  # the host walk, as before
        try:
            return onpolicy()
        finally:
            onpolicy_module.round_starts = round_starts

    if not host_onpolicy().equal(counts):
        raise SystemExit("onpolicy_walk: the host walk's counts differ from the tensor walk's")
    rows = _best_s(
        args.repeats,
        {"supervised": supervised, "onpolicy_tensor_walk": onpolicy, "onpolicy_host_walk": host_onpolicy},
    )
    if args.compile:  # the on-policy loss as one graph: fullgraph makes a host read an error
        sup_graph = torch.compile(lambda: eagle3_loss(steps, target, **kw, step_decay=0.8)[0], dynamic=False)
        op_graph = torch.compile(
            lambda: onpolicy_loss(steps, target, **kw, num_draft_tokens=args.k, decay=0.8).loss,
            dynamic=False,
            fullgraph=True,
        )
        compiled = _best_s(
            args.repeats,
            {"supervised_compiled": lambda: sup_graph().backward(), "onpolicy_compiled": lambda: op_graph().backward()},
        )
        rows.update(compiled)
    chain = torch.randint(0, args.k + 1, (args.batch, args.tokens), generator=torch.Generator().manual_seed(1))
    ok = answers & (segments >= 0)  # [B, T]
    walk = _best_s(
        args.repeats * 4,
        {"walk_tensor": lambda: round_starts(chain, ok), "walk_host": lambda: _host_starts(chain, ok)},
    )
    base = rows["supervised"]
    print(
        f"[B={args.batch}, T={args.tokens}, V={args.vocab}] K={args.k}, {int(rounds)} rounds, accept length "
        f"{1 + accepted / max(rounds, 1):.2f}, best of {args.repeats}, {torch.get_num_threads()} threads"
    )
    print("| loss, forward + backward | ms | / supervised |\n|---|---|---|")
    for name, s in rows.items():
        print(f"| {name} | {s * 1e3:.1f} | {s / base:.2f}x |")
    ratio = rows["onpolicy_host_walk"] / rows["onpolicy_tensor_walk"]
    print(f"on-policy loss, host walk / tensor walk: {ratio:.2f}x")
    if args.compile:
        print(
            "compiled, on-policy / supervised: "
            f"{rows['onpolicy_compiled'] / rows['supervised_compiled']:.2f}x; on-policy eager host walk / "
            f"compiled: {rows['onpolicy_host_walk'] / rows['onpolicy_compiled']:.2f}x"
        )
    print(
        f"the walk alone (random chains): tensor {walk['walk_tensor'] * 1e3:.2f} ms, host "
        f"{walk['walk_host'] * 1e3:.2f} ms, host / tensor {walk['walk_host'] / walk['walk_tensor']:.1f}x"
    )
    write_json(
        args.out,
        {"args": vars(args), "rounds": rounds, "accepted": accepted, "seconds": {**rows, **walk}},
    )


if __name__ == "__main__":
    main()
