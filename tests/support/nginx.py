"""Debian's nginx terminating TLS in front of the app, started by a test with the example
configuration the docs ship (``deploy/nginx/billing-outbox.conf``), its ports, upstream and
certificate paths put in, and a self-signed certificate made by ``openssl``."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

from .processes import free_port, terminate, wait_listening

BINARY = "/usr/sbin/nginx"
HOST = "billing.example.com"
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "billing-outbox.conf"


def available() -> str | None:
    """None when nginx and openssl are installed, else why not."""
    if not Path(BINARY).exists():
        return "nginx is not installed (apt-get install nginx-light; .ci/run installs it)"
    if not shutil.which("openssl"):
        return "openssl is not installed"
    return None


def rendered(example: str, *, app_port: int, http_port: int, tls_port: int, cert: Path,
             key: Path) -> str:
    """The example with this test's ports and files; every replacement must apply."""
    out = example
    for old, new in (("server 127.0.0.1:8000;", f"server 127.0.0.1:{app_port};"),
                     ("    listen [::]:80;\n", ""), ("    listen [::]:443 ssl;\n", ""),
                     ("listen 80;", f"listen 127.0.0.1:{http_port};"),
                     ("listen 443 ssl;", f"listen 127.0.0.1:{tls_port} ssl;"),
                     ("/etc/ssl/billing-outbox/fullchain.pem", str(cert)),
                     ("/etc/ssl/billing-outbox/privkey.pem", str(key))):
        assert old in out, f"the example no longer has {old!r}"
        out = out.replace(old, new)
    return out


class Nginx:
    """``start()`` makes the certificate and the configuration, then waits for the port."""

    def __init__(self, app_port: int) -> None:
        # Its workers run as nobody: the temporary files' directory must be theirs to write.
        self.workdir = Path(tempfile.mkdtemp(prefix="nginx-"))
        self.workdir.chmod(0o777)
        self.app_port = app_port
        self.http_port = free_port()
        self.tls_port = free_port()
        self.cert = self.workdir / "fullchain.pem"
        self.key = self.workdir / "privkey.pem"
        self.proc: subprocess.Popen[bytes] | None = None

    def context(self) -> ssl.SSLContext:
        """A client context that trusts this test's certificate alone."""
        ctx = ssl.create_default_context(cafile=str(self.cert))
        ctx.check_hostname = True
        return ctx

    def start(self) -> Nginx:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={HOST}", "-addext",
             f"subjectAltName=DNS:{HOST},IP:127.0.0.1",
             "-keyout", str(self.key), "-out", str(self.cert)],
            check=True, capture_output=True)
        site = rendered(EXAMPLE.read_text(), app_port=self.app_port, http_port=self.http_port,
                        tls_port=self.tls_port, cert=self.cert, key=self.key)
        (self.workdir / "site.conf").write_text(site)
        w = self.workdir
        (w / "nginx.conf").write_text(f"""daemon off;
worker_processes 1;
pid {w / 'nginx.pid'};
error_log {w / 'error.log'} info;
events {{ worker_connections 256; }}
http {{
    access_log {w / 'access.log'};
    client_body_temp_path {w / 'body'};
    proxy_temp_path {w / 'proxy'};
    fastcgi_temp_path {w / 'fastcgi'};
    uwsgi_temp_path {w / 'uwsgi'};
    scgi_temp_path {w / 'scgi'};
    include {w / 'site.conf'};
}}
""")
        check = subprocess.run([BINARY, "-t", "-p", str(w), "-c", str(w / "nginx.conf")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen([BINARY, "-p", str(w), "-c", str(w / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_listening(self.proc, self.tls_port, "nginx", self.log)
        return self

    def log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        terminate(self.proc)
        shutil.rmtree(self.workdir, ignore_errors=True)
