"""The per-user cache of compiled code (C libraries, CUDA cubins) and the checks before loading.

One implementation of the rules, shared by the cpu and cuda backends:

* **The directory.**  ``$VKML_CACHE_DIR/<kind>`` (else
  ``$XDG_CACHE_HOME/vkml/<kind>``, else ``~/.cache/vkml/<kind>``) is created
  with mode 0700.  It and the ``vkml`` folder above it must be real
  directories (not symlinks), owned by the current user and writable by
  nobody else; every folder above them must belong to this user or to root
  and be writable by nobody else unless it has the sticky bit (as ``/tmp``
  does), so that no other user can rename our folder away and put theirs in
  its place.  When any of this fails -- a folder of another user, a symlink,
  a group- or world-writable folder, an empty or unwritable ``HOME``, a
  folder we cannot create -- vkml does not stop: it warns once, naming the
  path and the fix, and caches in a private temporary folder of this process
  instead (removed at exit).  A notebook keeps working; it only compiles
  again after a restart.
* **An entry** is two files, ``vk_<key><suffix>`` and a sidecar
  ``vk_<key><suffix>.sha256`` holding ``sha256(key, 0, content)``: the
  sidecar binds the content *and* the key, so two valid entries swapped
  with each other do not verify.  Both files are opened with ``O_NOFOLLOW``
  (a symlink is refused) and ``O_NONBLOCK`` (a FIFO never blocks), and
  ``fstat`` on the open file must show a regular file of ours that nobody
  else can write.  Anything else in an entry's place -- a directory, a FIFO,
  a symlink, text that does not parse, a wrong hash, a file that fails to
  load -- counts as a miss: the code is rebuilt and the bad entry replaced,
  never trusted, never an error.
* **Verify and load the same bytes.**  The bytes are read once from the
  open file, checked, and the loader gets those very bytes: a cubin goes to
  the driver from memory; a C library is written to a fresh private file
  (``mkstemp``, mode 0600) in the checked folder, loaded from there and
  unlinked.  A rename between the check and the load can therefore never
  swap in other code.  (Loading through ``/proc/self/fd/N`` was the other
  way; it is Linux-only, and the dynamic loader recognises libraries by
  name, so a later library opened under a reused descriptor number would be
  given the earlier one.  A fresh file name per load has neither problem,
  and the folder holding it is checked, so it is not on a ``noexec``
  ``/tmp`` unless the user put the cache there.)
* **Writing.**  New files are written to a temporary file in the folder,
  flushed with ``fsync`` and renamed over the entry, so a concurrent
  reader sees the old file or the new one, never half of one.  Failing to
  write the cache (disk full, read-only folder) only costs a recompile in
  the next process.  A folder that fails while code is being built in it
  (full, read-only, no permission, removed) costs one warning: the build is
  done again in a private temporary folder of this process; where that
  fails too, the cpu backend runs the program on NumPy (one more warning).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import warnings

from ..errors import BackendError, VkmlWarning

#: at most this many bytes are read from a sidecar (it holds 64 hex digits)
_SIDECAR_LIMIT = 256
#: the private fallback folder of this process, made on first need
_FALLBACK = [None]
#: the problems already warned about (one warning per problem path)
_WARNED: set = set()


class UnsafeCacheDir(Exception):
    """A cache folder that fails the rules; the message names the path and the fix."""


def requested_dir() -> str:
    """The folder the user asked for (``$VKML_CACHE_DIR``, ``$XDG_CACHE_HOME/vkml`` or
    ``~/.cache/vkml``), absolute; UnsafeCacheDir when only an empty or relative HOME could name it."""
    base = os.environ.get("VKML_CACHE_DIR")
    if base:
        return os.path.abspath(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "vkml")
    home = os.environ.get("HOME")
    if home is None:
        home = os.path.expanduser("~")
    if not home or not os.path.isabs(home):
        raise UnsafeCacheDir(f"HOME is {home!r}, not an absolute path; set VKML_CACHE_DIR to a "
                             "folder of your own")
    return os.path.join(home, ".cache", "vkml")


def cache_dir(kind: str) -> str:
    """The checked folder for ``kind`` (``cpu``, ``cuda``): the user's cache folder, or -- when it
    breaks the rules of the module docstring -- a private temporary one, with one warning."""
    shown = None
    try:
        base = requested_dir()
        shown = base
        _make_private(base, parents=True)
        _check_ancestors(base)
        _check_own_dir(base)
        path = os.path.join(base, kind)
        shown = path
        _make_private(path)
        _check_own_dir(path)
        return path
    except (UnsafeCacheDir, OSError) as e:
        reason = str(e) if isinstance(e, UnsafeCacheDir) else \
            f"{shown} cannot be used ({e.strerror or e}); set VKML_CACHE_DIR to a folder of your own"
        if reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(f"vkml: not using the compiled-code cache: {reason}. Caching in a private "
                          "temporary folder for this process instead.", VkmlWarning, stacklevel=3)
        return _fallback_dir(kind)


def _make_private(path, parents=False):
    """Create ``path`` with mode 0700 (and missing parents) unless something is there already."""
    if parents:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _check_own_dir(path):
    """``path`` is a real directory of ours that nobody else can write and we can write."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheDir(f"{path} is a symlink; point VKML_CACHE_DIR at the real folder")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"{path} is not a directory; remove it or set VKML_CACHE_DIR")
    if st.st_uid != os.geteuid():
        raise UnsafeCacheDir(f"{path} belongs to user id {st.st_uid}, not to you ({os.geteuid()}); "
                             "set VKML_CACHE_DIR to a folder of your own")
    if st.st_mode & 0o022:
        raise UnsafeCacheDir(f"{path} can be written by other users (mode {oct(st.st_mode & 0o777)}); "
                             f"run chmod 700 {path}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UnsafeCacheDir(f"{path} is not writable; run chmod 700 {path} or set VKML_CACHE_DIR")


def _check_ancestors(path):
    """Every folder above ``path`` belongs to us or root, and others can only write it if sticky."""
    folder = os.path.realpath(os.path.dirname(path))
    while True:
        st = os.stat(folder)
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafeCacheDir(f"{folder} (above the cache folder {path}) belongs to user id "
                                 f"{st.st_uid}; set VKML_CACHE_DIR to a folder of your own")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafeCacheDir(f"{folder} (above the cache folder {path}) can be written by other "
                                 "users; set VKML_CACHE_DIR to a folder of your own")
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def _fallback_dir(kind: str) -> str:
    """``<private temporary folder of this process>/<kind>`` (removed when the process exits)."""
    if _FALLBACK[0] is None:
        try:
            root = tempfile.mkdtemp(prefix="vkml-cache-")
        except OSError as e:
            raise BackendError(f"vkml cannot create a private temporary folder for compiled code "
                               f"({e}); set VKML_CACHE_DIR or TMPDIR to a writable folder") from e
        atexit.register(shutil.rmtree, root, True)
        _FALLBACK[0] = root
    path = os.path.join(_FALLBACK[0], kind)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------- entries

def sidecar_text(key: str, data: bytes) -> str:
    """What the sidecar of ``data`` stored under ``key`` holds: a hash of the key and the content."""
    return hashlib.sha256(key.encode() + b"\0" + bytes(data)).hexdigest()


def _read_own_file(path, limit=None):
    """The bytes of ``path`` when it is a regular file of ours that nobody else can write, else None.

    Opened without following a symlink and without blocking on a FIFO; checked on the open file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None                 # missing, a symlink (ELOOP), unreadable: a miss
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                return None
    except OSError:
        return None
    finally:
        os.close(fd)


def read_entry(folder, name: str, key: str):
    """The verified bytes of entry ``name`` stored under ``key``, or None (missing or not trusted)."""
    path = os.path.join(folder, name)
    side = _read_own_file(path + ".sha256", _SIDECAR_LIMIT)
    if side is None:
        return None
    try:
        want = side.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    data = _read_own_file(path)
    if data is None or want != sidecar_text(key, data):
        return None
    return data


def _write_file(folder, name: str, data: bytes):
    """Write ``data`` to a temporary file in ``folder``, fsync it and rename it to ``name``."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, os.path.join(folder, name))
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def _replace(tmp, path):
    """``os.replace``, after moving a directory found in the entry's place out of the way."""
    try:
        os.replace(tmp, path)
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) or \
                not stat.S_ISDIR(os.lstat(path).st_mode):
            raise
        trash = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".trash-")
        os.rename(path, os.path.join(trash, "entry"))   # atomic: the name is free at once
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, path)


