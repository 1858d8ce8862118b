"""TLS on the TCP listener, against a live in-process broker and certificates made at test time.

- A TLS client that trusts the broker's self-signed certificate (the pinned case), or the CA
  that signed it, or the leaf alone (pinned, without its CA), is welcomed; the Unix socket
  stays plain and 0600.
- A wrong token is "broker refused the token"; a plain-TCP client gets a clear error (no
  hang) and the broker logs one line; a TLS client against a plain listener, a certificate
  that does not verify, or one for another address each get an error naming the cause.
- Missing or unreadable certificate files are usage errors naming the file.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from agent_helpers import TOKEN, make_ca_and_leaf, make_cert, needs_openssl
from server_helpers import running_server

from fabricctl.errors import BrokerError, UsageError
from fabricctl.wire.client import Client
from fabricctl.wire.tls import client_context, server_context

pytestmark = needs_openssl


def tls_kw(cert: Path, key: Path) -> dict[str, str]:
    return {"listen": "127.0.0.1:0", "token": TOKEN, "tls_cert": str(cert),
            "tls_key": str(key)}


async def welcomed(address: str, ca: Path, token: str = TOKEN) -> dict[str, object]:
    c = await Client.connect(address, "observer", "tls-test", token, tls=client_context(ca))
    try:
        status: dict[str, object] = await c.status()
        return status
    finally:
        await c.close()


async def test_a_trusted_certificate_is_welcomed_and_the_unix_socket_stays_plain(
        tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    async with running_server(tmp_path, **tls_kw(cert, key)) as server:
        address = f"127.0.0.1:{server.tcp_port()}"
        status = await welcomed(address, cert)  # the self-signed certificate, pinned
        assert status["difference"] == [0, 0]
        sock = server.state.cfg.socket_path
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        plain = await Client.connect(sock.parent, "observer", "local")  # no TLS, no token
        assert (await plain.ledger())["difference"] == [0, 0]
        await plain.close()


async def test_a_ca_file_and_a_pinned_leaf_both_verify(tmp_path: Path) -> None:
    ca, leaf, key = make_ca_and_leaf(tmp_path)
    async with running_server(tmp_path, **tls_kw(leaf, key)) as server:
        address = f"127.0.0.1:{server.tcp_port()}"
        assert (await welcomed(address, ca))["difference"] == [0, 0]
        assert (await welcomed(address, leaf))["difference"] == [0, 0]  # pinned, no CA


async def test_refusals_name_their_cause(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    cert, key = make_cert(tmp_path)
    other, _ = make_cert(tmp_path, "other")  # another self-signed certificate
    elsewhere, _ = make_cert(tmp_path, "elsewhere", cn="elsewhere.invalid",
                             san="DNS:elsewhere.invalid")
    caplog.set_level(logging.WARNING, logger="fabricctl")
    async with running_server(tmp_path, **tls_kw(cert, key)) as server:
        address = f"127.0.0.1:{server.tcp_port()}"
        with pytest.raises(BrokerError) as e:
            await welcomed(address, cert, token="wrong")
        assert e.value.code == "auth" and "broker refused the token" in str(e.value)

        before = len(caplog.records)
        with pytest.raises(BrokerError) as e:  # plain TCP: the TLS layer refuses it at once
            await Client.connect(address, "consumer", "plain", TOKEN, timeout=5.0)
        assert e.value.code == "no_answer" and "TLS listener" in str(e.value), e.value
        lines = [r.getMessage() for r in caplog.records[before:]]
        assert [ln for ln in lines if "TLS handshake failed" in ln] == [
            "refused a tcp client: TLS handshake failed: WRONG_VERSION_NUMBER (a plain-TCP "
            "client? it needs --tls-ca)"], lines

        with pytest.raises(BrokerError) as e:
            await welcomed(address, other)
        assert e.value.code == "tls" and "does not verify" in str(e.value), e.value
        assert "self-signed certificate" in str(e.value)
        assert (await welcomed(address, cert))["difference"] == [0, 0]  # still serving
    elsewhere_key = tmp_path / "elsewhere.key"
    async with running_server(tmp_path / "b", **tls_kw(elsewhere, elsewhere_key)) as server:
        with pytest.raises(BrokerError) as e:  # trusted, but for another host name
            await welcomed(f"127.0.0.1:{server.tcp_port()}", elsewhere)
        assert e.value.code == "tls" and "does not verify" in str(e.value), e.value
        assert "mismatch" in str(e.value), e.value


async def test_a_tls_client_against_a_plain_listener_is_told_so(tmp_path: Path) -> None:
    cert, _ = make_cert(tmp_path)
    async with running_server(tmp_path, listen="127.0.0.1:0", token=TOKEN) as server:
        address = f"127.0.0.1:{server.tcp_port()}"
        with pytest.raises(BrokerError) as e:
            await welcomed(address, cert)
        assert e.value.code == "tls" and "not listening with TLS" in str(e.value), e.value
        plain = await Client.connect(address, "observer", "plain", TOKEN)  # plain still works
        await plain.close()


def test_missing_certificate_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"TLS certificate .*nope\.crt does not exist"):
        server_context(tmp_path / "nope.crt")
    with pytest.raises(UsageError, match=r"TLS CA file .*nope\.crt does not exist"):
        client_context(tmp_path / "nope.crt")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(UsageError, match="cannot load the TLS certificate"):
        server_context(junk)
    with pytest.raises(UsageError, match="cannot read the TLS CA file"):
        client_context(junk)
