"""Stage 2, architectures: each family is a data file (``data/*.json``) in the schema of ``spec.py``,
found by ``model_type`` in ``registry.py``; ``infer.py`` drafts a spec from a checkpoint and
``tensor_names.py`` holds the tensor-name analysis it uses."""

from .registry import builtin_specs, spec_for_config, supported_model_types
from .spec import ArchSpec, load_spec_file, parse_spec

__all__ = ["ArchSpec", "builtin_specs", "load_spec_file", "parse_spec", "spec_for_config", "supported_model_types"]
