"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks``): the pages generated from the code,
and the math written as MathML when the site is built (no script, no font from anywhere else).

* ``cli.md``: the command-line reference, from ``specbound.cli``'s argument parser
  (:func:`specbound.tools.doc_tables.cli_reference`).
* ``tutorial.md``: ``docs/tutorial.ipynb`` run in a fresh kernel on the embedded checkpoint and
  converted by nbconvert, its figures as PNG files beside it: every number and figure is real output.
* Math: ``$...$`` and ``$$...$$`` (pymdownx.arithmatex, generic mode) become MathML
  (latex2mathml), which browsers render natively; LaTeX that does not convert fails the build.
"""

from __future__ import annotations

import html
import logging
import os
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's specbound, whatever is installed
log = logging.getLogger("mkdocs.hooks.specbound")

NOTEBOOK = "tutorial.ipynb"
MATH = re.compile(r'<(?P<tag>span|div) class="arithmatex">(?P<body>.*?)</(?P=tag)>', re.S)


def on_files(files, config):
    from specbound.cli import _parser
    from specbound.tools.doc_tables import cli_reference

    files.append(File.generated(config, "cli.md", content=cli_reference(_parser())))
    markdown, images = run_notebook(Path(config["docs_dir"]) / NOTEBOOK)
    files.append(File.generated(config, "tutorial.md", content=markdown))
    for name, data in images.items():
        files.append(File.generated(config, name, content=data))
    return files


def run_notebook(path: Path) -> tuple[str, dict[str, bytes]]:
    """The notebook at ``path`` executed in a fresh kernel and converted to Markdown: ``(text,
    {file name: PNG bytes})``.  A cell that raises fails the build."""
    import nbclient
    import nbformat
    from nbconvert import MarkdownExporter

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend, as a user's Jupyter has it
    try:  # the kernel inherits this process's environment
        nbclient.NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            allow_errors=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    except nbclient.exceptions.CellExecutionError as exc:
        raise PluginError(f"{path.name}: a cell failed: {exc}") from None
    finally:
        os.environ.clear()
        os.environ.update(env)
    stem = path.stem
    text, resources = MarkdownExporter().from_notebook_node(
        nb, resources={"output_files_dir": f"{stem}_files", "unique_key": stem}
    )
    link = f"[{path.name}]({path.name})"
    text = text.replace("\n", f"\n\n*This page is {link} as the site's build ran it, outputs and all.*\n", 1)
    return text, dict(resources.get("outputs", {}))


def on_page_content(html_text, page, config, files):
    return MATH.sub(lambda m: _mathml(m, page), html_text)


def _mathml(match, page) -> str:
    from latex2mathml.converter import convert

    body = html.unescape(match["body"]).strip()
    block = match["tag"] == "div"
    latex = body[2:-2] if body[:2] in ("\\(", "\\[") else body
    try:
        mathml = convert(latex.strip(), display="block" if block else "inline")
    except Exception as exc:  # latex2mathml raises its own exception types, and plain ones
        raise PluginError(f"{page.file.src_uri}: cannot render the math {latex!r} ({exc})") from None
    # What latex2mathml does not know it copies through: a command as `\\name`, an environment's
    # column separator as `&` (`aligned` is one: write `split`)
    if "\\" in mathml or "<mi>&</mi>" in mathml:
        raise PluginError(f"{page.file.src_uri}: the math {latex!r} uses LaTeX that latex2mathml does not render")
    return mathml
