"""Stage 7, sweep: many analyses (each one :mod:`specbound.pipeline` run) into a results store.

``sources.py`` (source patterns expanded to checkpoints, sweep config files), ``run.py`` (``specbound sweep``,
here or on a Dask cluster), ``cluster.py`` (the Dask client), ``store.py`` (the results store: one record per
checkpoint and option set) and ``metrics.py`` (the user's own numbers carried into each record).
"""
