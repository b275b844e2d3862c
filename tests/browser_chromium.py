"""Debian's Chromium for the browser tests: found, else installed with apt-get where that can be done, else a skip."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpufarm_sandbox.browser import find_chromium


def installed_chromium() -> str:
    """Debian's chromium; installed with apt-get when missing and possible (CI runs as root), else a skip."""
    found = find_chromium()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")
    install = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=900, check=False)
    found = find_chromium()
    if done.returncode != 0 or not found:
        pytest.skip(f"chromium is not installed and apt-get could not install it: {done.stderr.strip()[-300:]}")
    return found
