"""A target's login and TLS (``core.secrets``, ``core.tls``): the password from the environment or a file and never on
a command line, the TLS schemes and their CA file, and HTTPS for real against a TLS sink on loopback (certificates
made by ``openssl`` here). The brokers' TLS is ``tests/system/test_secure_amqp.py``'s."""
from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import threading

import pytest
from support import ROOT
from support.certs import make_certs

from core import secrets, tls
from core.procs import free_port
from transports.registry import TargetSpec, transport

SECRET = "s3cret-in-a-file"


def test_a_user_without_a_password_takes_it_from_the_environment_or_its_file(tmp_path, monkeypatch):
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    monkeypatch.setenv(secrets.PASSWORD_ENV, f"@{pw}")
    spec = TargetSpec.parse("amqps://fw@broker.example:5671/orders?queue=q")
    assert spec.userinfo == f"fw:{SECRET}" and spec.port == 5671 and spec.tls == tls.Tls(None)
    monkeypatch.setenv(secrets.PASSWORD_ENV, "literal")
    assert TargetSpec.parse("amqp1://fw@h/a").userinfo == "fw:literal"
    assert TargetSpec.parse("amqp1://fw:inline@h/a").userinfo == "fw:inline"  # the URL's own comes first
    monkeypatch.setenv(secrets.PASSWORD_ENV, f"@{tmp_path / 'missing'}")
    with pytest.raises(ValueError) as e:
        TargetSpec.parse("amqp://fw@h/%2F?queue=q")
    assert f"{secrets.PASSWORD_ENV}: cannot read {tmp_path / 'missing'}" in str(e.value)


@pytest.mark.parametrize("url, mode", [("amqps://fw:s3cret@h:1/v?queue=q&durable=true", "amqp"),
                                       ("amqp1s://fw:s3cret@h:1//queue/q?pairs=2", "amqp1")])
def test_a_receiver_started_for_the_run_is_given_the_user_and_never_the_password(url, mode):
    """Its command line holds the URL with the user alone; its environment holds the password (a process's
    environment is its user's to read, its command line everyone's)."""
    spec = TargetSpec.parse(url)
    args = transport(spec.scheme).receiver_args(spec)
    assert args[0] == mode and "s3cret" not in " ".join(args)
    assert args[1:] == ["--url", spec.with_user()] and spec.with_user().startswith(f"{spec.scheme}://fw@h:1/")
    assert TargetSpec.parse(spec.with_user()).path == spec.path  # the same place
    env = secrets.child_env(spec.userinfo, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", secrets.PASSWORD_ENV: "s3cret"}


@pytest.mark.parametrize("url, error", [
    ("amqp://h/%2F?queue=q&cafile=/etc/hosts", "?cafile= is for TLS: write amqps://"),
    ("http://h/?cafile=/etc/hosts", "?cafile= is for TLS: write https://"),
    ("kafka://h/t?cafile=/etc/hosts", "Kafka: --kafka-option security.protocol=SSL,ssl.ca.location=PATH"),
    ("amqps://h/%2F?queue=q&cafile=/no/such/ca.pem", "?cafile=/no/such/ca.pem: no readable CA file there"),
    ("amqp1s://h/a?cafile=/etc/hosts&pairs=2", "?cafile=/etc/hosts: not a PEM CA file"),  # readable, no certificate
    ("https://h/?cafile=/etc/hosts", "?cafile=/etc/hosts: not a PEM CA file"),
    ("amqp1s://h/a?cafile=CA&color=red", "unknown option 'color'"),
])
def test_tls_options_are_checked_before_anything_starts(url, error, tmp_path):
    url = url.replace("cafile=CA", f"cafile={make_certs(str(tmp_path)).ca}")
    with pytest.raises(ValueError) as e:
        TargetSpec.parse(url)
    assert error in str(e.value)


def test_tls_schemes_default_to_their_tls_ports():
    assert [TargetSpec.parse(u).port for u in ("https://h/", "amqps://h/%2F?queue=q", "amqp1s://h/a", "http://h/",
                                               "amqp://h/%2F?queue=q")] == [443, 5671, 5671, 80, 5672]


def test_tls_failures_are_named():
    assert tls.short_cause("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in "
                           "certificate chain") == "tls: certificate not trusted"
    assert tls.short_cause("certificate verify failed: IP address mismatch, certificate is not valid for "
                           "'127.0.0.1'") == "tls: host name mismatch"
    assert tls.short_cause("[SSL: WRONG_VERSION_NUMBER] wrong version number") == "tls: not a tls port"
    assert tls.cause("ConnectionRefusedError(111)") is None
    assert tls.speaks_tls(r"Expected SASL protocol header got: Unknown protocol ['\x15\x03\x01\x00\x02\x02\x0a']")


class _Sink:
    """An HTTPS CloudEvents sink on loopback: 202 for every request, counted."""

    def __init__(self, certs) -> None:
        self.port, self.count, self.ids = free_port(), 0, set()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs.cert, certs.key)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                                        ssl=self.context))
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader, writer) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
                await reader.readexactly(int(fields.get("content-length", 0)))
                self.count += 1
                self.ids.add(fields.get("ce-id"))
                writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _attack(tmp_path, target: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", "attack", "--target", target, "--no-telemetry", "--workers",
                           "1", "--metrics-listen", "none", "--quiet", "--out", str(tmp_path / "lg"), *args],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)


def test_https_to_a_sink_with_a_certificate_of_a_ca_of_its_own(tmp_path):
    """``https://localhost:PORT/?cafile=CA``: every event taken; an unknown CA or a host name the certificate does not
    have ends the attack before the load, in one line naming the cause, exit 2."""
    certs = make_certs(str(tmp_path / "certs"))
    sink = _Sink(certs)
    try:
        ok = _attack(tmp_path, f"https://localhost:{sink.port}/?cafile={certs.ca}", "--rate", "200", "--duration", "2s")
        assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
        report = json.load(open(tmp_path / "lg" / "report.json"))
        assert report["requests"] == sink.count == len(sink.ids) >= 399 and report["success_ratio"] == 1.0, report
        before = sink.count
        for url, cause in ((f"https://localhost:{sink.port}/?cafile={certs.other_ca}",
                            "the certificate is not signed by a trusted CA: give ?cafile=PATH"),
                           (f"https://127.0.0.1:{sink.port}/?cafile={certs.ca}",
                            "the certificate does not name the host in the URL (TLS host name mismatch)"),
                           (f"https://localhost:{sink.port}/", "the certificate is not signed by a trusted CA")):
            bad = _attack(tmp_path / "bad", url, "--rate", "200", "--duration", "2s")
            lines = [line for line in (bad.stdout + bad.stderr).splitlines() if line.strip()]
            assert bad.returncode == 2 and len(lines) == 1 and cause in lines[0], (url, bad.stdout, bad.stderr)
        assert sink.count == before  # nothing sent
    finally:
        sink.close()
