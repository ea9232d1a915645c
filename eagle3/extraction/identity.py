"""What identifies an extracted dataset: one fingerprint, computed the same way by
extract.py (to name the directory it writes) and train.py (to find it from config alone).

It holds what changes the stored bytes and nothing else, so a dataset extracted on one
machine is found on another, and moving the model or the chat file changes nothing:

- the model by content: config.json, the tokenizer files and a sampled hash of each weight
  file (``hashing.sampled_file_sha``: 4 MiB of each, not a full read of many GB), never its
  directory;
- the chat data by content: the sha256 of the file (or of every file of a directory), cached
  by path + size + mtime under ``paths.cache_dir`` so it is hashed once, and the file's name
  (rows without an id are named after it), never its path. A hub dataset (``data=hf`` with
  ``data.hf_name``) by name, config, split and revision;
- the data settings that shape samples, the layer ids, the capture dtype, a chat template
  override, and the storage format when it is not ``exact`` (so the datasets named before the
  format existed keep their names, and an online dataset, which stores no states, has none);
- the served target's quantization (model.quantization, vLLM's name) when it is set: a head
  trained on an FP8 target's states is another dataset than one of the bf16 target's, and the
  datasets named before the option (null) keep their names. A checkpoint's own
  quantization_config is in its weights' hash already; the manifest's provenance names it
  (``served_target``).

Which engine regenerated the answers is not in it (``data.regen_backend=auto`` resolves per
machine): extraction records it in the manifest's ``provenance``, train.py prints it.
Datasets named by the first scheme (model directory name, chat file path and resolved engine
in the fingerprint) are still found where they were written, and named by the error otherwise
(eagle3/extraction/locate.py finds a config's dataset).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config.dataset import DataConfig
from eagle3.config.schema import plain
from eagle3.config.target import ModelConfig
from eagle3.data.hf_source import HF_FIELDS
from eagle3.store import FingerprintMismatchError, Manifest, StoreError, dataset_dir, dataset_fingerprint
from eagle3.store.layout import MANIFEST
from eagle3.store.storage_format import StorageFormat
from eagle3.target_model.generate.common import content_cache, weights_identity
from eagle3.target_model.quantization import served_quantization, vllm_name
from eagle3.util.hashing import ContentShaCache, file_sha256, file_short_sha, short_sha, tree_sha

FINGERPRINT_VERSION = 2
LEGACY_VERSION = 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model")
# how answers are generated, not what they are: the engine (recorded in the manifest instead),
# the batch, the KV-cache shape
_REGEN_HOW = ("regen_backend", "regen_batch_size", "regen_static_cache")
CHAT_LOCATION = ("content_sha", "file_name")  # what cannot be known without the chat data at hand
_SELF_PROMPT_FIELDS = ("topics", "prompt_temperature", "prompt_max_tokens")  # a mixture's self_prompts only


class DatasetNotFound(FileNotFoundError):
    pass


@dataclass(frozen=True)
class DatasetIdentity:
    """What a dataset is made of, and where datasets live: the target (its config group and the
    directory its weights were materialised in), the chat data and its settings, the captured
    layer ids and dtype; ``datasets_dir`` holds the datasets, ``cache_dir`` the content-hash cache.
    The stages build it from the whole config (eagle3/stages/narrow.py)."""

    model: ModelConfig
    target_dir: str
    data: DataConfig
    layer_ids: tuple[int, ...]
    capture_dtype: str
    datasets_dir: str
    cache_dir: str
    # data fields named otherwise than by their value, where the stages sized the data (a time
    # budget: by the budget asked, not the count the time shares derive from rates; eagle3/stages/narrow.py)
    named_by: dict[str, Any] | None = None
    # capture.storage and capture.teacher_topk: how the shards hold the states (eagle3/store/storage_format.py)
    storage: StorageFormat = StorageFormat()

    @property
    def prefix(self) -> str:
        """The directory name's readable part: model and data preset."""
        return f"{self.model.name}-{self.data.name}"


def _content_sha(path: Path) -> str:
    return file_sha256(path)[:16]


