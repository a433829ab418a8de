"""The UI in a real browser: Debian chromium (/usr/bin/chromium; headless, a fresh profile, no background
connections; Playwright never downloads a browser) driven by Playwright against `python -m serve`.

With a tiny random demo model it stylizes an upload (the result at the content's size), checks the layout at
1280 px (the whole result in view, the seed's help on one line) and saves `test-artifacts/ui.png`, and stylizes
a clicked example (its pictures' links carry the mount path). `STYLEVAR_UPDATE_SCREENSHOT=1` also writes
`docs/ui.png`; `STYLEVAR_UI_TEST_MODEL=DIR` runs on another demo model, such as `stylevar/assets/demo`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from serve.testing import ServerProcess
from stylevar.baselines.magenta import magenta_available
from stylevar.pipelines.pipeline import StylePipeline
from web.ui import DEMO_LABEL, example_pairs

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CONTENT_SIZE = (240, 160)  # 3:2, not the model's square
VIEWPORT = {"width": 1280, "height": 800}
# page-space boxes (left, top, right, bottom) of the layout `test_stylize_in_the_browser` checks
LAYOUT_JS = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
                        return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; };
  const img = document.querySelector('#results img'), info = document.querySelector('#seed .info-text');
  return {img: box(img), natural: [img.naturalWidth, img.naturalHeight], fit: getComputedStyle(img).objectFit,
          gallery: box(document.querySelector('#results .grid-wrap')), block: box(document.querySelector('#results')),
          button: box(document.querySelector('#stylize-button')), page_width: document.documentElement.scrollWidth,
          info: box(info), info_font_px: parseFloat(getComputedStyle(info).fontSize)};
}"""

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; it drives Debian chromium)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    return sync_playwright


@contextlib.contextmanager
def ui_page(server_url: str, profile_dir: Path, timeout_ms: int) -> Iterator:
    """A chromium page on the service's UI, its model panel shown (the UI is up), closed afterwards."""
    sync_playwright = _playwright()
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport=VIEWPORT)
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_ms)
            page.goto(server_url + "/ui/")
            page.locator("#model-panel").get_by_text(DEMO_LABEL).wait_for()
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = os.environ.get("STYLEVAR_UI_TEST_MODEL")
    if not model_dir:
        pipe = StylePipeline.random("tiny", name="stylevar-demo")
        pipe.config.demo = True
        model_dir = pipe.save_pretrained(tmp_path_factory.mktemp("demo-model"))
    srv = ServerProcess.serve(model_dir, extra_args=(), log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def loaded_size(page, selector: str) -> tuple[int, int]:
    """The natural size of the first picture under `selector`, once it has loaded (a broken link never does)."""
    img = page.locator(selector).first
    img.wait_for()
    page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
    return tuple(img.evaluate("(el) => [el.naturalWidth, el.naturalHeight]"))


def shown_picture(img: list[float], natural: list[int], fit: str) -> list[float]:
    """Where an <img> box draws its picture, scaled to fit whole and centred (object-fit contain, or a box of
    the picture's own aspect); a fit that crops or stretches it fails."""
    left, top, right, bottom = img
    scale = min((right - left) / natural[0], (bottom - top) / natural[1])
    w, h = natural[0] * scale, natural[1] * scale
    assert fit == "contain" or abs(w - (right - left)) + abs(h - (bottom - top)) < 2, (fit, img, natural)
    x, y = left + (right - left - w) / 2, top + (bottom - top - h) / 2
    return [x, y, x + w, y + h]


def assert_layout(page) -> None:
    """At 1280 px the results picture is whole and in the page, with no empty band above it; the seed's help
    is one line; pressing Stylize and seeing the whole result takes one screen."""
    m = page.evaluate(LAYOUT_JS)
    pic = shown_picture(m["img"], m["natural"], m["fit"])
    assert m["page_width"] <= VIEWPORT["width"] and 0 <= m["img"][0] and m["img"][2] <= VIEWPORT["width"], m
    gallery = m["gallery"]  # the gallery scrolls what does not fit its box: the picture must be inside it
    assert gallery[0] - 0.5 <= pic[0] and pic[2] <= gallery[2] + 0.5, (pic, m)
    assert gallery[1] - 0.5 <= pic[1] and pic[3] <= gallery[3] + 0.5, (pic, m)
    assert pic[1] - m["block"][1] <= 40, (pic, m)  # the label's and the download button's strip only
    assert m["info"][3] - m["info"][1] < 2 * m["info_font_px"], m
    assert pic[3] - m["button"][1] <= VIEWPORT["height"], (pic, m)


def test_stylize_in_the_browser(server, tmp_path):
    pairs = example_pairs()
    content_path, style_path = tmp_path / "content.png", tmp_path / f"style{Path(pairs[2][1]).suffix}"
    Image.open(pairs[2][0]).convert("RGB").resize(CONTENT_SIZE, Image.BICUBIC).save(content_path)
    shutil.copy(pairs[2][1], style_path)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ui.png"

    with ui_page(server.url, tmp_path / "chromium-profile", 60_000) as page:
        page.locator("#content-input input[type=file]").set_input_files(str(content_path))
        page.locator("#style-input input[type=file]").set_input_files(str(style_path))
        page.locator("#content-input img").wait_for()  # both uploads finished
        page.locator("#style-input img").wait_for()
        page.click("#stylize-button")
        page.locator("#status").get_by_text("Done").wait_for()
        assert loaded_size(page, "#results img") == CONTENT_SIZE
        page.locator("#preview img").wait_for()  # the coarse-to-fine preview ends on the result
        assert "AdaIN" in page.locator("#adain-status").inner_text()
        if magenta_available():  # the baseline panel's default on a machine with the teacher extra
            assert page.locator("#run-baseline input").is_checked()  # ticked by the page (unticked for the API)
            assert loaded_size(page, "#adain-output img") == CONTENT_SIZE
        assert_layout(page)
        page.screenshot(path=str(shot), full_page=True)

    assert Image.open(shot).size[0] == 1280
    if os.environ.get("STYLEVAR_UPDATE_SCREENSHOT") == "1":
        shutil.copy(shot, REPO / "docs" / "ui.png")


def test_an_example_fills_both_inputs_and_stylizes(server, tmp_path):
    content, style = example_pairs()[2]
    ARTIFACTS.mkdir(exist_ok=True)
    with ui_page(server.url, tmp_path / "chromium-profile", 60_000) as page:
        page.locator("#examples tr.tr-body").nth(2).click()  # the README's pair: a 3:2 photograph
        assert loaded_size(page, "#content-input img") == Image.open(content).size
        assert loaded_size(page, "#style-input img") == Image.open(style).size
        for selector in ("#content-input img", "#style-input img"):  # under the mount path, as every file link
            assert page.locator(selector).first.get_attribute("src").startswith(server.url + "/ui/gradio_api/file=")
        page.click("#stylize-button")
        page.locator("#status").get_by_text("Done").wait_for()
        assert loaded_size(page, "#results img") == Image.open(content).size
        page.screenshot(path=str(ARTIFACTS / "ui_example.png"), full_page=True)
