"""NVRTC, CUDA's runtime compiler, through ctypes: generated CUDA C to a cubin in-process.

Running ``nvcc`` costs 0.5-1.5 s per module (a process, a host compiler pass, files); NVRTC
compiles the same source in the calling process in a fraction of that, with the same options
(``-fmad=false`` and the rest of ``NVCC_FLAGS``), so the cuda backend uses it when the library is
found (the toolkit's ``lib64``, the ``nvidia-cuda-nvrtc`` wheel, or the loader's path) and falls
back to nvcc otherwise -- or for good, with the reason in ``backend_info()``, when NVRTC fails on a
module nvcc compiles.  ``VKML_CUDA_NVRTC=0`` always uses nvcc.

NVRTC has no C library headers: ``<stdint.h>`` (the only one generated code includes) is replaced
by the fixed-width typedefs it provides.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import shutil

#: what replaces ``#include <stdint.h>`` for NVRTC (the CUDA targets' LP64 model)
STDINT = """typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t;
typedef long long int64_t; typedef unsigned long long uint64_t;"""


class NvrtcError(Exception):
    """NVRTC refused a module (its log is the message)."""


def toolkit_libraries(stem: str) -> list:
    """The shared libraries ``stem.so*`` (``libnvrtc``, ``libcublas``) of NVIDIA's Python wheels
    (``nvidia/*/lib``), then of the CUDA toolkit that ``nvcc`` belongs to."""
    names = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        names += sorted(glob.glob(os.path.join(root, "*", "lib", f"{stem}.so*")))
    nvcc = shutil.which("nvcc")
    if nvcc:
        top = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        names += sorted(glob.glob(os.path.join(top, "lib64", f"{stem}.so*")))
        names += sorted(glob.glob(os.path.join(top, "targets", "*", "lib", f"{stem}.so*")))
    return names


def candidates() -> list:
    """Where libnvrtc may be: the wheels' and the toolkit's, then the loader's path."""
    return toolkit_libraries("libnvrtc") + ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]


class Nvrtc:
    """A loaded libnvrtc: :meth:`cubin` compiles one module."""

    def __init__(self, lib, path):
        self.lib, self.path = lib, path
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            raise OSError("nvrtcVersion failed")
        self.version = f"nvrtc {major.value}.{minor.value}"

    @classmethod
    def load(cls, opener=ctypes.CDLL):
        """The first library of :func:`candidates` that loads, or None."""
        if os.environ.get("VKML_CUDA_NVRTC", "1") == "0":
            return None
        for name in candidates():
            try:
                return cls(opener(name), name)
            except (OSError, AttributeError):
                continue
        return None

    def cubin(self, source: str, arch: str, flags) -> bytes:
        """The cubin of ``source`` for ``arch`` (``sm_90``) compiled with ``flags``."""
        lib = self.lib
        source = source.replace("#include <stdint.h>", STDINT)
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"vkml.cu", 0,
                                           None, None), "nvrtcCreateProgram")
        try:
            options = [f"--gpu-architecture={arch}".encode()] + [f.encode() for f in flags]
            array = (ctypes.c_char_p * len(options))(*options)
            if lib.nvrtcCompileProgram(prog, len(options), array) != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(max(1, size.value))
                lib.nvrtcGetProgramLog(prog, log)
                raise NvrtcError(log.value.decode(errors="replace")[-4000:])
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw[:size.value]
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    @staticmethod
    def _check(code, call):
        if code != 0:
            raise NvrtcError(f"{call} returned {code}")