def model_identity(target_dir: str | Path, cache: ContentShaCache, *, regenerate: bool) -> dict[str, Any]:
    d = Path(target_dir)
    ident: dict[str, Any] = {
        "config_sha": file_short_sha(d / "config.json"),
        "weights": weights_identity(d, cache),  # the one hash of the weights (the answer cache keys by it too)
    }
    if regenerate:  # generate's defaults (penalties, end tokens) come from this file
        ident["generation_config_sha"] = file_short_sha(d / "generation_config.json")
    return ident


def weights_mismatch(
    dataset_dir: Path, manifest: Manifest, target_dir: str | Path, cache_dir: str | Path
) -> str | None:
    """How the weights a dataset was extracted from (the sampled hashes its manifest holds,
    ``fingerprint_inputs.model.weights``) differ from the target's in ``target_dir``: the file,
    the field, expected and got, for the weight files that differ. None: the same weights, or a
    manifest of the first scheme, which holds no weights (``recorded_weights`` says which)."""
    theirs = recorded_weights(manifest)
    if theirs is None:
        return None
    ours = weights_identity(target_dir, content_cache(cache_dir))
    if theirs == ours:
        return None
    names = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
    expected, got = ({n: w.get(n) for n in names} for w in (ours, theirs))
    return (
        f"{Path(dataset_dir) / MANIFEST}: fingerprint_inputs.model.weights: expected {expected} "
        f"(the target's, {target_dir}), got {got}"
    )


def recorded_weights(manifest: Manifest) -> dict[str, str] | None:
    """The weights' sampled hashes a dataset's manifest holds (None: a first-scheme manifest)."""
    model = manifest.fingerprint_inputs.get("model")
    weights = model.get("weights") if isinstance(model, dict) else None
    return dict(weights) if isinstance(weights, dict) else None


def chat_identity(source: str, path: str | None, cache: ContentShaCache) -> dict[str, Any]:
    """{"file_name", "content_sha"} of the chat data; both None for a hub dataset (named by
    data.hf_* instead). Raises DataError when the file is not there."""
    from eagle3.data.loaders import resolve_path

    file = resolve_path(source, path)
    if file is None:
        return {"file_name": None, "content_sha": None}
    sha = (
        tree_sha(file, lambda p: cache.sha(p, "sha256", _content_sha))
        if file.is_dir()
        else cache.sha(file, "sha256", _content_sha)
    )
    return {"file_name": file.name, "content_sha": sha}


def fingerprint_inputs(identity: DatasetIdentity, *, chat_content: bool = True) -> dict[str, Any]:
    """Everything that changes the stored bytes, and nothing that does not (batch sizes,
    engines and topology give the same hidden states within tolerance). ``chat_content=False``:
    the chat file is not hashed (its two fields are None), for a lookup without it."""
    cache = content_cache(identity.cache_dir)
    data: dict[str, Any] = plain(identity.data)
    source, path = data["source"], data.get("path")
    for key in ("name", "path", "max_bad_fraction", *_REGEN_HOW):  # the name is in the directory's prefix, for people
        data.pop(key, None)
    _drop_unset_chat_style(data)
    regenerate = bool(data.get("regenerate"))
    if not regenerate:
        data = {k: v for k, v in data.items() if not k.startswith("regen_")}
    if data.get("regen_num_answers") == 1:  # one answer: the same samples as before the option
        data.pop("regen_num_answers")
    mixture = data.pop("mixture", None)  # absent (null): the fingerprints of before the option
    if mixture:  # the sources' own fields name the data; data.source, path and hf_* are unused
        data = {k: v for k, v in data.items() if k not in HF_FIELDS and k != "source"}
        data["mixture"] = [_mixture_source_identity(e, cache, chat_content) for e in mixture]
    else:
        if source != "hf":
            data = {k: v for k, v in data.items() if k not in HF_FIELDS}
        data.update(chat_identity(source, path, cache) if chat_content else dict.fromkeys(CHAT_LOCATION))
    data.update(identity.named_by or {})
    return {
        "schema_version": FINGERPRINT_VERSION,
        "model": {
            "num_layers": identity.model.num_layers,
            "hidden_size": identity.model.hidden_size,
            **model_identity(identity.target_dir, cache, regenerate=regenerate),
        },
        "data": data,
        **_capture_and_tokenizer(identity),
        # the format when it is not exact, its top-k when set: the names of before the format existed
        **identity.storage.fingerprint_inputs(),
        **_quantization(identity),
    }


