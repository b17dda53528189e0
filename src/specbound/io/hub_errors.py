"""The Hub's failures as one line each, for a fetch (:mod:`.hub_fetch`) and for a stream
(:mod:`.hub_stream`), which fails mid-analysis as well as at the start."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

from ..errors import SpecboundError

# Whether huggingface_hub's own log lines (each retry, each resumed download) and warnings reach
# stderr; off by default: a failure is specbound's one line.  The CLI's --verbose turns it on.
SHOW_DETAILS = False


def show_details(flag: bool) -> None:
    global SHOW_DETAILS
    SHOW_DETAILS = bool(flag)


@contextmanager
def hub_logging():
    """huggingface_hub's log records and warnings inside the block kept off stderr (unless
    :data:`SHOW_DETAILS`): a download cut short is one line, not one per retry.  The records kept
    are on the yielded list (the last becomes a failure's detail)."""
    kept: list[logging.LogRecord] = []
    if SHOW_DETAILS:
        yield kept
        return

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    try:  # its own stderr handler added now, not while the block runs (it would escape the capture)
        from huggingface_hub.utils import logging as hub_logs

        logger = hub_logs.get_logger("huggingface_hub")
    except ImportError:
        logger = logging.getLogger("huggingface_hub")
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [Keep()], False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"huggingface_hub(\.|$)")
            yield kept
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def display(repo_id: str, revision: str) -> str:
    """``org/name``, or ``org/name@revision`` for a revision other than ``main``."""
    return f"{repo_id}@{revision}" if revision != "main" else repo_id


def transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the network failing (the HTTP client's transport errors are not OSError),
    not the server answering with an error (huggingface_hub's HTTP errors are OSErrors too)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        return False
    return isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore", "requests", "urllib3"))


@contextmanager
def hub_errors(repo_id: str, revision: str, endpoint: str | None, doing: str = "fetching"):
    """Every huggingface_hub and network failure inside the block as a one-line SpecboundError
    (``endpoint``: ``HF_ENDPOINT``, None for huggingface.co)."""
    from huggingface_hub import errors as hf_errors

    name, host = display(repo_id, revision), endpoint or "huggingface.co"
    try:
        yield
    except hf_errors.GatedRepoError:
        raise SpecboundError(
            f"{name} is gated on {host}: accept its terms on the model page, then set "
            f"HF_TOKEN to a token of that account (or run `hf auth login`)"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise SpecboundError(
            f"{repo_id} is not a model on {host}: no such repository, or it is private: check "
            f"the id, or set HF_TOKEN to a token that can read it"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise SpecboundError(
            f"{repo_id} has no revision {revision!r} on {host}: pass a branch, tag or commit hash that exists"
        ) from None
    except hf_errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", "?")
        if status in (401, 403, 404):  # a mirror's plain answer, without the Hub's error code
            raise SpecboundError(
                f"{host} answered HTTP {status} for {name}: no such repository, or it is private "
                f"(or gated): check the id, or set HF_TOKEN to a token that can read it"
            ) from None
        raise SpecboundError(
            f"{host} answered HTTP {status} while {doing} {name}: retry later, or "
            f"download it yourself and pass the folder"
        ) from None
    except (OSError, ValueError) as e:  # network down, DNS, a refused connection, a full disk
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise SpecboundError(
            f"could not fetch {name} from {host}: the hub could not be reached, or its answer was "
            f"not what it declared ({detail}); check "
            f"the network (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 and pass a local model folder"
        ) from None
    except Exception as e:  # (the HTTP client's transport errors are not OSError)
        if not transport_error(e):
            raise
        detail = (str(e).splitlines() or [""])[0][:160]
        raise SpecboundError(
            f"could not fetch {name} from {host}: the hub could not be reached, or its answer "
            f"was cut short ({type(e).__name__}{': ' + detail if detail else ''}); check the network "
            f"(or HF_ENDPOINT), or pass a local model folder (--verbose shows each retry)"
        ) from None
