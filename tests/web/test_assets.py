"""The vendored htmx is the file VENDORED.md names, and the static files are served."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "static"
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_vendored_htmx_matches_its_record() -> None:
    record = (STATIC / "VENDORED.md").read_text()
    name, digest = re.search(r"`(htmx-[\d.]+\.min\.js)`.*?`([0-9a-f]{64})`", record).groups()
    assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == digest
    assert name in (TEMPLATES / "base.html").read_text()


def test_static_files_are_served(app) -> None:
    client = app.test_client()
    for path, mimetype in (("/static/htmx-2.0.11.min.js", "text/javascript"),
                           ("/static/app.js", "text/javascript"),
                           ("/static/app.css", "text/css")):
        resp = client.get(path)
        assert resp.status_code == 200 and resp.mimetype == mimetype, path
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        resp.close()


def test_templates_have_no_inline_script_style_or_handlers() -> None:
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, (path, tag)
        assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|hx-on|javascript:", text), path
        assert "|safe" not in text.replace(" ", ""), path