def _quantization(identity: DatasetIdentity) -> dict[str, Any]:
    """{"quantization": vLLM's name} of model.quantization, {} when null (the names of before)."""
    name = vllm_name(identity.model.quantization)
    return {"quantization": name} if name else {}


def _drop_unset_chat_style(data: dict[str, Any]) -> None:
    """data.chat_template_kwargs and data.system_prompt leave the fingerprint when unset (empty,
    null): the datasets named before the options keep their names; set, they name another dataset."""
    if not data.get("chat_template_kwargs"):
        data.pop("chat_template_kwargs", None)
    if data.get("system_prompt") is None:
        data.pop("system_prompt", None)


def _mixture_source_identity(entry: dict[str, Any], cache: ContentShaCache, chat_content: bool) -> dict[str, Any]:
    """One data.mixture source as its dataset's identity holds it: name, kind, weight, cap, its
    chat data by content (as ``chat_identity``) and only the fields its kind reads."""
    kind = entry["source"]
    out = {k: v for k, v in entry.items() if k != "path"}
    for key in ("chat_template_kwargs", "system_prompt"):  # a mode of its own names it; unset: names kept
        if not out.get(key):
            out.pop(key, None)
    if kind != "hf":
        out = {k: v for k, v in out.items() if k not in HF_FIELDS}
    if kind == "self_prompts":
        out["topics"] = list(out["topics"]) if out.get("topics") else None  # null: the built-in ones
        return out
    for key in _SELF_PROMPT_FIELDS:
        out.pop(key, None)
    located = chat_identity(kind, entry.get("path"), cache) if chat_content else dict.fromkeys(CHAT_LOCATION)
    return {**out, **located}


def _capture_and_tokenizer(identity: DatasetIdentity) -> dict[str, Any]:
    """The inputs both schemes share: layers, dtype, tokenizer files, a chat template override."""
    d, template = Path(identity.target_dir), identity.model.chat_template
    return {
        "layer_ids": [int(i) for i in identity.layer_ids],
        "capture_dtype": identity.capture_dtype,
        "tokenizer": {f: file_short_sha(d / f) for f in _TOKENIZER_FILES if (d / f).is_file()},
        "chat_template_override": short_sha(template.encode()) if template else None,
    }


def dataset_path(identity: DatasetIdentity) -> Path:
    inputs = fingerprint_inputs(identity)
    return dataset_dir(identity.datasets_dir, identity.prefix, dataset_fingerprint(inputs))


def token_fingerprint_inputs(identity: DatasetIdentity) -> dict[str, Any]:
    """An online dataset's identity: the stored dataset's inputs (the same samples, layers and
    dtype the trainer will capture), marked as holding token ids only."""
    stored = fingerprint_inputs(identity)
    stored.pop("storage", None)  # the trainer computes the states: no storage format
    stored.pop("teacher_topk", None)
    return {**stored, "hidden_states": "online"}


def token_dataset_path(identity: DatasetIdentity, inputs: dict[str, Any]) -> Path:
    """Where the online dataset with these inputs (``token_fingerprint_inputs``) lives: beside the
    stored ones, "-tokens" in its name."""
    return dataset_dir(identity.datasets_dir, f"{identity.prefix}-tokens", dataset_fingerprint(inputs))


def provenance(identity: DatasetIdentity, regen_engine: str | None) -> dict[str, Any]:
    """What the manifest records beside the fingerprint: the engine that wrote the answers
    (None: the chat data's own), and where the chat data and the model were read from."""
    path = identity.data.path
    model = Path(identity.target_dir)
    out: dict[str, Any] = {
        "regen_engine": regen_engine,
        "target_dir": str(model.resolve()) if model.is_dir() else identity.target_dir,
        "data_path": str(Path(path).expanduser().resolve()) if path else None,
    }
    served = served_quantization(identity.model.quantization, identity.target_dir)
    if served.name:  # what the target ran in: the flag's, or the checkpoint's own quantization_config
        out["served_target"] = served.to_dict()
    mixture = plain(identity.data).get("mixture")
    if mixture:  # each source's file (the counts per source come with the samples: mixture_counts)
        out["data_path"] = None
        out["mixture_paths"] = {
            e["name"]: str(Path(e["path"]).expanduser().resolve()) if e.get("path") else None for e in mixture
        }
    return out


