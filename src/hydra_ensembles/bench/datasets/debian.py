"""Data shipped in Debian packages, fetched with `apt-get download` and unpacked with `dpkg -x` (no root needed)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import cache_dir


class DataFetchError(RuntimeError):
    """A data set could not be fetched (no apt-get, no network to the Debian mirror)."""


def debian_package(name: str) -> Path:
    """The root of package `name` unpacked under the data cache, fetching it on first use."""
    root = cache_dir() / "data" / "debian" / name
    if (root / ".complete").exists():
        return root
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise DataFetchError(f"the Debian package {name!r} is needed, but apt-get/dpkg are not on this machine.")
    with tempfile.TemporaryDirectory() as tmp:
        fetched = subprocess.run(["apt-get", "download", name], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob(f"{name}_*.deb"))
        if fetched.returncode != 0 or not debs:
            raise DataFetchError(f"`apt-get download {name}` failed: {fetched.stderr.strip()[-500:]}")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run(["dpkg", "-x", str(debs[0]), str(root)], check=True)
    (root / ".complete").touch()
    return root
