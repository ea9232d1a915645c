"""Where a model named in the config lives on this machine: a local directory as given, or a
Hugging Face hub id resolved through the local hub cache (downloaded when online).

One resolver for every reader: compose-time facts (eagle3/stages/compose.py reads only
config.json), the target's materialisation (eagle3/target_model/resolve.py) and `train.init_from`
(eagle3/training/init_from.py). Everything downstream (transformers, vLLM) then loads the
returned local directory, so a pinned revision holds for every stage.

HF_HUB_OFFLINE, HF_HUB_CACHE and HF_HOME are read when a model is resolved (huggingface_hub
reads them once, at its import): a notebook or test that sets them later is honoured too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

_TRUE = {"1", "ON", "YES", "TRUE"}


class HubError(RuntimeError):
    pass


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_cache_dir() -> Optional[str]:
    """The hub cache the environment names now; None: huggingface_hub's own default."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return None


def _where(name: str, revision: Optional[str]) -> str:
    return f"{name!r} (revision {revision or 'main'})"


def _download_hint(name: str, revision: Optional[str]) -> str:
    pin = f" --revision {revision}" if revision else ""
    return f"`hf download {name}{pin}`"


def _local_or_hub(name: Optional[str], revision: Optional[str], field: str, revision_field: str) -> Optional[Path]:
    """The local directory `name` names (None: `name` is a hub id); refuses what is neither."""
    if not name:
        raise HubError(f"{field}: expected a local model directory or a hub id (org/name), got nothing")
    path = Path(str(name)).expanduser()
    if path.is_dir():
        if revision:
            raise HubError(
                f"{field}={name!r} is a local directory, but {revision_field}={revision!r} pins a hub "
                f"revision: drop {revision_field}, or give the hub id instead of the directory"
            )
        return path
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(name))
        looks_like_path = str(name).startswith((".", "/", "~")) or str(name).count("/") > 1
    except HFValidationError:
        looks_like_path = True
    if looks_like_path:
        raise HubError(f"{field}={name!r}: no such directory, and not a hub id (expected org/name)")
    return None


def _hub_failure(e: Exception, name: str, revision: Optional[str], field: str) -> HubError:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = _where(name, revision)
    cache = f"the hub cache {hub_cache_dir()}" if hub_cache_dir() else "the default hub cache (HF_HOME/hub)"
    if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
        return HubError(f"{field}={where}: the repository has no config.json; is it a transformers model?")
    if isinstance(e, LocalEntryNotFoundError):
        if hub_offline():
            return HubError(
                f"{field}={where} is not in {cache}, and HF_HUB_OFFLINE=1 forbids "
                f"downloading it: run once online (unset HF_HUB_OFFLINE), or download it with "
                f"{_download_hint(name, revision)}, or give a local directory"
            )
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return HubError(
            f"{field}={where}: not in {cache}, and the hub could not be reached ({reason}); "
            f"check the network, or download it with {_download_hint(name, revision)}"
        )
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{field}={where}: the hub has no such revision (a branch, tag or commit of {name!r})")
    if isinstance(e, (RepositoryNotFoundError, GatedRepoError)):
        return HubError(
            f"{field}={where}: the hub refused it (no such repository, or private/gated: log in "
            f"with `hf auth login` or set HF_TOKEN, and accept its licence on the hub)"
        )
    return HubError(f"{field}={where}: {type(e).__name__}: {e}")


def resolve_model_dir(
    name: Optional[str],
    revision: Optional[str] = None,
    *,
    field: str = "model.path",
    revision_field: str = "model.revision",
) -> Path:
    """The local directory holding `name`: itself when it is a directory, else the hub cache's
    snapshot of `revision` (downloaded when online and missing). `field`/`revision_field`
    name the config keys in errors."""
    local = _local_or_hub(name, revision, field, revision_field)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(str(name), revision=revision, cache_dir=hub_cache_dir(), local_files_only=hub_offline())
        )
    except (LocalEntryNotFoundError, HfHubHTTPError) as e:
        raise _hub_failure(e, str(name), revision, field) from e


def model_config_file(
    name: Optional[str],
    revision: Optional[str] = None,
    *,
    field: str = "model.path",
    revision_field: str = "model.revision",
) -> Path:
    """`name`'s config.json without the weights (compose time): the local directory's file (which
    may not exist: the caller says so), or the hub's file of `revision`, cached."""
    local = _local_or_hub(name, revision, field, revision_field)
    if local is not None:
        return local / "config.json"
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            hf_hub_download(
                str(name), "config.json", revision=revision, cache_dir=hub_cache_dir(), local_files_only=hub_offline()
            )
        )
    except (LocalEntryNotFoundError, HfHubHTTPError) as e:
        raise _hub_failure(e, str(name), revision, field) from e
