"""The per-user cache of compiled code (C libraries, CUDA cubins) and the checks before loading.

One place for the rules DESIGN.md sets: a directory of mode 0700 per user;
files named by a hash of their source and flags; a SHA-256 kept beside each
file; a file that does not match it, or that another user can write, is
rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import os


def cache_dir(kind: str) -> str:
    """``$VKML_CACHE_DIR/<kind>`` (default ``~/.cache/vkml/<kind>``), created with mode 0700."""
    base = os.environ.get("VKML_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vkml")
    path = os.path.join(base, kind)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def trusted(path) -> bool:
    """Ours and writable by nobody else."""
    st = os.stat(path)
    return st.st_uid == os.getuid() and not st.st_mode & 0o022
