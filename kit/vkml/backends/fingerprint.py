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
C function below (four chains of sixteen multiply-xorshift lanes over 32-bit words, held in vector
registers with GCC's vector extension, which clang has too; the tail byte by byte) runs at memory speed (about 60 GB/s
from the cache, 40 GB/s from memory here).  It is used where the cpu tier can build it (a
C compiler), CRC-32 elsewhere.  A fingerprint is a checksum, not a cryptographic hash: it
guards against mistakes, not against someone choosing bytes to collide.
"""

from __future__ import annotations

import ctypes
import functools
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

typedef uint32_t vk_lanes __attribute__((vector_size(64)));   /* 16 lanes in registers */

uint64_t vk_fingerprint(const unsigned char* p, int64_t n) {
    /* four chains of 16 lanes: a multiply's latency is hidden behind the other three */
    vk_lanes h[4], w;
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 16; j++) h[c][j] = 0x9e3779b9u * (uint32_t)(16 * c + j + 1);
    int64_t i = 0;
    for (; i + 256 <= n; i += 256) {
        for (int c = 0; c < 4; c++) {
            memcpy(&w, p + i + 64 * c, 64);
            h[c] = (h[c] ^ w) * 0x85ebca6bu;
            h[c] ^= h[c] >> 15;
        }
    }
    /* lanes, then the tail's words and bytes, each mixed with its place (independent mixes:
       they run side by side) and summed */
    uint64_t r = vk_mix((uint64_t)n);
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 16; j++) r += vk_mix(h[c][j] ^ ((uint64_t)(16 * c + j + 1) << 32));
    for (uint64_t at = 1; i + 8 <= n; i += 8, at++) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        r += vk_mix(vk_mix(word) ^ (at << 56) ^ 0x5bd1e995u);
    }
    for (uint64_t at = 1; i < n; i++, at++) r += vk_mix(((uint64_t)p[i] << 8) ^ (at << 48) ^ 0x27d4eb2fu);
    return vk_mix(r);
}

/* The fingerprints of k arrays in one call.  items[0..k+1] are array objects, each with its data
   pointer at byte offset data_offset: the k arrays, then their sizes in bytes (int64), then
   where their fingerprints go (uint64). */
void vk_fingerprints(void* const* items, int64_t k, int64_t data_offset) {
    const unsigned char* data[2];
    memcpy(&data[0], (const char*)items[k] + data_offset, sizeof data[0]);
    memcpy(&data[1], (const char*)items[k + 1] + data_offset, sizeof data[1]);
    const int64_t* nbytes = (const int64_t*)data[0];
    uint64_t* out = (uint64_t*)data[1];
    for (int64_t a = 0; a < k; a++) {
        const unsigned char* p;
        memcpy(&p, (const char*)items[a] + data_offset, sizeof p);
        out[a] = vk_fingerprint(p, nbytes[a]);
    }
}
"""

@functools.lru_cache(maxsize=None)     # (built once per process; a race builds it twice, harmlessly)
def _function():
    from .cpu import DATA_OFFSET, TUPLE_ITEMS, compiler, library   # local: cpu imports more
    if compiler() is None or DATA_OFFSET is None or TUPLE_ITEMS is None:
        return None
    try:
        lib, _ = library(_SOURCE)
    except BackendError:
        return None
    fn = lib.vk_fingerprints
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    fn.keep = lib
    fn.items, fn.data = TUPLE_ITEMS, DATA_OFFSET
    return fn


def fingerprints(arrays) -> list:
    """A checksum of each array's bytes in memory order (see the module docstring; its shape and
    dtype are not in it: a Record checks those separately), None for what is not a NumPy array
    (a device plane).  One C call for all of them where the cpu tier can build it."""
    host = [a if a.flags.c_contiguous else np.ascontiguousarray(a)
            for a in arrays if type(a) is np.ndarray]
    fn = _function()
    if not host:
        sums = []
    elif fn is not None:
        sums = np.empty(len(host), np.uint64)
        block = (*host, np.array([a.nbytes for a in host], np.int64), sums)   # (items in a row)
        fn(id(block) + fn.items, len(host), fn.data)
        sums = sums.tolist()
    else:
        sums = [zlib.crc32(memoryview(a).cast("B")) if a.nbytes else 0 for a in host]
    if len(host) == len(arrays):
        return list(sums)
    sums = iter(sums)
    return [next(sums) if type(a) is np.ndarray else None for a in arrays]
