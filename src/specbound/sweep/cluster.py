"""A Dask client for work that outgrows one process: an existing scheduler, or a local cluster of
single-threaded worker processes (sweeps and the study both run their tasks on it)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ..errors import SpecboundError, missing_extra


@contextlib.contextmanager
def dask_client(*, workers: int | None, scheduler: str | None, what: str) -> Iterator[tuple[object, str]]:
    """``(client, description)`` on ``scheduler`` (``tcp://host:port``) or, without one, on a
    LocalCluster of ``workers`` processes with one thread each; closed on exit.  ``what`` names the
    work in the message when dask is missing ("sweep", "study")."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise SpecboundError(missing_extra(f"a Dask {what}", "distributed")) from None
    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            try:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            except (OSError, TimeoutError) as exc:
                raise SpecboundError(
                    f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one with "
                    f"`dask scheduler` or check the address"
                ) from None
            yield client, f"dask {scheduler}"
        else:
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,
                )
            )  # failures are reported by the caller, once
            yield stack.enter_context(Client(cluster)), f"dask LocalCluster({workers} workers)"
