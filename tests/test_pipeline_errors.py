"""The pipeline's resource decisions: layers at a time and BLAS threads follow the machine."""



import specbound


def test_auto_jobs_follow_cores_layers_and_memory(tiny_bert_dir, monkeypatch):
    """jobs="auto" (the command line's default): one layer per core, never more than the layers,
    and no more than half the available memory holds at a layer's float64 weights a job."""
    import specbound.pipeline as analysis

    model = analysis.open_model(tiny_bert_dir)
    assert analysis.layer_float64_bytes(model.dims) == 8 * (2 * 32 * 8 * (4 + 4) + 2 * 32 * 48)  # N=32, 4x8, d_ff=48
    per_job = analysis._LAYER_PEAK_FACTOR * analysis.layer_float64_bytes(model.dims)
    monkeypatch.setattr(analysis, "available_cores", lambda: 8)
    monkeypatch.setattr(analysis, "available_memory", lambda: 100 * per_job)
    assert analysis.auto_jobs(model) == 2  # two layers
    monkeypatch.setattr(analysis, "available_memory", lambda: 3 * per_job)
    assert analysis.auto_jobs(model) == 1  # half the memory holds one layer and a half
    assert analysis.auto_jobs(model, readers=2) == 1
    monkeypatch.setattr(analysis, "available_memory", lambda: None)
    monkeypatch.setattr(analysis, "available_cores", lambda: 1)
    assert analysis.auto_jobs(model) == 1
    one = specbound.analyze(tiny_bert_dir, threads=1)
    monkeypatch.setattr(analysis, "available_cores", lambda: 2)
    assert specbound.analyze(tiny_bert_dir, jobs="auto").all_bounds() == one.all_bounds()
