"""The console's static files as the web process serves them (WhiteNoise): from the apps' directories where nothing
was collected, and once collected (the image's collectstatic) compressed by Accept-Encoding, with cache headers."""

import gzip

import brotli
from django.core.management import call_command
from django.test import Client, override_settings

CSS = "/static/console/console.css"


def test_a_laptop_without_collectstatic_is_served_from_the_apps(tmp_path):
    with override_settings(STATIC_ROOT=tmp_path / "not-collected", WHITENOISE_USE_FINDERS=True):
        response = Client().get(CSS)
    assert response.status_code == 200 and b"{" in b"".join(response.streaming_content)
    assert response["Cache-Control"] == "max-age=3600, public"


def test_collected_files_are_served_compressed_with_cache_headers(tmp_path):
    root = tmp_path / "staticfiles"
    with override_settings(STATIC_ROOT=root):
        call_command("collectstatic", "--noinput", verbosity=0)
        assert (root / "console" / "console.css.gz").is_file() and (root / "console" / "console.css.br").is_file()
        with override_settings(WHITENOISE_USE_FINDERS=False):
            plain = Client().get(CSS)
            gzipped = Client().get(CSS, headers={"Accept-Encoding": "gzip"})
            brotlied = Client().get(CSS, headers={"Accept-Encoding": "gzip, br"})
    original = (root / "console" / "console.css").read_bytes()
    assert plain.status_code == 200 and "Content-Encoding" not in plain
    assert b"".join(plain.streaming_content) == original
    assert gzipped["Content-Encoding"] == "gzip" and gzip.decompress(b"".join(gzipped.streaming_content)) == original
    assert brotlied["Content-Encoding"] == "br" and brotli.decompress(b"".join(brotlied.streaming_content)) == original
    assert int(gzipped["Content-Length"]) < len(original)
    assert all(
        r["Vary"] == "Accept-Encoding" and r["Cache-Control"] == "max-age=3600, public" for r in (plain, gzipped)
    )
