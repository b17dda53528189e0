"""The HTML report rendered in a real headless browser (Debian's chromium, `make browser`): it fits a
laptop screen (no horizontal page scroll; wide tables scroll inside their box), every figure loads
from the file itself, and nothing is requested from anywhere else."""

import json
import re
import shutil
import subprocess

import pytest

from specbound.report.html import write_report
from support.run_store import run_store  # noqa: F401  (a fixture)


BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no headless browser: `make browser` installs Debian's chromium (apt-get install chromium)"
)

# Put in the page's <head> before anything loads: a content security policy that allows only what
# the file carries itself (inline styles, data: images), a listener recording every request the
# policy blocked, and, once the page has loaded, the layout's measurements written into the DOM.
PROBE = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
    "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
    "<script>window.__blocked=[];document.addEventListener('securitypolicyviolation',"
    "e=>window.__blocked.push(e.blockedURI));"
    "window.addEventListener('load',()=>{const d=document.documentElement;"
    "const boxes=[...document.querySelectorAll('.scroll')];const o=document.createElement('pre');"
    "o.id='probe';o.textContent=JSON.stringify({scrollWidth:d.scrollWidth,clientWidth:d.clientWidth,"
    "blocked:window.__blocked,images:[...document.images].map(i=>({done:i.complete,w:i.naturalWidth,"
    "right:i.getBoundingClientRect().right,shown:i.getBoundingClientRect().width,alt:i.alt})),boxes:boxes.map(b=>({right:b.getBoundingClientRect().right,"
    "scrolls:b.scrollWidth>b.clientWidth}))});document.body.appendChild(o);});</script>"
)


def render(page_path, tmp_path, width: int, height: int = 800) -> dict:
    """Load ``page_path`` (with :data:`PROBE` added) in headless chromium at ``width`` x ``height``."""
    page = page_path.read_text()
    probed = tmp_path / f"probe-{width}.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    proc = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            f"--window-size={width},{height}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the page did not finish loading in {BROWSER}: {proc.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def assert_fits(result: dict, width: int, figures: int) -> None:
    assert result["blocked"] == [], result["blocked"]  # nothing requested from outside the file
    assert result["scrollWidth"] <= result["clientWidth"] <= width, result  # no horizontal page scroll
    assert len(result["images"]) == figures
    for image in result["images"]:
        assert image["done"] and image["w"] > 0 and image["right"] <= result["clientWidth"], image
        assert len(image["alt"]) > 40  # a sentence about the figure, not its file name
    assert all(box["right"] <= result["clientWidth"] for box in result["boxes"])


@pytest.fixture(scope="module")
def family_report(tiny_store, tmp_path_factory):
    return write_report(tiny_store, tmp_path_factory.mktemp("family") / "rep")


def assert_one_scale(result: dict) -> None:
    """Every figure is shown at the same scale (displayed px per PNG px), so their fonts match: a
    narrow figure (the p* heat map) is not blown up to the column's width."""
    scales = [image["shown"] / image["w"] for image in result["images"]]
    assert max(scales) / min(scales) < 1.02, scales


@pytest.mark.parametrize("width", [1280, 1024])
def test_family_report_fits_a_laptop_screen(family_report, tmp_path, width):
    result = render(family_report["html"], tmp_path, width)
    assert_fits(result, width, figures=len(list(family_report["figures"].glob("*.png"))))
    assert_one_scale(result)
    if width == 1280:  # every table whole on a laptop screen: the bounds in two parts, none scrolling
        assert len(result["boxes"]) >= 3 and not any(box["scrolls"] for box in result["boxes"]), result["boxes"]


def test_trajectory_report_fits_a_laptop_screen(run_store, tmp_path):
    paths = write_report(run_store, tmp_path / "rep")
    result = render(paths["html"], tmp_path, 1280)
    assert_fits(result, 1280, figures=len(list(paths["figures"].glob("*.png"))))
    assert_one_scale(result)
    assert any("training step" in image["alt"] for image in result["images"])


def test_probe_catches_overflow_and_outside_requests(tmp_path):
    """The same probe on a page that is too wide and loads an image from elsewhere reports both."""
    bad = tmp_path / "bad.html"
    row = "".join(f"<td>{'9.9999e+99' * 3}</td>" for _ in range(40))
    bad.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><table><tr>{row}</tr></table>'
        f'<img alt="x" src="https://example.invalid/figure.png"></body></html>'
    )
    result = render(bad, tmp_path, 1024)
    assert result["scrollWidth"] > result["clientWidth"]
    assert result["blocked"] and result["blocked"][0].startswith("https://example.invalid")
