"""TLS toward a system under test, for every transport that is not Kafka (librdkafka takes its own ``ssl.*``
properties): ``amqps://``, ``amqp1s://`` and ``https://``, each verifying the broker's certificate and host name
against the CA in ``?cafile=PATH`` (the system's CAs without one).

    tls = Tls.of(scheme, query, secure) # None for a plain scheme; ValueError for ?cafile= on one
                                       # (secure: its transport's plain schemes' TLS forms, Target.SECURE)
    tls.context()                      # an ssl.SSLContext for pika and asyncio (HTTP)
    tls.domain()                       # a proton SSLDomain for AMQP 1.0
    tls.cause(error)                   # a handshake's failure as one short line
"""
from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qsl

OPTION = "cafile"


@dataclass(frozen=True)
class Tls:
    cafile: str | None = None
    """The CA bundle (PEM) the broker's certificate must chain to; None: the system's CAs."""

    @classmethod
    def of(cls, scheme: str, query: str, secure: dict[str, str]) -> Tls | None:
        """The TLS of a URL with ``scheme`` and ``query``, its transport's plain schemes' TLS forms ``secure``
        (``transports.base.Target.SECURE``): None for a plain scheme (``ValueError`` if it names a CA file anyway),
        else with its ``?cafile=`` (``ValueError`` if that file cannot be read)."""
        cafile = dict(parse_qsl(query, keep_blank_values=True)).get(OPTION)
        if scheme not in secure.values():
            if cafile is not None and scheme in secure:
                raise ValueError(f"?{OPTION}= is for TLS: write {secure[scheme]}://")
            if cafile is not None:  # Kafka: librdkafka's ssl.ca.location, with its other TLS and SASL settings
                raise ValueError(f"?{OPTION}= is not a {scheme}:// option (Kafka: --kafka-option "
                                 "security.protocol=SSL,ssl.ca.location=PATH)")
            return None
        if cafile is not None and not os.access(cafile, os.R_OK):
            raise ValueError(f"?{OPTION}={cafile}: no readable CA file there")
        secure = cls(cafile or None)
        secure.context()  # a file that holds no PEM certificate: said here, before any connection
        return secure

    def context(self) -> ssl.SSLContext:
        """A client context that checks the certificate's chain and host name (Python's defaults)."""
        try:
            return ssl.create_default_context(cafile=self.cafile)
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(f"?{OPTION}={self.cafile}: not a PEM CA file ({e})") from None

    def domain(self):
        """proton's client domain: the peer's certificate verified, and its name (``VERIFY_PEER_NAME``)."""
        from proton import SSLDomain, SSLException

        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        cafile = self.cafile or ssl.get_default_verify_paths().cafile
        try:
            if cafile:
                domain.set_trusted_ca_db(cafile)
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        except SSLException as e:
            raise ValueError(f"?{OPTION}={cafile}: proton refused it ({e})") from None
        return domain


_KINDS = (
    (("hostname mismatch", "doesn't match", "not valid for", "ip address mismatch"), "tls: host name mismatch",
     "the certificate does not name the host in the URL (TLS host name mismatch): use a name it has"),
    (("certificate verify failed", "unable to get local issuer", "self-signed", "self signed", "unknown ca"),
     "tls: certificate not trusted",
     "the certificate is not signed by a trusted CA: give ?cafile=PATH, the CA that signed it"),
    (("wrong version number", "unknown protocol", "record layer failure", "packet length too long"),
     "tls: not a tls port", "the port does not speak TLS: use the plain scheme, or the TLS port"),
)


def cause(error: BaseException | str) -> str | None:
    """A TLS failure in a client's error, as one line naming the cause and what to do; None if it is none."""
    text = str(error)
    low = text.lower()
    for words, _short, line in _KINDS:
        if any(w in low for w in words):
            return line
    if "ssl" in low and ("handshake" in low or "failure" in low or "sslerror" in low):
        return f"TLS handshake failed ({text.strip()[:200]})"
    return None


def short_cause(error: BaseException | str) -> str:
    """A TLS failure as a short, stable cause for the error counts (``tls: certificate not trusted``)."""
    low = str(error).lower()
    return next((short for words, short, _line in _KINDS if any(w in low for w in words)), "tls: handshake failed")


def diagnose(host: str, port: int, secure: Tls, timeout_s: float = 5.0) -> str | None:
    """Why a TLS connection to ``host:port`` fails, found with Python's own TLS (proton says "certificate verify
    failed" for an untrusted CA and for a name the certificate lacks alike); None if it does not fail."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                secure.context().wrap_socket(raw, server_hostname=host):
            return None
    except (OSError, ValueError) as e:
        return cause(e) or f"TLS to {host}:{port} failed ({e})"


def speaks_tls(text: str) -> bool:
    """Whether a plain client's protocol error shows the server's TLS alert record (bytes 0x15 0x03)."""
    return "\\x15\\x03" in text or "\x15\x03" in text