def write_entry(folder, name: str, key: str, data: bytes) -> bool:
    """Publish ``data`` as entry ``name`` under ``key`` (content first, then its sidecar).

    Returns False (after one warning) when the folder cannot be written: only a cache is lost."""
    try:
        _write_file(folder, name, data)
        _write_file(folder, name + ".sha256", sidecar_text(key, data).encode())
        return True
    except OSError as e:
        reason = f"{folder}: {e.strerror or e}"
        if reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(f"vkml: could not store compiled code in the cache ({reason}); it will be "
                          "compiled again next time", VkmlWarning, stacklevel=3)
        return False


def cached(kind: str, key: str, suffix: str, build, load):
    """``(load(bytes), compiled)`` for the code stored under ``key``: the verified bytes of the
    cache entry if there is a trusted one that loads, else ``build(folder)`` (which compiles, may
    use a scratch folder inside the checked ``folder``, and counts the compile), stored for next
    time.

    ``load`` gets exactly the bytes that were checked.  A cached entry that fails to load is a miss
    like any other; a fresh build that fails to load raises what ``load`` raised."""
    folder = cache_dir(kind)
    name = f"vk_{key}{suffix}"
    data = read_entry(folder, name, key)
    if data is not None:
        try:
            return load(data, folder), False
        except Exception:           # a bad entry with a good hash: rebuild it, never an error
            pass
    try:
        data = bytes(build(folder))
        write_entry(folder, name, key, data)
        return load(data, folder), True
    except (OSError, BackendError) as e:
        fault = folder_fault(e)
        private = _fallback_dir(kind)
        if fault is None or folder == private:
            raise
    # The folder failed under the build (full, read-only, gone): build in a private one instead.
    reason = f"{folder}: {fault.strerror or fault}"
    warn_once(reason, f"vkml: the compiled-code cache failed while compiling ({reason}); building "
              "in a private temporary folder for this process instead (free some space or set "
              "VKML_CACHE_DIR to keep compiled code between sessions)")
    try:
        data = bytes(build(private))
        return load(data, private), True
    except (OSError, BackendError) as e:
        if folder_fault(e) is None:
            raise
        raise BackendError(f"vkml cannot compile: both the cache folder ({reason}) and a private "
                           f"temporary folder ({private}: {folder_fault(e).strerror}) failed; free "
                           "some disk space or set VKML_CACHE_DIR / TMPDIR to a writable folder") from e


