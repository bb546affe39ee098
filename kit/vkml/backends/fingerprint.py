"""A fingerprint of an array's bytes: how a Record notices a plane changed after its launch.

Why: a Record reads the planes its launch left (the graph's inputs among them) when it is
reversed, without copying them -- copying every input at every launch would double the memory
a recorded launch needs.  If the user writes into one of those planes between the launch and
the reverse, the reverse would silently mix the new values with the launch's.  So a Record
takes a fingerprint of each plane it will read when the launch ends and checks them again
before a reverse: a changed plane is refused by name.

A fingerprint must see every byte (a change of one element anywhere) and where it is (two
elements swapped), and cost little beside the launch itself: a recorded launch of 10^6
samples moves tens of megabytes.  zlib's CRC-32 does the first two at about 2 GB/s here; the
C function below (four independent multiply-xorshift lanes over 64-bit words, the tail byte by
byte) runs at memory speed, about 10-20 GB/s.  It is used where the cpu tier can build it (a
C compiler), CRC-32 elsewhere.  A fingerprint is a checksum, not a cryptographic hash: it
guards against mistakes, not against someone choosing bytes to collide.
"""

from __future__ import annotations

import ctypes
import threading
import zlib

import numpy as np

from ..errors import BackendError

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static uint64_t vk_mix(uint64_t h) {
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

uint64_t vk_fingerprint(const unsigned char* p, int64_t n) {
    const uint64_t k = 0x9e3779b97f4a7c15ULL;
    uint64_t a = 1, b = 2, c = 3, d = 4;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        a = (a ^ w[0]) * k; b = (b ^ w[1]) * k; c = (c ^ w[2]) * k; d = (d ^ w[3]) * k;
        a ^= a >> 29; b ^= b >> 29; c ^= c >> 29; d ^= d >> 29;
    }
    uint64_t h = vk_mix(a) ^ vk_mix(b + 1) ^ vk_mix(c + 2) ^ vk_mix(d + 3) ^ (uint64_t)n;
    for (; i < n; i++) h = (h ^ p[i]) * k;
    return vk_mix(h);
}
"""

_lock = threading.Lock()
_helper = []        # [] before the first try; then [function or None]


def _function():
    if not _helper:
        with _lock:
            if not _helper:
                _helper.append(_build())
    return _helper[0]


def _build():
    from .cpu import compiler, library   # local: cpu imports more than this module needs
    if compiler() is None:
        return None
    try:
        lib, _ = library(_SOURCE)
    except BackendError:
        return None
    fn = lib.vk_fingerprint
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    fn.keep = lib
    return fn


def fingerprint(array) -> int:
    """A checksum of ``array``'s bytes in memory order, its dtype and shape (see the module
    docstring); None for what is not a NumPy array (a device plane)."""
    if type(array) is not np.ndarray:
        return None
    data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    fn = _helper[0] if _helper else _function()
    if fn is not None:
        body = fn(data.ctypes.data, data.nbytes)
    else:
        body = zlib.crc32(memoryview(data).cast("B")) if data.nbytes else 0
    return hash((body, array.dtype.str, array.shape))
