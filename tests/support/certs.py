"""Certificates for the TLS tests, made by ``openssl`` in the test's folder: a CA, and a server certificate it signed
for the name ``localhost`` alone (so ``127.0.0.1`` is a host name the certificate does not have), with an unencrypted
PKCS#8 key (Java's PEM key store refuses OpenSSL 3's encrypted ones). ``other_ca`` signed nothing the broker shows.

    c = make_certs(folder)   # c.ca, c.cert, c.key, c.other_ca: file paths
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Certs:
    ca: str
    cert: str
    key: str
    other_ca: str
    chain: str
    """The key and the certificate in one PEM file (Kafka's ``ssl.keystore.type=PEM``)."""


def _openssl(*args: str, cwd: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def _ca(folder: str, name: str) -> tuple[str, str]:
    key, crt = f"{name}.key", f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt, "-days", "2",
             "-subj", f"/CN={name}", cwd=folder)
    return os.path.join(folder, key), os.path.join(folder, crt)


def make_certs(folder: str) -> Certs:
    os.makedirs(folder, exist_ok=True)
    ca_key, ca = _ca(folder, "flightwatch-test-ca")
    _, other = _ca(folder, "some-other-ca")
    with open(os.path.join(folder, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=folder)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out",
             "server.pem", "-days", "2", "-extfile", "san.ext", cwd=folder)
    key, cert = os.path.join(folder, "server.key"), os.path.join(folder, "server.pem")
    chain = os.path.join(folder, "server-chain.pem")
    with open(chain, "w") as out:
        out.write(open(key).read() + open(cert).read())
    for path in (key, chain):
        os.chmod(path, 0o644)  # the brokers here run as the tests' user; a broker of another user must read it
    return Certs(ca, cert, key, other, chain)
