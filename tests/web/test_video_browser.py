"""The UI's video tab in a real browser (Debian chromium through Playwright, as tests/web/test_web_browser.py): a clip
and a style uploaded, "Stylize clip" pressed, the stylized clip played back at the clip's size and length.
Saves a screenshot to `test-artifacts/ui_video.png`."""
from __future__ import annotations

import pytest

pytest.importorskip("av")

from tests.processing.test_video_io import make_clip  # noqa: E402
from tests.web.test_web_browser import ARTIFACTS, server, ui_page  # noqa: E402,F401
from web.ui import example_pairs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SIZE = (96, 64)


@pytest.mark.timeout(300)
def test_stylize_a_clip_in_the_browser(server, tmp_path):  # noqa: F811
    clip = make_clip(tmp_path / "clip.mp4", frames=12, size=SIZE, audio="aac")
    style = example_pairs()[1][1]
    ARTIFACTS.mkdir(exist_ok=True)
    with ui_page(server.url, tmp_path / "chromium-profile", 90_000) as page:
        page.get_by_role("tab", name="Video").click()
        page.locator("#video-input input[type=file]").set_input_files(str(clip))
        page.locator("#video-style-input input[type=file]").set_input_files(style)
        page.locator("#video-input video").wait_for()  # both uploads finished
        page.locator("#video-style-input img").wait_for()
        page.locator("#video-temporal").get_by_text("coherent-reuse", exact=True).click()
        page.click("#video-button")
        page.locator("#video-status").get_by_text("Done: 12 frames").wait_for()
        out = page.locator("#video-output video").first
        out.wait_for()
        page.wait_for_function("(el) => el.readyState >= 1 && el.videoWidth > 0", arg=out.element_handle())
        size = out.evaluate("(el) => [el.videoWidth, el.videoHeight, el.duration]")
        assert tuple(size[:2]) == SIZE and abs(size[2] - 1.0) < 0.1, size
        page.screenshot(path=str(ARTIFACTS / "ui_video.png"), full_page=True)
