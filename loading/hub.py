"""What must hold before a hub model loads: its files are on this machine or the hub can be
reached.

Without this check, a hub id that is not cached on an offline machine makes ``from_pretrained``
retry for most of a minute before it blames ``model_index.json`` or ``trust_remote_code``.
Adapters (``pipelines/``) and reward models (``reward_models/``) call
``require_local_or_reachable`` before ``from_pretrained`` / ``hf_hub_download``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "true", "yes", "on"}


class ModelNotCachedError(RuntimeError):
    """A hub model is not in the local cache and the hub cannot be reached (offline)."""


def require_local_or_reachable(
    model: str | os.PathLike[str] | None, how_local: str, filename: str | None = None
) -> None:
    """Raise ``ModelNotCachedError`` quickly when ``model`` must come from the hub, is not in
    the local cache, and the hub cannot be reached; do nothing otherwise.

    A local path, a string that is not a hub id (the loader then reports the missing path), a
    cached repository (``filename`` of it when given, else any snapshot) and a reachable hub all
    pass. Unreachable means ``HF_HUB_OFFLINE`` is set or the hub's endpoint (through the
    configured proxy, if any) does not answer within ``PROBE_TIMEOUT_S`` seconds.

    Args:
        model: hub id or local path, as given to ``from_pretrained``.
        how_local: the setting that takes a local directory instead, for the message (e.g.
            ``--set policy.pretrained=DIR``).
        filename: the one file of the repository that will be downloaded (``hf_hub_download``).
    """
    if model is None or Path(model).expanduser().exists():
        return
    repo = str(model)
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        return
    if _cached(repo, filename):
        return
    offline = _offline()
    reason = "HF_HUB_OFFLINE is set" if offline else _unreachable()
    if reason is None:
        return
    from huggingface_hub import constants

    target = f"{repo}/{filename}" if filename else repo
    command = f"hf download {repo}" + (f" {filename}" if filename else "")
    raise ModelNotCachedError(
        f"{target} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and the "
        f"hub is unreachable ({reason}). Either download it on a connected machine "
        f"(`{command}`, then copy the cache over or point HF_HOME at it) or pass a local "
        f"directory: {how_local}"
    )


def _cached(repo: str, filename: str | None) -> bool:
    from huggingface_hub import snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError

    if filename is not None:
        return isinstance(try_to_load_from_cache(repo, filename), str)
    try:
        snapshot_download(repo, local_files_only=True)
    except (LocalEntryNotFoundError, OSError):
        return False
    return True


def _offline() -> bool:
    from huggingface_hub import constants

    # The library reads the variable once, at import; a later change of the environment counts.
    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "") in _TRUE


def _unreachable() -> str | None:
    """Why the hub's endpoint cannot be reached, or None when it answers. A request in a daemon
    thread, so that neither a slow DNS lookup nor a stalled connection can hold us longer than
    ``PROBE_TIMEOUT_S``; any HTTP answer, even an error status, means reachable."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
                outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)
        except (OSError, ValueError) as err:
            outcome.append(f"{endpoint} did not answer: {getattr(err, 'reason', err)}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S + 0.5)
    if not outcome:
        return f"{endpoint} did not answer within {PROBE_TIMEOUT_S:.0f} s"
    return outcome[0]


__all__ = [
    "ModelNotCachedError",
    "require_local_or_reachable",
]
