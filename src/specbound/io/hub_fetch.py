"""Hub ids not in the local cache, fetched through ``huggingface_hub``: only what the analysis reads.

What is fetched: ``config.json`` and the safetensors weights (``model.safetensors``, or the shard
index ``model.safetensors.index.json`` and the shards it names).  A ``.bin``, ONNX, GGUF, TF or Flax
duplicate beside them is never fetched.  A PEFT adapter repository: ``adapter_config.json`` and
``adapter_model.safetensors`` (its base is fetched as a hub id of its own).  Each file goes through ``hf_hub_download`` into the usual
cache layout, so a later run finds it offline; a dropped connection resumes where it stopped (a
Range request) and the hub library's progress bar shows.

The environment is read at call time (not at ``huggingface_hub``'s import): ``HF_ENDPOINT`` (a
mirror or a local server), ``HF_TOKEN`` (gated or private repositories), ``HF_HUB_OFFLINE`` (never
touch the network); the cache folder (``HF_HUB_CACHE``, ``HF_HOME``) is the caller's
(:func:`.hub_cache.cache_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecboundError

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # a PEFT adapter repository


def offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _endpoint() -> str | None:
    return (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None  # None: huggingface_hub's own lookup (a stored login)


def needed_files(files: list[str], read_index) -> list[str]:
    """The files of a repository listing (``files``: paths relative to its root) that the analysis
    reads, in download order; ``read_index()`` returns the shard index's ``weight_map`` values once
    the index is fetched.  Raises when the repository holds no config.json or no safetensors."""
    present = set(files)
    if CONFIG not in present and ADAPTER_CONFIG in present:  # a PEFT adapter: merged into its base (io.lora)
        if ADAPTER_WEIGHTS not in present:
            raise SpecboundError(f"a PEFT adapter ({ADAPTER_CONFIG}) without {ADAPTER_WEIGHTS}")
        return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    if CONFIG not in present:
        raise SpecboundError("no config.json")
    if INDEX in present:
        shards = sorted(set(read_index()))
        missing = [s for s in shards if s not in present]
        if missing or not shards:
            raise SpecboundError(f"its {INDEX} names shards the repository does not hold "
                                 f"({', '.join(missing[:3]) or 'none named'})")
        return [CONFIG, INDEX, *shards]
    if SINGLE in present:
        return [CONFIG, SINGLE]
    raise SpecboundError("no safetensors weights (" + (", ".join(sorted(f for f in present if "/" not in f)[:6])
                                                       or "no files") + ")")


def fetch_hub_id(repo_id: str, revision: str, cache: Path) -> Path:
    """Download what the analysis needs of ``repo_id`` at ``revision`` into ``cache``; the snapshot
    folder holding it.  Every failure is a one-line SpecboundError with the fix."""
    name = f"{repo_id}@{revision}" if revision != "main" else repo_id
    if offline():
        raise SpecboundError(f"{name} is not in the local Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                             f"is set: unset HF_HUB_OFFLINE to download it, or pass a local model folder")
    try:
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise SpecboundError(f"{name} is not in the local Hugging Face cache and huggingface_hub is not "
                             f"installed to fetch it: pip install huggingface_hub") from None
    endpoint, token = _endpoint(), _token()
    host = endpoint or "huggingface.co"

    def download(filename: str) -> Path:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=str(cache),
                                    endpoint=endpoint, token=token))

    def read_index() -> list[str]:
        with open(download(INDEX), encoding="utf-8") as f:
            return list(json.load(f).get("weight_map", {}).values())

    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, revision=revision)
        files = [s.rfilename for s in info.siblings or []]
        try:
            wanted = needed_files(files, read_index)
        except SpecboundError as e:
            raise SpecboundError(f"the hub model {name} holds {e}: specbound fetches only config.json and "
                                 f"safetensors weights; download it yourself and pass the folder") from None
        paths = [download(f) for f in wanted]
    except hf_errors.GatedRepoError:
        raise SpecboundError(f"{name} is gated on {host}: accept its terms on the model page, then set "
                             f"HF_TOKEN to a token of that account (or run `hf auth login`)") from None
    except hf_errors.RepositoryNotFoundError:
        raise SpecboundError(f"{repo_id} is not a model on {host} (or it is private): check the id, or set "
                             f"HF_TOKEN to a token that can read it") from None
    except hf_errors.RevisionNotFoundError:
        raise SpecboundError(f"{repo_id} has no revision {revision!r} on {host}: pass a branch, tag or "
                             f"commit hash that exists") from None
    except hf_errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", "?")
        raise SpecboundError(f"{host} answered HTTP {status} while fetching {name}: retry later, or "
                             f"download it yourself and pass the folder") from None
    except (OSError, ValueError) as e:  # network down, DNS, a refused connection, a full disk
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise SpecboundError(f"could not fetch {name} from {host} ({detail}): check the network (or "
                             f"HF_ENDPOINT), or set HF_HUB_OFFLINE=1 and pass a local model folder") from None
    except Exception as e:  # noqa: BLE001  (the HTTP client's transport errors are not OSError)
        if not type(e).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):
            raise
        raise SpecboundError(f"could not fetch {name} from {host} ({type(e).__name__}): check the network "
                             f"(or HF_ENDPOINT), or pass a local model folder") from None
    return paths[0].parent
