"""/docs and /redoc need nothing beyond the service: their pages name only the service's own files, and in chromium
with every other address blocked Swagger UI lists `/stylize` and ReDoc renders it. `python -m serve` says where
the API and the docs are in one plain line once the model is ready."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest
from fastapi.testclient import TestClient

from serve.http.routes.docs import ASSETS, ASSETS_PATH
from serve.testing import ServerProcess
from tests.serve.test_guidance import app_with

REDOC_CREDIT_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def test_the_pages_name_only_the_services_own_files(tiny_model_dir):
    http = TestClient(app_with(tiny_model_dir))
    for page in ("/docs", "/redoc"):
        html = http.get(page).text
        assert "http" not in html and f'src="{ASSETS_PATH}/' in html, html
    for name in ASSETS:
        answer = http.get(f"{ASSETS_PATH}/{name}")
        assert answer.status_code == 200 and len(answer.content) > 1000, name
    assert http.get(f"{ASSETS_PATH}/core.py").status_code == 404


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_WARMUP": "false"},
                             log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv.wait_ready()


@pytest.mark.slow
def test_the_service_says_where_the_api_and_the_docs_are(server):
    log = server.log_text_once(lambda text: "StyleVAR ready" in text)
    [line] = [line for line in log.splitlines() if line.startswith("StyleVAR ready")]
    assert line == f"StyleVAR ready (tiny-test, fp32): API {server.url}/stylize  docs {server.url}/docs"


@pytest.mark.slow
@pytest.mark.browser
def test_docs_and_redoc_render_in_a_browser_without_the_internet(server, tmp_path):
    from tests.web.test_web_browser import CHROMIUM, CHROMIUM_FLAGS, _playwright

    sync_playwright = _playwright()
    local, refused = urlparse(server.url).netloc, []

    def only_the_service(route) -> None:
        if urlparse(route.request.url).netloc == local:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.route("**/*", only_the_service)
            page.goto(server.url + "/docs")
            page.locator(".opblock-summary-path", has_text="/stylize").first.wait_for()
            assert page.locator(".opblock-summary-path[data-path='/stylize']").count() == 1
            page.goto(server.url + "/redoc")
            page.get_by_text("/stylize/stream").first.wait_for(state="attached")
            assert page.locator("h2", has_text="Stylize").count() >= 1
        finally:
            browser.close()
    # ReDoc's sidebar credit always asks the CDN for its logo; the logo is dropped when that fails, nothing else is
    assert set(refused) <= {REDOC_CREDIT_LOGO}, refused
