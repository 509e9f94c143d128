"""A private redis-server for tests that need to restart, kill or password-protect Redis.

Each instance listens on a free port of 127.0.0.1 with its data in a temp directory, so tests never
touch the shared server on 6379. Skips the test when no ``redis-server`` binary exists (fails with
``ASYNCRL_REQUIRE_REDIS=1``, as in CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, data_dir: Path, *, password: str | None = None, appendonly: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("ASYNCRL_REQUIRE_REDIS") == "1":
                pytest.fail("no redis-server binary (ASYNCRL_REQUIRE_REDIS=1)")
            pytest.skip("no redis-server binary")
        self.binary = binary
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.appendonly = appendonly
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()

    def client(self, **kw: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kw)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import redis

        end = time.time() + timeout
        while time.time() < end:
            try:
                c = self.client(socket_connect_timeout=1)
                if c.ping():
                    c.close()
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"redis-server on port {self.port} did not start")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(30)
        self.proc = None

    def restart(self, down_s: float = 0.0, kill: bool = True) -> None:
        """Stop (SIGKILL by default: a crash), stay down ``down_s``, start on the same port and data."""
        self.stop(kill=kill)
        time.sleep(down_s)
        self.start()
