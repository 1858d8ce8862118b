"""A data dir whose socket path a Unix socket cannot hold is one clear error, not a traceback.

Linux's `sockaddr_un` holds 107 bytes of path: `fabricctl up` with a data dir deeper than that
says so and exits 2 before it listens (it used to print uvloop's `OSError: AF_UNIX path too
long` traceback, and a script waiting for it waited on). A broker that stops removes its
socket.
"""

from __future__ import annotations

import os
from pathlib import Path

from cli_helpers import fabricctl
from server_helpers import running_server


def test_up_with_a_too_long_socket_path_is_a_usage_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    out = fabricctl("up", "--engine", "sim", "--data-dir", str(deep), env=env, cwd=tmp_path,
                    timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "Traceback" not in err
    assert f"socket path {deep / 'broker.sock'} is" in err
    assert "over the 107 a Unix socket allows: give a shorter --data-dir" in err


async def test_a_stopped_broker_leaves_no_socket_behind(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        assert path.is_socket()
    assert not path.exists()  # `doctor` after `down` finds no stale socket to warn about
