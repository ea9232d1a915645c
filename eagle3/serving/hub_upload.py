"""What a push to the Hub uploads and deletes, decided without the network (hub_push.py sends it).

- ``uploads``: the export's files as the Hub gets them (eagle3/serving/export_dir.py lists which):
  the local-only folders left out; no path of this machine in any of them: the card rendered for
  the Hub (model_card.card_text with the repo id), config.json's verifier the target's Hub id, else
  its name (the local export keeps the path vLLM loads here), and in every other JSON file
  (acceptance.json, serving.json, eagle3_meta.json's training record) each absolute path made
  relative: to the export where it lies inside it, else its last name.
- ``operations``: the commit: those files added, and every file of the repo's previous head that is
  an export's file (export_files.EXPORT_FILES) and not uploaded now deleted, so a new head never
  sits beside the old one's acceptance.json, acceptance.png or serving.json. Files of the repo
  that are no export's (a .gitattributes, a user's notes) are left.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Union

from eagle3.draft.export_files import CARD, CONFIG, EXPORT_FILES, LOCAL_ONLY
from eagle3.serving.training_record import read_record

Upload = Union[bytes, Path]  # new contents, or the file as it is

# an absolute path in a text: one the card quotes in backticks (spaces and all), else "/" or "~/"
# not inside a word, a URL or a relative path, then its characters up to a space, a quote or
# markdown's and JSON's punctuation
_QUOTED_PATH = re.compile(r"(?<=`)~?/[^`\n]+(?=`)")
_ABS_PATH = re.compile(r"(?<![\w.:/~-])~?/[^\s'\"`<>|,;()\[\]{}*]+")


def upload_paths(export_dir: Path) -> list[Path]:
    """The export's files that are published (relative paths), the local-only ones left out."""
    files = sorted(p.relative_to(export_dir) for p in export_dir.rglob("*") if p.is_file())
    return [p for p in files if not any(part.startswith(".") for part in p.parts) and p.parts[0] not in LOCAL_ONLY]


def uploads(export_dir: str | Path, repo_id: str) -> dict[str, Upload]:
    """path in the repo -> what is uploaded there (the module's docstring)."""
    from eagle3.serving.model_card import card_text

    export_dir = Path(export_dir)
    out: dict[str, Upload] = {}
    for rel in upload_paths(export_dir):
        name, path = rel.as_posix(), export_dir / rel
        if name == CARD:
            continue
        if name == CONFIG:
            out[name] = _json_bytes(hub_config(export_dir), export_dir)
        elif rel.suffix == ".json":
            out[name] = _json_bytes(json.loads(path.read_text()), export_dir)
        else:
            out[name] = path
    out[CARD] = strip_local_paths(card_text(export_dir, model_ref=repo_id), export_dir).encode()
    return out


def hub_config(export_dir: Path) -> dict[str, Any]:
    """config.json with its verifier as the Hub names the target: its Hub id where known (the export's
    own name for it, or the model's hub_id the training recorded), else its name."""
    from eagle3.serving.model_card import hub_id

    config = json.loads((export_dir / CONFIG).read_text())
    verifier = config["speculators_config"]["verifier"]
    local, record = str(verifier["name_or_path"]), read_record(export_dir)
    name = (record.get("target") or {}).get("name") or Path(local).name
    verifier["name_or_path"] = hub_id(local, record) or str(name)
    return config


def operations(files: dict[str, Upload], remote: list[str]) -> list[Any]:
    """The commit pushing ``files`` (``uploads``) over a repo holding ``remote``: each file added,
    the previous head's export files it does not hold deleted (the module's docstring)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    adds = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=data if isinstance(data, bytes) else str(data))
        for name, data in sorted(files.items())
    ]
    stale = sorted(f for f in remote if f not in files and f.split("/")[0] in EXPORT_FILES)
    return [*adds, *(CommitOperationDelete(path_in_repo=f) for f in stale)]


def strip_local_paths(text: str, export_dir: Path) -> str:
    """``text`` with each absolute path relative to the export where it lies in it ("." for the
    export itself), else its last name."""
    roots = {str(export_dir.expanduser()), str(export_dir.expanduser().resolve())}

    def relative(m: re.Match[str]) -> str:
        path = m.group(0).rstrip(".:")
        tail = m.group(0)[len(path) :]
        for root in sorted(roots, key=len, reverse=True):
            if path == root or path.startswith(root + "/"):
                return (path[len(root) :].lstrip("/") or ".") + tail
        return (Path(path).name or ".") + tail

    if text.startswith(("/", "~/")) and "\n" not in text:  # a value that is a path (spaces and all)
        return _QUOTED_PATH.sub(relative, f"`{text}`")[1:-1]
    return _ABS_PATH.sub(relative, _QUOTED_PATH.sub(relative, text))


def _json_bytes(value: Any, export_dir: Path) -> bytes:
    return json.dumps(_strip(value, export_dir), indent=2).encode()


def _strip(value: Any, export_dir: Path) -> Any:
    if isinstance(value, str):
        return strip_local_paths(value, export_dir)
    if isinstance(value, dict):
        return {_strip(k, export_dir): _strip(v, export_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, export_dir) for v in value]
    return value