def mixture_counts(data: DataConfig, samples: list[Any], val_ids: list[str]) -> dict[str, Any]:
    """``provenance.mixture`` of a dataset of data.mixture ({} without one): per source, its
    weight, the samples the dataset holds and how many are validation ones."""
    from eagle3.data.mixture import counts_of, weights

    mixture = plain(data).get("mixture")
    return {"mixture": counts_of(samples, val_ids, weights(mixture))} if mixture else {}


def budget_cut(
    planned_conversations: int | None,
    rendered_samples: int,
    samples: int,
    *,
    regeneration: str | None,
    capture: str | None = None,
) -> dict[str, Any]:
    """What the manifest records of a dataset a time budget cut short (``provenance.budget_cut``):
    the conversations the time shares asked for, the samples rendered from what was answered in time, why
    regeneration and capture each stopped (None: that part was not cut) and the samples kept."""
    return {
        "planned_conversations": planned_conversations,
        "rendered_samples": rendered_samples,
        "regeneration": regeneration,
        "capture": capture,
        "samples": samples,
    }


def check_regen_engine(dataset_dir: Path, engine: str | None) -> None:
    """An unfinished dataset whose answers so far came from one engine is not resumed with
    another's (the engine is no part of the fingerprint)."""
    try:
        had = Manifest.read(dataset_dir).provenance.get("regen_engine")
    except StoreError:  # nothing there yet (or unreadable: the writer says why)
        return
    if had and engine and had != engine:
        raise FingerprintMismatchError(
            f"{dataset_dir / MANIFEST}: provenance.regen_engine: expected {engine} (what data.regen_backend resolves to "
            f"here), got {had}: its samples so far hold {had}'s answers. Resume with data.regen_backend={had}, "
            f"or delete {dataset_dir} to extract it again with {engine}"
        )


def regen_note(manifest: Manifest) -> str:
    """Where the dataset's answers and hidden states came from: the regeneration engine, and every
    capture route its runs used (a dataset resumed or repaired under another backend names each)."""
    from eagle3.store.provenance import capture_routes

    engine = manifest.provenance.get("regen_engine")
    routes = capture_routes(manifest.provenance)
    captured = f"; hidden states captured by {', then '.join(routes)}" if routes else ""
    return (f"answers regenerated by {engine}" if engine else "answers as in the chat data") + captured


def legacy_fingerprint_inputs(identity: DatasetIdentity) -> dict[str, Any]:
    """The first scheme's inputs (model directory name, chat path and resolved engine in them),
    to find datasets it named."""
    from eagle3.target_model.generate.common import resolve_backend

    d = Path(identity.target_dir)
    data: dict[str, Any] = plain(identity.data)
    data.pop("mixture", None)  # the first scheme predates mixtures (and found none)
    _drop_unset_chat_style(data)
    for key in ("regen_batch_size", "regen_static_cache", *HF_FIELDS):
        data.pop(key, None)
    if data.get("regen_num_answers") == 1:  # the first scheme knew one answer only
        data.pop("regen_num_answers")
    if data.get("regenerate"):
        data["regen_backend"] = resolve_backend(data["regen_backend"])
    else:
        data.pop("regen_backend", None)
        data.pop("regen_max_turns", None)
    return {
        "schema_version": LEGACY_VERSION,
        "model": {
            "name": identity.model.name,
            "dir": d.name,
            "config_sha": file_short_sha(d / "config.json"),
            "num_layers": identity.model.num_layers,
            "hidden_size": identity.model.hidden_size,
        },
        "data": data,
        **_capture_and_tokenizer(identity),
        **_quantization(identity),  # the first scheme's datasets are all of the unquantized target
    }
