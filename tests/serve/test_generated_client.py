"""A client generated from the served /openapi.json by openapi-python-client (the dev extra), used as it comes:
it uploads two images and reads the image answer, the JSON answer and an error (docs/serving.md, "Generated
clients")."""
from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys

import httpx
import pytest
from PIL import Image

from serve.testing import ServerProcess

pytestmark = pytest.mark.slow  # a service start and a generator run: ~20 s

KEY = "generated-client-key"
PACKAGE = "stylevar_client"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_API_KEYS": KEY, "STYLEVAR_MAX_WAIT_MS": "0"},
                             log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv.wait_ready()


@pytest.fixture(scope="module")
def spec(server) -> dict:
    return httpx.get(server.url + "/openapi.json", timeout=30).json()


@pytest.fixture(scope="module")
def generated(spec, tmp_path_factory):
    """The generated package, imported from where it was written (its modules import each other relatively)."""
    folder = tmp_path_factory.mktemp("generated")
    (folder / "openapi.json").write_text(json.dumps(spec))
    (folder / "config.yaml").write_text("post_hooks: []\n")  # no formatter run: ruff need not be on PATH
    run = subprocess.run([sys.executable, "-m", "openapi_python_client", "generate", "--path", "openapi.json",
                          "--meta", "none", "--output-path", PACKAGE, "--config", "config.yaml"],
                         cwd=folder, capture_output=True, text=True, timeout=300)
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "Warning" not in said, said  # nothing of the document left out
    init = folder / PACKAGE / "__init__.py"
    module_spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
    package = importlib.util.module_from_spec(module_spec)
    sys.modules[PACKAGE] = package
    try:
        module_spec.loader.exec_module(package)
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def png(color, size=(48, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def files(generated, *images: bytes) -> list:
    File = generated("types").File
    return [File(payload=io.BytesIO(data), file_name=f"{i}.png", mime_type="image/png") for i, data in enumerate(images)]


def test_the_generated_client_uploads_images_and_reads_each_answer(generated, spec, server):
    client = generated("client").AuthenticatedClient(base_url=server.url, token=KEY, timeout=120)
    stylize, models = generated("api.default.stylize"), generated("models")

    def body(**fields):
        (content,), styles = files(generated, png("red")), files(generated, png("blue"), png("green"))
        return models.BodyStylize(content=content, style=styles[:fields.pop("styles", 1)], **fields)

    image = stylize.sync_detailed(client=client, body=body(seed=3))
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    with Image.open(image.parsed.payload) as im:  # the answer's bytes, as a File
        assert im.size == (48, 32)
    declared = {name.lower() for name in spec["paths"]["/stylize"]["post"]["responses"]["200"]["headers"]}
    sent = {name for name in image.headers if name.startswith("x-")}
    assert sent <= declared, sent - declared
    assert image.headers["x-seed"] == "3"

    answer = stylize.sync_detailed(client=client.with_headers({"Accept": "application/json"}),
                                   body=body(seed=5, num_samples=2, styles=2, style_weights="0.7,0.3"))
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    result = models.StylizeResult.from_dict(json.loads(answer.parsed.payload.read()))
    assert [im.seed for im in result.images] == [5, 6] and result.images[0].width == 48

    (mask,) = files(generated, png("white"))
    refused = stylize.sync_detailed(client=client, body=body(styles=2, style_mask=[mask]))
    assert refused.status_code == 422 and isinstance(refused.parsed, models.ErrorBody)
    assert refused.parsed.detail.startswith("style_mask: 1 masks for 2 style images"), refused.parsed.detail
