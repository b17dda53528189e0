"""The documentation site (mkdocs.yml): `make docs`'s strict build succeeds from this checkout, every
page and generated reference is there, nothing is fetched from anywhere else, and in headless
chromium (Debian's, `make browser`) the home page and an API page render with no console error, a
working search box and the math."""

import functools
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "latex2mathml", "nbconvert", "nbclient"):
    pytest.importorskip(module, reason="the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built as `make docs` builds it (strict), into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_every_page_is_built_with_its_generated_parts(site):
    nav = re.findall(r"^\s+- (?:[^:]+: )?([\w-]+)\.md$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert {"index", "api", "cli", "tutorial", "theory", "changelog"} <= set(nav)
    for page in nav:
        assert (site / f"{page}.html").is_file(), page
    cli = (site / "cli.html").read_text()
    for sub in ("analyze", "sweep", "scaling", "report", "study", "docs", "arch infer"):
        assert f"specbound {sub}</code>" in cli, sub
    assert "--grid-m" in cli and "--disk-budget" in cli
    api = (site / "api.html").read_text()
    for name in ("analyze", "AnalysisOptions", "Analysis", "AnalysisPlots", "Store"):
        assert 'id="specbound.' in api and re.search(rf'id="[\w.]*\b{name}"', api), name
    assert ":class:" not in api  # the docstrings' Sphinx roles are shown as code
    signature = re.sub(r"<[^>]+>", "", api)  # AnalysisOptions' defaults, not the _option(...) declaring them
    assert "_option(" not in signature and "rank_tol: float = 1e-10" in signature
    for name in (
        "Comparison",
        "BoundMonitor",
        "integrations.transformers.SpecboundCallback",
        "integrations.lightning.SpecboundCallback",
    ):
        assert re.search(rf'id="specbound\.[\w.]*{re.escape(name)}"', api), name
    tutorial = (site / "tutorial.html").read_text()
    figures = re.findall(r'<img [^>]*src="(tutorial_files/[^"]+\.png)"', tutorial)
    assert len(figures) >= 3 and all((site / f).stat().st_size > 10_000 for f in figures), figures
    assert "spectral_adaptive" in tutorial and "Traceback" not in tutorial
    assert (site / "families.html").read_text().count("<tr>") >= 40  # the generated tables


def test_nothing_is_fetched_from_elsewhere(site):
    """Scripts, stylesheets, fonts and images come from the site itself (links to elsewhere are fine)."""
    for page in site.rglob("*.html"):
        text = page.read_text()
        fetched = re.findall(r'<(?:script|img|iframe|source)\b[^>]*\bsrc="(?!data:)([^"]*)"', text) + re.findall(
            r'<link\b(?=[^>]*rel="(?:stylesheet|preload|icon|modulepreload)")[^>]*href="([^"]*)"', text
        )
        assert not [u for u in fetched if re.match(r"(https?:)?//", u)], (page.name, fetched)
    for css in site.rglob("*.css"):
        assert not re.search(r"@import|url\((['\"]?)(https?:)?//", css.read_text()), css


def test_math_is_mathml_written_at_build_time(site):
    theory = (site / "theory.html").read_text()
    assert "<math" in (site / "index.html").read_text() and theory.count("<math") >= 20
    for page in ("theory", "bounds", "rotary"):  # no LaTeX left for a script, none shown as text
        html = (site / f"{page}.html").read_text()
        assert 'class="arithmatex"' not in html and "\\(" not in html and "$$" not in html, page


# Put in each page's <head> before anything loads: a content security policy that allows only the
# site itself, and a record of every console error, failed load and blocked request. The page is
# opened with ?q=QUERY, which Material's search box takes as typed; once loaded, the probe waits for
# the search worker's results (each wait is a request the server holds for WAIT_S, during which
# chromium's virtual clock stands still and the worker runs), then writes what the page shows into
# the DOM.
WAIT_S = 0.25
PROBE = (
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'self' 'unsafe-inline' data: blob:\">"
    "<script>window.__errors=[];const __ce=console.error;console.error=(...a)=>{__errors.push(a.join(' '));"
    "__ce(...a)};window.addEventListener('error',e=>__errors.push(e.message||('failed to load '+"
    "(e.target.src||e.target.href))),true);window.addEventListener('unhandledrejection',e=>__errors.push("
    "'unhandled '+e.reason));document.addEventListener('securitypolicyviolation',e=>__errors.push("
    "'blocked '+e.blockedURI));const __found=()=>document.querySelectorAll('.md-search-result__item').length;"
    "window.addEventListener('load',async()=>{for(let i=0;i<80&&!__found();i++)await fetch('/__wait');"
    "const m=[...document.querySelectorAll('article.md-content__inner math')];const o=document.createElement('pre');"
    "o.id='probe';o.textContent=JSON.stringify({errors:__errors,search:document.querySelector("
    "'input.md-search__input').value,results:__found(),math:m.length,math_drawn:m.filter(e=>{"
    "const r=e.getBoundingClientRect();return r.width>0&&r.height>0}).length,"
    "text:document.querySelector('article.md-content__inner').textContent.length});document.body.appendChild(o);});</script>"
)


@pytest.fixture(scope="module")
def served(site):
    """The site on a local HTTP server (as `python -m http.server -d site` serves it), the probe put
    into every page it serves."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def send_head(self):
            if self.path == "/__wait":
                time.sleep(WAIT_S)
                self.send_response(204)
                self.end_headers()
                return None
            path = Path(self.translate_path(self.path))
            if path.suffix != ".html" or not path.is_file():
                return super().send_head()
            body = path.read_text().replace("<head>", "<head>" + PROBE, 1).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return io.BytesIO(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def render(url: str) -> dict:
    proc = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--window-size=1280,900",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"{url} did not finish loading in {BROWSER}: {proc.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<"))


@pytest.mark.skipif(BROWSER is None, reason="no headless browser: `make browser` installs Debian's chromium")
@pytest.mark.parametrize(
    "page,query,math",
    [("index.html", "Schatten", True), ("api.html", "AnalysisOptions", False), ("theory.html", "Lipschitz", True)],
)
def test_a_page_renders_in_a_browser(served, page, query, math):
    shown = render(f"{served}/{page}?q={query}")
    assert shown["errors"] == [], shown["errors"]
    assert shown["search"] == query and shown["results"] > 0, shown  # the search box finds the query
    assert shown["text"] > 1000, shown
    if math:
        assert shown["math"] > 0 and shown["math_drawn"] == shown["math"], shown
