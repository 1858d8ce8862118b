"""TLS for the TCP listener and the clients that reach it, with the stdlib `ssl` module only.

Contract:
- `server_context(cert, key)` is the listener's context (TLS 1.2 or newer, the certificate
  chain in `cert`, its key in `key` or in `cert` itself). A client whose handshake fails (a
  plain-TCP client, or one that does not trust the certificate) is refused by the TLS
  layer, and the broker logs one warning line saying so (`fabricctl.wire.tls`).
- `client_context(ca)` verifies the broker against `ca`: a CA bundle, or the broker's own
  (self-signed or not) certificate, which is then pinned (partial chains are accepted, so a
  leaf certificate given as the CA file is a trust anchor by itself). The host name the
  client dials must be in the certificate.
- `handshake_error(exc, address, ca)` turns an `ssl` failure into the error a user reads:
  a `BrokerError` with code "tls" naming the cause (the certificate does not verify, and
  why; the broker does not speak TLS), or None for a failure that is not about TLS
  settings (an EOF or a reset while the broker restarts: the caller retries).
A file that cannot be read or is not PEM is a `UsageError` naming it.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from fabricctl.errors import BrokerError, UsageError

log = logging.getLogger("fabricctl.wire.tls")

# OpenSSL's reasons when the other end answered in plain bytes rather than TLS records
_NOT_TLS = {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
            "HTTP_REQUEST", "UNKNOWN_PROTOCOL"}


class _LoggedHandshake(ssl.SSLObject):
    """Why: the event loop refuses a failed handshake silently; an operator needs one line."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as e:
            hint = (" (a plain-TCP client? it needs --tls-ca)"
                    if getattr(e, "reason", None) in _NOT_TLS else "")
            log.warning("refused a tcp client: TLS handshake failed: %s%s",
                        getattr(e, "reason", None) or e, hint)
            raise


def _readable(path: str | Path, what: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{what} {p} does not exist")
    return str(p)


def server_context(cert: str | Path, key: str | Path | None = None) -> ssl.SSLContext:
    """The TCP listener's TLS context (see the module contract)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    certfile = _readable(cert, "TLS certificate")
    keyfile = _readable(key, "TLS key") if key else None
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"cannot load the TLS certificate {certfile}"
                         f"{f' and key {keyfile}' if keyfile else ''}: {e}") from e
    ctx.sslobject_class = _LoggedHandshake
    return ctx


def client_context(ca: str | Path) -> ssl.SSLContext:
    """A client context that trusts `ca` only (a CA bundle, or the pinned certificate)."""
    cafile = _readable(ca, "TLS CA file")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"cannot read the TLS CA file {cafile}: {e}") from e
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a leaf given as the CA is pinned
    return ctx


def handshake_error(exc: BaseException, address: str, ca: str = "") -> BrokerError | None:
    """The user's error for a failed TLS connect, or None when it is not about TLS."""
    against = f" against {ca}" if ca else ""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return BrokerError("tls", f"the certificate of the broker at {address} does not "
                           f"verify{against}: {why}")
    if isinstance(exc, ssl.CertificateError):
        return BrokerError("tls", f"the certificate of the broker at {address} does not "
                           f"match its address: {exc}")
    if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _NOT_TLS:
        return BrokerError("tls", f"TLS handshake with the broker at {address} failed "
                           f"({exc.reason}): it is not listening with TLS (start it with "
                           "--tls-cert/--tls-key, or connect without --tls-ca)")
    return None  # an EOF or a reset mid-handshake: the broker went away, try again
