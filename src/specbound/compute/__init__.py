"""Stage 3, compute: the numbers the bounds read, from the layer weights ``archs`` binds.

``spectra.py`` (singular values, numerical rank) and ``eigensolvers.py``, ``layer_spectra.py`` (every
role matrix of a layer), ``distance.py`` and ``low_rank.py`` (``W - W0``, dense or from a LoRA's factors),
``rotary.py`` and ``qk_logit.py`` (the rotary and query-key products), ``latent.py`` (latent attention),
``propagation.py`` (the propagation factors) and ``measures.py`` (:class:`~.measures.ModelMeasures`, what a
bound is a function of); ``torch_kernels.py`` runs the same decompositions with torch when asked.
"""
