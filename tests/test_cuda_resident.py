"""Planes, Records and gradients resident in device memory on the cuda backend (emulated driver).

Runs without a GPU: ``cuda_emulation.fake_driver`` stands in for PyCUDA and
cuda-bindings and counts every copy it carries out (``driver.copies``:
host-to-device, device-to-host, device-to-device) and every allocation.

- The device-array foundation: ``DeviceArray.__cuda_array_interface__`` (so
  CuPy / PyTorch / Numba take our arrays without a copy), ``.numpy()`` (an
  explicit, counted copy), wrapping another library's device array without a
  copy (a small stand-in class exposing the interface over emulated device
  memory), refusals of arrays we cannot use as they are, and the
  backend-neutral plane interface (``to_plane``, ``copy_plane``,
  ``copy_plane_into``, ``empty_plane``, ``zeros_plane``) on host and device
  backends.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX, fake_driver

needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")


@pytest.fixture
def emulated():
    """``(cuda backend, emulated driver state)``; the NumPy backend again afterwards."""
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            yield backend, driver
        finally:
            vkml.set_backend("numpy")


class ForeignArray:
    """Another library's device array (as CuPy or PyTorch would hand one over): memory it
    allocated itself on the emulated device, exposed only through ``__cuda_array_interface__``."""

    def __init__(self, driver, host, strides=None, typestr=None, ptr=None, readonly=False):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype = host.shape, host.dtype
        self.ptr = driver.alloc(host.nbytes) if ptr is None else ptr
        if host.nbytes and ptr is None:
            ctypes.memmove(self.ptr, host.ctypes.data, host.nbytes)   # its own copy: not counted
        self.strides, self.typestr, self.readonly = strides, typestr or host.dtype.str, readonly

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, self.readonly),
                "strides": self.strides, "version": 3}

    def read(self):
        """What the memory holds now, read by the foreign library itself (not counted)."""
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            ctypes.memmove(out.ctypes.data, self.ptr, out.nbytes)
        return out


def read_interface(obj):
    """The values behind any ``__cuda_array_interface__`` (as a consumer library reads them)."""
    face = obj.__cuda_array_interface__
    out = np.empty(face["shape"], np.dtype(face["typestr"]))
    if out.nbytes:
        ctypes.memmove(out.ctypes.data, face["data"][0], out.nbytes)
    return out


def copies(driver):
    return dict(driver.copies)


def moved(driver, before):
    return {k: driver.copies[k] - before[k] for k in before}


# -- the device-array foundation ---------------------------------------------------------------------

@needs_cxx
def test_a_numpy_plane_is_copied_to_the_device_once_and_read_back_explicitly(emulated):
    backend, driver = emulated
    x = np.arange(12.0).reshape(4, 3)
    before = copies(driver)
    plane = backend.to_plane(x)
    assert moved(driver, before) == {"htod": 1, "dtoh": 0, "dtod": 0}
    assert backend.keeps_planes_on_device and plane.mutable
    assert backend.to_plane(plane) is plane                          # a device plane: itself
    face = plane.__cuda_array_interface__
    assert face == {"shape": (4, 3), "typestr": "<f8", "data": (plane.ptr, False),
                    "strides": None, "version": 3}
    assert np.array_equal(read_interface(plane), x)               # what CuPy would see
    before = copies(driver)
    host = plane.numpy()
    host2 = np.asarray(plane)                  # a plane may change on the device: read again
    assert moved(driver, before) == {"htod": 0, "dtoh": 2, "dtod": 0}
    assert np.array_equal(host, x) and host.flags.writeable and host is not host2


@needs_cxx
def test_a_foreign_device_array_is_wrapped_without_a_copy_and_kept_alive(emulated):
    backend, driver = emulated
    x = np.linspace(0.0, 1.0, 10, dtype=np.float32)
    foreign = ForeignArray(driver, x)
    spare, allocations = backend.gpu.pool.spare_bytes, driver.allocations
    before = copies(driver)
    plane = backend.to_plane(foreign)
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 0}
    assert driver.allocations == allocations
    assert plane.ptr == foreign.ptr and plane.shape == (10,) and plane.dtype == np.float32
    assert plane.__cuda_array_interface__["data"] == (foreign.ptr, False)
    assert np.array_equal(plane.numpy(), x)
    # the wrapper keeps the foreign owner (and so its memory) alive, and never frees it
    alive = weakref.ref(foreign)
    del foreign
    gc.collect()
    assert alive() is not None
    del plane
    gc.collect()
    assert alive() is None
    assert backend.gpu.pool.spare_bytes == spare                   # nothing went to our pool


@needs_cxx
def test_writes_to_a_foreign_plane_land_in_the_foreign_memory(emulated):
    backend, driver = emulated
    foreign = ForeignArray(driver, np.zeros(5))
    plane = backend.to_plane(foreign)
    backend.copy_plane_into(plane, backend.to_plane(np.arange(5.0)))
    assert np.array_equal(foreign.read(), np.arange(5.0))


@needs_cxx
@pytest.mark.parametrize("case, error, match", [
    ("strided", vkml.ArgumentError, "contiguous copy"),
    ("float16", vkml.DTypeError, "float16"),
    ("complex", vkml.DTypeError, "complex128"),
    ("null", vkml.ArgumentError, "null"),
    ("no data", vkml.ArgumentError, "version-3"),
])
def test_foreign_arrays_vkml_cannot_use_as_they_are_are_refused_changing_nothing(emulated, case,
                                                                                   error, match):
    backend, driver = emulated
    x = np.arange(12.0).reshape(3, 4)
    foreign = {
        "strided": lambda: ForeignArray(driver, x, strides=(8, 24)),         # a transposed view
        "float16": lambda: ForeignArray(driver, x.astype(np.float16)),
        "complex": lambda: ForeignArray(driver, x.astype(np.complex128)),
        "null": lambda: ForeignArray(driver, x, ptr=0),
        "no data": lambda: ForeignArray(driver, x),
    }[case]()
    if case == "no data":
        foreign.__class__ = type("Broken", (ForeignArray,), {"__cuda_array_interface__": {
            "shape": (3, 4), "typestr": "<f8"}})
    state = (copies(driver), driver.allocations, backend.gpu.pool.spare_bytes,
             backend.gpu.pool.allocations)
    with pytest.raises(error, match=match):
        backend.to_plane(foreign)
    assert (copies(driver), driver.allocations, backend.gpu.pool.spare_bytes,
            backend.gpu.pool.allocations) == state


@needs_cxx
def test_contiguous_strides_an_empty_array_and_a_read_only_one_are_taken(emulated):
    backend, driver = emulated
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    plane = backend.to_plane(ForeignArray(driver, x, strides=(12, 4)))     # C strides, spelled out
    assert np.array_equal(plane.numpy(), x)
    empty = backend.to_plane(ForeignArray(driver, np.zeros((0, 3)), ptr=0))
    assert empty.shape == (0, 3) and empty.numpy().shape == (0, 3)
    frozen = backend.to_plane(ForeignArray(driver, np.ones(3), readonly=True))
    assert frozen.readonly and frozen.__cuda_array_interface__["data"][1] is True
    before = copies(driver)
    with pytest.raises(vkml.ArgumentError, match="read-only"):
        backend.copy_plane_into(frozen, np.zeros(3))
    assert copies(driver) == before and np.array_equal(frozen.numpy(), np.ones(3))


@needs_cxx
def test_plane_copies_stay_on_the_device(emulated):
    backend, driver = emulated
    plane = backend.to_plane(np.arange(8.0))
    before = copies(driver)
    copy = backend.copy_plane(plane)
    zeros = backend.zeros_plane((8,), np.float64)
    empty = backend.empty_plane((2, 4), np.float32)
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 1}
    assert copy.ptr != plane.ptr and copy.mutable and zeros.mutable and empty.mutable
    assert (empty.shape, empty.dtype) == ((2, 4), np.float32)
    backend.copy_plane_into(plane, zeros)
    assert np.array_equal(copy.numpy(), np.arange(8.0))
    assert np.array_equal(plane.numpy(), np.zeros(8))


@needs_cxx
@pytest.mark.parametrize("src, error", [
    (np.zeros(7), vkml.ShapeError), (np.zeros(8, np.float32), vkml.DTypeError),
    ("device-wrong-shape", vkml.ShapeError)])
def test_copy_plane_into_refuses_a_mismatch_changing_nothing(emulated, src, error):
    backend, driver = emulated
    plane = backend.to_plane(np.arange(8.0))
    if isinstance(src, str):
        src = backend.to_plane(np.zeros((2, 4)))
    before = copies(driver)
    with pytest.raises(error):
        backend.copy_plane_into(plane, src)
    assert copies(driver) == before and np.array_equal(plane.numpy(), np.arange(8.0))


@needs_cxx
def test_a_host_array_of_a_dtype_the_gpu_does_not_compute_with_is_refused(emulated):
    backend, driver = emulated
    with pytest.raises(vkml.DTypeError, match="complex128"):
        backend.to_plane(np.zeros(3, np.complex128))
    assert driver.copies["htod"] == 0


@pytest.mark.parametrize("name", ["numpy", "cpu"])
def test_host_backends_keep_planes_as_numpy_arrays(name):
    backend = vkml.set_backend(name)
    try:
        x = np.arange(4.0)
        assert backend.keeps_planes_on_device is False
        assert backend.to_plane(x) is x
        copy = backend.copy_plane(x)
        assert copy is not x and np.array_equal(copy, x)
        backend.copy_plane_into(copy, np.ones(4))
        assert np.array_equal(copy, np.ones(4)) and np.array_equal(x, np.arange(4.0))
        assert backend.zeros_plane((2,), np.int32).tolist() == [0, 0]
        assert backend.empty_plane((3, 2), np.float32).shape == (3, 2)
    finally:
        vkml.set_backend("numpy")
