"""Publish an export on the Hugging Face Hub: ``export.push_to_hub=<org/name>`` on train.py,
``push_to_hub=<org/name>`` on ``python export.py``.

Two steps, far apart in time on purpose:

- ``preflight`` runs before any work (before training, before an export is written): the repo id
  is well formed, the Hub is not switched off (HF_HUB_OFFLINE), a token is there (huggingface_hub's
  own ``get_token``: HF_TOKEN or the file ``hf auth login`` writes), the endpoint (HF_ENDPOINT, else
  huggingface.co) answers within a few seconds, and it accepts the token. A run that could not
  publish its head fails in seconds, naming what is missing, instead of after hours of training.
- ``push`` uploads the export folder in one commit: every file a user needs (weights, config.json,
  eagle3_meta.json with its training record, acceptance.json/.png, serving.json), the engine logs and
  W&B files left out, and the model card (README.md) written for the Hub: its ``vllm serve``
  command names the repo instead of the local directory. No path of this machine is uploaded, and
  the previous head's files the new export lacks are deleted in the same commit (what is uploaded
  and deleted: eagle3/serving/hub_upload.py). The repo is created private unless
  ``hub_private=false`` (an existing repo keeps its visibility).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from eagle3.serving.hub_upload import operations, upload_paths, uploads

__all__ = ["HubPushError", "HubTarget", "preflight", "publish_lines", "push", "push_line", "upload_paths"]

CHECK_TIMEOUT_S = 5.0  # a reachable Hub answers in well under a second; a missing network never does


class HubPushError(RuntimeError):
    """The export cannot be published: no token, no network, a refused token or a bad repo id."""


@dataclass(frozen=True)
class HubTarget:
    repo_id: str
    private: bool
    endpoint: str
    user: str  # whom the Hub knows the token as


def hub_endpoint() -> str:
    """HF_ENDPOINT as huggingface_hub reads it (its constant is fixed at import), else the Hub."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def preflight(repo_id: str, private: bool = True, key: str = "push_to_hub", note: str = "") -> HubTarget:
    """Everything a push needs, checked now: raises HubPushError naming ``key`` and what is
    missing (the login command, the endpoint it could not reach), ``note`` appended (what the
    caller did not do because of it)."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    where, end = f"{key}={repo_id}", f"; {note}" if note else ""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubPushError(f"{where}: expected a Hub repo id <org>/<name>, got {repo_id!r} ({e})") from None
    if "/" not in repo_id:
        raise HubPushError(
            f"{where}: expected a Hub repo id <org>/<name> (the user or organisation first), got {repo_id!r}"
        )
    if constants.HF_HUB_OFFLINE:
        raise HubPushError(f"{where}: HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it to publish{end}")
    token = get_token()
    if not token:
        raise HubPushError(
            f"{where}: no Hugging Face token: log in with `hf auth login` (`huggingface-cli login` in older "
            f"huggingface_hub releases) or set HF_TOKEN to a token with write access{end}"
        )
    endpoint = hub_endpoint()
    _check_reachable(endpoint, where, end)
    return HubTarget(repo_id, bool(private), endpoint, _whoami(endpoint, token, where, end))


def _check_reachable(endpoint: str, where: str, end: str) -> None:
    """Any HTTP answer counts (the Hub's front page, an error page): only no answer is refused."""
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=CHECK_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise HubPushError(
            f"{where}: the Hugging Face Hub at {endpoint} could not be reached within {CHECK_TIMEOUT_S:.0f} s "
            f"({type(reason).__name__}: {reason}); check the network (or HF_ENDPOINT){end}"
        ) from None


def _whoami(endpoint: str, token: str, where: str, end: str) -> str:
    """Whom the Hub knows the token as; a refused or read-only token is refused here."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    login = "log in again with `hf auth login` or set HF_TOKEN to a token with write access"
    try:
        info = HfApi(endpoint=endpoint).whoami(token=token)
    except HfHubHTTPError as e:
        raise HubPushError(f"{where}: {endpoint} refused the token ({str(e).splitlines()[0]}): {login}{end}") from None
    except Exception as e:  # noqa: BLE001 - a timeout or a broken answer: the token could not be checked
        raise HubPushError(f"{where}: could not check the token at {endpoint} ({type(e).__name__}: {e}){end}") from None
    role = ((info.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubPushError(f"{where}: the token of {info.get('name')} is read-only: {login}{end}")
    return str(info.get("name", "unknown"))


def push(export_dir: str | Path, target: HubTarget) -> str:
    """Upload ``export_dir`` to ``target`` in one commit (hub_upload: the files as the Hub gets them,
    the previous head's the export lacks deleted); returns the repo's URL."""
    from huggingface_hub import HfApi

    from eagle3.serving.hub_upload import hub_config

    export_dir = Path(export_dir)
    api = HfApi(endpoint=target.endpoint)
    url = api.create_repo(target.repo_id, private=target.private, exist_ok=True, repo_type="model")
    remote = api.list_repo_files(target.repo_id, repo_type="model")
    name = hub_config(export_dir)["speculators_config"]["verifier"]["name_or_path"]
    api.create_commit(
        target.repo_id,
        operations=operations(uploads(export_dir, target.repo_id), remote),
        commit_message=f"EAGLE-3 head for {name}",
        repo_type="model",
    )
    return str(url)


def push_line(url: str, target: HubTarget) -> str:
    visibility = "private" if target.private else "public"
    return f"pushed to the Hub: {url} ({visibility} when created; as {target.user})"


def publish_lines(
    export_dir: str | Path, repo_id: str | None, private: bool, key: str, retry: str
) -> tuple[list[str], str | None]:
    """train.py's upload after its export: (the lines to print, why it failed or None). The
    checks run again (hours may have passed since the preflight); a failure leaves the export
    whole and names ``retry``, the command that uploads it later."""
    if not repo_id:
        return [], None
    try:
        target = preflight(repo_id, private, key)
        return [push_line(push(export_dir, target), target)], None
    except Exception as e:  # noqa: BLE001 - the run's work is saved: say why and how to retry
        reason = str(e) if isinstance(e, HubPushError) else f"{key}={repo_id}: {type(e).__name__}: {e}"
        failed = f"{reason.rstrip('.')}. The export is whole at {export_dir}; upload it later with: {retry}"
        return [f"push to the Hub failed: {failed}"], failed
