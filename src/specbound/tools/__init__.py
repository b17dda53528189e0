"""Stage 10, tools: commands over the whole library, for maintainers and for trying it offline.

``bench.py``, ``bench_ab.py``, ``bench_threads.py`` and ``bench_machine.py`` (``specbound bench``: timings
and the machine they ran on), ``doc_pages.py`` (``specbound docs``), ``doc_tables.py`` (the docs' generated
tables), ``miniatures.py`` and ``synthetic.py`` (random checkpoints with real layouts, to try sweeps offline).
"""
