"""Stage 1, load: checkpoints in every format as a config plus float64 tensors read one at a time.

:func:`open_checkpoint` (``dispatch.py``) picks the format by the table of ``formats.py``; each
format is one module (``safetensors_file.py``, ``pytorch.py``, ``onnx_graph.py``, ``gguf_file.py``,
``tf_file.py``, ``flax_file.py``) on the :class:`Checkpoint` base (``base.py``); ``hub_cache.py``
resolves hub ids offline and ``shard_index.py`` reads shard indexes.
"""

from .base import FLOAT_DTYPES, Checkpoint, read_config
from .dispatch import open_checkpoint

__all__ = ["Checkpoint", "FLOAT_DTYPES", "open_checkpoint", "read_config"]
