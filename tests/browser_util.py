"""Headless Chromium for the report tests: installed from Debian's ``chromium`` package when missing.

:func:`open_in_browser` loads a page with ``--dump-dom`` (after the page's scripts ran) and returns the
``<body>`` attributes the report's own check script wrote, plus every console line Chromium logged;
:func:`screenshot` saves a PNG.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]


def chromium() -> str:
    """Path of the chromium binary; installs Debian's ``chromium`` package (apt) when it is missing."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-q"], check=True, env=env, timeout=600, capture_output=True)
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-q", "chromium"],
        check=True,
        env=env,
        timeout=900,
        capture_output=True,
    )
    path = shutil.which("chromium")
    if path is None:
        raise RuntimeError("apt-get installed chromium but no chromium binary is on PATH")
    return path


def open_in_browser(binary: str, page: Path) -> tuple[dict[str, str], list[str]]:
    proc = subprocess.run(
        [
            binary,
            *FLAGS,
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    m = re.search(r"<body([^>]*)>", proc.stdout)
    if m is None:
        raise AssertionError(f"chromium returned no DOM (exit {proc.returncode}): {proc.stderr[-2000:]}")
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return attrs, console


def screenshot(binary: str, page: Path, out: Path, height: int = 6000) -> Path:
    subprocess.run(
        [binary, *FLAGS, f"--window-size=1400,{height}", f"--screenshot={out}", page.resolve().as_uri()],
        capture_output=True,
        timeout=180,
        check=True,
    )
    return out
