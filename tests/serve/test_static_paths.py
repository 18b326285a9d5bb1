"""The web UI's static files (`--webui-dir`): no path reaches the filesystem unchecked; 404 or 400, never 500
(issue 18, item 3). The app is the real one (create_app with a bundle folder); no model is needed to serve files."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient
from ninfer.serve.app import create_app
from ninfer.serve.router import ModelRouter
from ninfer.serve.router_config import RouterConfig

SECRET = "the file outside the bundle"


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("webui")
    (root / "secret.txt").write_text(SECRET)
    bundle = root / "bundle"
    (bundle / "assets").mkdir(parents=True)
    (bundle / "index.html").write_text("<html>ui</html>")
    (bundle / "assets" / "app.js").write_text("console.log(1)")

    async def open_router() -> ModelRouter:
        return ModelRouter(RouterConfig(models=()))

    app = create_app(open_router, webui_dir=str(bundle), protocols=("ninfer.serve.misc",))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize("path", ["/%00", "/dashboard%00", "/index.html%00.png", "/assets/%00app.js", "/%01",
                                  "/%1f", "/%7f", "/%ff", "/%c0%ae%c0%ae/secret.txt", "/assets/%80"])
def test_bytes_no_file_name_may_hold_are_a_400(client, path):
    response = client.get(path)
    assert response.status_code == 400, (path, response.text)
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/assets/../../secret.txt",
                                  "/%2e%2e%2fsecret.txt", "/..\\secret.txt", "/" + "a" * 300, "/a/" * 1500,
                                  "/nothing.js"])
def test_traversal_and_impossible_names_are_a_404(client, path):
    response = client.get(path)
    assert response.status_code == 404, (path, response.text)
    assert SECRET not in response.text


def test_the_bundle_is_still_served(client):
    assert client.get("/").text == "<html>ui</html>"
    assert client.get("/assets/app.js").text == "console.log(1)"
    assert client.get("/assets%2fapp.js").status_code in (200, 404)  # an encoded slash: either, never 500


@given(name=st.text(min_size=1, max_size=300))
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_path_is_a_server_error(client, name):
    response = client.get("/" + quote(name, safe="/"))
    assert response.status_code in (200, 400, 404), (name, response.status_code, response.text[:200])
    assert SECRET not in response.text


def test_no_raw_byte_is_a_server_error(client):
    for byte in range(256):
        response = client.get(f"/x%{byte:02x}y")
        assert response.status_code in (400, 404), (byte, response.status_code)
