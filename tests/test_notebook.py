"""In Jupyter, as a researcher would: a fresh kernel, the analysis, then each `r.plot.*` call as a
cell's last line must show a PNG (not `<Figure size ...>`), with no `%matplotlib` magic, and a
progress bar must not warn about missing ipywidgets."""

import os
from pathlib import Path

import pytest

import specbound

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

SRC = str(Path(specbound.__file__).resolve().parents[1])


def test_every_figure_call_shows_an_image_in_a_fresh_kernel(tiny_bert_dir, tmp_path):
    cells = [
        f"import specbound\nr = specbound.analyze({str(tiny_bert_dir)!r}, progress=True)",
        "r",
        "r.plot.spectra()",
        "r.plot.contributions()",
        "r.plot.p_star()",
        f"specbound.compare(r, {str(tiny_bert_dir)!r}, names=['live', 'again'])",  # compare's view
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        "MPLBACKEND": "",
        "OPENBLAS_NUM_THREADS": "1",
    }
    env.pop("MPLBACKEND")
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    first = nb.cells[0].outputs
    stderr = "".join(o.get("text", "") for o in first if o.get("name") == "stderr")
    assert "IProgress" not in stderr and "Warning" not in stderr, stderr
    assert "text/html" in nb.cells[1].outputs[0]["data"]
    compared = [o["data"] for o in nb.cells[-1].outputs if o["output_type"] == "execute_result"]
    assert compared and "again / live" in compared[0]["text/html"] and "data:image/png" in compared[0]["text/html"]
    for cell in nb.cells[2:-1]:
        data = [o["data"] for o in cell.outputs if o["output_type"] == "execute_result"]
        assert data and "image/png" in data[0], (cell.source, cell.outputs)