def warn_once(reason: str, message: str) -> None:
    """One ``VkmlWarning`` per problem (``reason``) in a process."""
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(message, VkmlWarning, stacklevel=4)


def fault_in_message(text: str, folder):
    """The folder's OSError a tool's message reports (the compiler or linker saying "No space
    left on device"), or None: its build failed for the folder, not for the code."""
    for number in sorted(_FOLDER_ERRNOS):
        if os.strerror(number) in text:
            return OSError(number, os.strerror(number), folder)
    return None


def folder_fault(error):
    """The OSError of a folder that failed under a build (no space, read-only, no permission,
    removed), found in ``error`` or what it was raised from; None for any other error."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _FOLDER_ERRNOS:
            return error
        error = error.__cause__
    return None


#: errors of a folder (not of the code being built): a build meeting one is retried elsewhere
_FOLDER_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENOENT", "ENOTDIR", "EIO", "EFBIG")
    if hasattr(errno, name))


def load_private_copy(data: bytes, folder, loader):
    """``loader(path)`` for a fresh private file holding ``data`` in the checked ``folder``.

    The file is made by ``mkstemp`` (mode 0600, a new name: the dynamic loader never mistakes
    it for a library it has loaded before) and unlinked once loaded."""
    fd, path = tempfile.mkstemp(dir=folder, prefix=".load-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return loader(path)
    finally:
        os.remove(path)
