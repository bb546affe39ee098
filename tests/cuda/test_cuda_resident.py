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
- The graph layer on device planes: after ``build()`` (each NumPy plane copied
  to the device once, a foreign device array used where it lies) a launch and
  a reverse are one CUDA-graph replay each and move no plane across PCIe --
  the only host<->device copies are the replay's pointer table, its
  small-argument block (the Param cells) and its status words, and the Param
  gradients (one value each) -- with the NumPy backend's bits (planes,
  per-sample gradients, canonical-tree Param sums); the Record's copies,
  ``keep()`` and backups are copies on the device; refusals change nothing;
  graphs whose nodes run Python on the values (opaque nodes, reductions) go
  through the host explicitly, and those copies are counted too; guards and
  loops whose guards are cells run on the device.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX

needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")


class ForeignArray:
    """Another library's device array (as CuPy or PyTorch would hand one over): memory it
    allocated itself on the emulated device, exposed only through ``__cuda_array_interface__``."""

    def __init__(self, driver, host, strides=None, typestr=None, ptr=None, readonly=False):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype = host.shape, host.dtype
        self.ptr = driver.alloc_as_another_library(host.nbytes) if ptr is None else ptr
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
def test_a_numpy_plane_is_copied_to_the_device_once_and_read_back_explicitly(emulated_cuda):
    backend, driver = emulated_cuda
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
def test_a_foreign_device_array_is_wrapped_without_a_copy_and_kept_alive(emulated_cuda):
    backend, driver = emulated_cuda
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
def test_writes_to_a_foreign_plane_land_in_the_foreign_memory(emulated_cuda):
    backend, driver = emulated_cuda
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
def test_foreign_arrays_vkml_cannot_use_as_they_are_are_refused_changing_nothing(emulated_cuda, case,
                                                                                   error, match):
    backend, driver = emulated_cuda
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
def test_contiguous_strides_an_empty_array_and_a_read_only_one_are_taken(emulated_cuda):
    backend, driver = emulated_cuda
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
def test_plane_copies_stay_on_the_device(emulated_cuda):
    backend, driver = emulated_cuda
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
def test_copy_plane_into_refuses_a_mismatch_changing_nothing(emulated_cuda, src, error):
    backend, driver = emulated_cuda
    plane = backend.to_plane(np.arange(8.0))
    if isinstance(src, str):
        src = backend.to_plane(np.zeros((2, 4)))
    before = copies(driver)
    with pytest.raises(error):
        backend.copy_plane_into(plane, src)
    assert copies(driver) == before and np.array_equal(plane.numpy(), np.arange(8.0))


@needs_cxx
def test_a_host_array_of_a_dtype_the_gpu_does_not_compute_with_is_refused(emulated_cuda):
    backend, driver = emulated_cuda
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


# -- the graph layer on device planes ----------------------------------------------------------------
#
# Kernels of + - * / sqrt only: correctly rounded everywhere, so the emulated GPU (the same C
# operations, compiled without contraction) and the NumPy backend give the same bits.

@vkml.kernel
def square(x, c: vkml.Param):
    return {"u": x * x + c}


@vkml.kernel
def bend(u, x, k: vkml.Param):
    return {"y": k * u / (1.0 + x * x) - vkml.sqrt(u + 1.0)}


@vkml.kernel
def relax(s, k: vkml.Param):
    return {"s": s * k + vkml.sqrt(s * s + 1.0)}


@vkml.kernel
def look(i, u, table: vkml.Param):
    return {"y": table[i] * u}


def two_node(n, x=None, u=None, y=None):
    """square -> bend: u = x*x + c, y = k*u/(1+x*x) - sqrt(u+1) (nothing overwritten)."""
    x = np.random.default_rng(0).uniform(-1.0, 1.0, n) if x is None else x
    u = np.zeros(n) if u is None else u
    y = np.zeros(n) if y is None else y
    return (vkml.Graph().add(square.bind(x=x, c=0.5, u=u), name="square")
            .add(bend.bind(u=u, x=x, k=1.5, y=y), name="bend").build(record=True))


def overwriting(n):
    """relax twice on one plane s, then bend reads s: the Record copies the version the second
    relax overwrites."""
    s = np.random.default_rng(1).uniform(0.1, 1.0, n)
    y = np.zeros(n)
    return (vkml.Graph().add(relax.bind(s=s, k=0.5), name="a").add(relax.bind(s=s, k=0.75), name="b")
            .add(bend.bind(u=s, x=s, k=1.25, y=y), name="c").build(record=True))


@vkml.kernel
def ignore_z(x, z, k: vkml.Param):
    return {"y": k * x * x}


def unreached(n):
    """A kernel that reads z but computes nothing from it: z's gradient is zeros no cotangent
    reached, made beside the others (on the device there)."""
    rng = np.random.default_rng(2)
    x, z, y = rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, n), np.zeros(n)
    return vkml.Graph().add(ignore_z.bind(x=x, z=z, k=0.5, y=y), name="i").build(record=True)


GRAPHS = {"two nodes": (two_node, {"y": "seed"}),
          "overwritten plane": (overwriting, {"c.y": "seed", "b.s": "seed2"}),
          "unreached input": (unreached, {"y": "seed"})}


def seeds_for(graph, names, n, device=None):
    out = {}
    for name, which in names.items():
        seed = np.linspace(1.0, 2.0, n) if which == "seed" else np.linspace(-1.0, 0.5, n)
        out[name] = device.to_plane(seed) if device is not None else seed
    return out


def on_numpy(make, names, n):
    """The graph's planes after a launch, its Record's bytes and its gradients on NumPy."""
    vkml.set_backend("numpy")
    g = make(n)
    g.launch()
    grads = vkml.diff.reverse(g.record, seeds_for(g, names, n))
    return ({k: np.array(v) for k, v in g.planes.items()}, g.record.nbytes,
            {k: np.array(v) for k, v in grads.items()})


def same_bits(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.shape == w.shape and g.dtype == w.dtype and g.tobytes() == w.tobytes(), k


def replay_copies(driver, before_log, exe):
    """The copies a graph replay of ``exe`` made across PCIe since ``before_log``: each one the
    pointer table, the small-argument block (the Param cells) or the status words."""
    what = {int(exe.table): "pointer table", int(exe.status): "status words"}
    if exe.small_dev is not None:
        what[int(exe.small_dev)] = "small arguments"
    out = []
    for kind, dst, src, nbytes in driver.copy_log[before_log:]:
        if kind != "dtod":
            out.append((kind, what.get(dst if kind == "htod" else src, f"{nbytes} bytes")))
    return sorted(out)


@needs_cxx
@pytest.mark.parametrize("case", list(GRAPHS))
def test_launch_and_reverse_move_no_plane_across_pcie_and_give_numpys_bits(emulated_cuda, case):
    backend, driver = emulated_cuda
    make, names = GRAPHS[case]
    n = 1000                                           # not a power of two: the tree is padded
    want_planes, want_nbytes, want_grads = on_numpy(make, names, n)
    vkml.set_backend("cuda")
    before = copies(driver)
    g = make(n)
    planes = len(g.planes)
    assert moved(driver, before) == {"htod": planes, "dtoh": 0, "dtod": 0}     # once, at build
    assert all(type(p).__name__ == "DeviceArray" for p in g.planes.values())
    for rounds in range(2):                            # the first captures the CUDA graph
        before, log = copies(driver), len(driver.copy_log)
        launches, submissions = vkml.stats().graph_launches, vkml.stats().submissions
        g.launch()
        # the first round runs launch by launch (checked), then captures; later ones replay
        assert vkml.stats().graph_launches - launches == rounds                  # one replay
        assert vkml.stats().submissions - submissions == 1
        plan = next(iter(g.caches.launch_plans.values()))
        assert replay_copies(driver, log, plan.exe) == [
            ("dtoh", "status words"), ("htod", "pointer table"), ("htod", "small arguments")]
        # a plane the launch reads and rewrites (s) is copied into on the device, once
        assert moved(driver, before)["dtod"] == (1 if case == "overwritten plane" else 0)
        assert g.record.nbytes == want_nbytes and g.record.on_device
        seeds = seeds_for(g, names, n, device=backend)
        before, log = copies(driver), len(driver.copy_log)
        launches = vkml.stats().graph_launches
        grads = vkml.diff.reverse(g.record, seeds)
        assert vkml.stats().graph_launches - launches == rounds
        (rplan,) = [p for p in g.caches.reverse_plans.values()]
        params = len(rplan.params)
        # the Param sums (one value each) come to the host; no plane does
        assert replay_copies(driver, log, rplan.exe) == sorted(
            [("dtoh", "status words"), ("htod", "pointer table"), ("htod", "small arguments")] +
            [("dtoh", "8 bytes")] * params)
        assert moved(driver, before)["dtod"] == 0
        for name, grad in grads.items():
            if grad.ndim:                              # per-sample gradients stay on the device
                assert type(grad).__name__ == "DeviceArray", name
                assert grad.__cuda_array_interface__["shape"] == (n,)
        same_bits({k: v.numpy() for k, v in g.planes.items()}, want_planes)
        same_bits({k: np.asarray(v) for k, v in grads.items()}, want_grads)
        # the second round from the same starting planes: written back as build() had them
        vkml.set_backend("numpy")
        start = make(n).planes
        vkml.set_backend("cuda")
        for name, plane in start.items():
            g.planes[name][...] = plane


@needs_cxx
def test_the_fused_reverse_over_more_samples_than_one_host_chunk_has_numpys_bits(emulated_cuda):
    """On the device the reverse is one program over all the samples; on the host it runs in
    chunks of FUSE_SAMPLES whose Param sums are subtrees of the canonical tree: same bits."""
    backend, driver = emulated_cuda
    from vkml.graph.graph_reverse import FUSE_SAMPLES
    n = FUSE_SAMPLES + 1000
    want_planes, _, want_grads = on_numpy(two_node, {"y": "seed"}, n)
    vkml.set_backend("cuda")
    g = two_node(n)
    g.launch()
    seeds = seeds_for(g, {"y": "seed"}, n, device=backend)
    before = copies(driver)
    grads = vkml.diff.reverse(g.record, seeds)
    assert moved(driver, before) == {"htod": 2, "dtoh": 1 + 2, "dtod": 0}   # + the 2 Param sums
    same_bits({k: v.numpy() for k, v in g.planes.items()}, want_planes)
    same_bits({k: np.asarray(v) for k, v in grads.items()}, want_grads)


@needs_cxx
def test_planes_bound_as_foreign_device_arrays_are_used_without_a_copy(emulated_cuda):
    backend, driver = emulated_cuda
    n = 300
    want_planes, _, want_grads = on_numpy(two_node, {"y": "seed"}, n)
    vkml.set_backend("cuda")
    x = ForeignArray(driver, np.random.default_rng(0).uniform(-1.0, 1.0, n))
    y = ForeignArray(driver, np.zeros(n))
    before = copies(driver)
    g = two_node(n, x=x, y=y)                                 # u: a NumPy array, copied once
    assert moved(driver, before) == {"htod": 1, "dtoh": 0, "dtod": 0}
    assert g.planes["x"].ptr == x.ptr and g.planes["y"].ptr == y.ptr
    g.launch()
    assert y.read().tobytes() == want_planes["y"].tobytes()     # written in the foreign memory
    seed = ForeignArray(driver, np.linspace(1.0, 2.0, n))
    before = copies(driver)
    grads = vkml.diff.reverse(g.record, {"y": seed})
    assert moved(driver, before)["htod"] == 2                  # the table, the small block only
    # another library reads the gradient where it lies
    assert read_interface(grads["x"]).tobytes() == want_grads["x"].tobytes()
    same_bits({k: np.asarray(v) for k, v in grads.items()}, want_grads)


@needs_cxx
def test_refusals_on_device_planes_change_nothing(emulated_cuda):
    backend, driver = emulated_cuda
    n = 64
    g = two_node(n)
    g.launch()
    snapshot = lambda: ({k: v.numpy().tobytes() for k, v in g.planes.items()},   # noqa: E731
                        g.generation, g.record, g.record.live)
    long_seed, f32_seed = backend.to_plane(np.ones(n + 1)), backend.to_plane(np.ones(n, np.float32))
    strided = ForeignArray(driver, np.ones((n, 2)), strides=(8, 8 * n))
    wrong_rows, f32_out = ForeignArray(driver, np.ones(n + 1)), ForeignArray(driver, np.zeros(n, np.float32))
    f16 = ForeignArray(driver, np.ones(n), typestr="<f2")
    state = snapshot()
    bad = [
        (lambda: vkml.diff.reverse(g.record, {"y": long_seed}), vkml.ShapeError, "seed 'y' has shape"),
        (lambda: vkml.diff.reverse(g.record, {"y": f32_seed}), vkml.DTypeError, "float32"),
        (lambda: vkml.diff.reverse(g.record, {"y": strided}), vkml.ArgumentError, "contiguous"),
        (lambda: g.planes["x"].__setitem__(Ellipsis, np.ones(n + 1)), vkml.ShapeError, "shape"),
        (lambda: g.planes["x"].__setitem__(slice(0, 3), 1.0), vkml.ArgumentError, "whole"),
        (lambda: g.planes["x"].__setitem__(Ellipsis, np.ones(n, np.complex128)), vkml.DTypeError,
         "complex"),
        (lambda: square.bind(x=wrong_rows, c=0.5, u=np.zeros(n)), vkml.ShapeError,
         "different numbers of rows"),
        (lambda: square.bind(x=np.ones(n), c=0.5, u=f32_out), vkml.ShapeError,
         "bind a plane of the output's type"),
        (lambda: square.bind(x=f16, c=0.5, u=np.zeros(n)), vkml.DTypeError, "kernel square: plane 'x'"),
    ]
    for call, error, match in bad:
        before = copies(driver)
        with pytest.raises(error, match=match):
            call()
        assert copies(driver) == before and snapshot() == state, match
    grads = vkml.diff.reverse(g.record, {"y": backend.to_plane(np.ones(n))})   # still reversible
    assert grads["x"].shape == (n,)


@needs_cxx
def test_a_graph_lives_on_the_backend_it_was_built_on(emulated_cuda):
    backend, driver = emulated_cuda
    g = two_node(16)
    vkml.set_backend("numpy")
    with pytest.raises(vkml.ArgumentError, match="built on the cuda backend"):
        g.launch()
    with pytest.raises(vkml.ArgumentError, match="keeps planes in host memory"):
        square.bind(x=backend.to_plane(np.ones(4)), c=0.5, u=np.zeros(4))
    vkml.set_backend("cuda")
    assert g.launch().generation == 1


@needs_cxx
def test_update_keep_and_rebuild_on_device_planes(emulated_cuda):
    backend, driver = emulated_cuda
    n = 100
    vkml.set_backend("numpy")
    ref = two_node(n)
    ref.launch()
    ref.record.keep()
    ref.update(k=0.25)
    ref.launch()
    want_new = {k: np.array(v) for k, v in vkml.diff.reverse(ref.record, {"y": np.ones(n)}).items()}
    vkml.set_backend("cuda")
    g = two_node(n)
    g.launch()
    before = copies(driver)
    kept = g.record.keep()
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": len(g.planes)}
    g.update(k=0.25)                                   # a Param cell: host, no plane moves
    before = copies(driver)
    g.launch()
    assert moved(driver, before) == {"htod": 2, "dtoh": 1, "dtod": 0}
    assert g.planes["y"].numpy().tobytes() == ref.planes["y"].tobytes()
    same_bits({k: np.asarray(v) for k, v in vkml.diff.reverse(g.record, {"y": np.ones(n)}).items()},
              want_new)
    assert vkml.diff.reverse(kept, {"y": np.ones(n)})["c"] != want_new["c"]   # the older launch's
    # building again keeps the device planes (and what the launches left in them)
    y = g.planes["y"]
    before = copies(driver)
    g.build(record=True)
    assert g.planes["y"] is y and copies(driver) == before


@needs_cxx
def test_a_launch_failing_on_the_device_changes_no_device_plane(emulated_cuda):
    backend, driver = emulated_cuda
    n = 8
    i = np.arange(n) % 3
    u, y = np.linspace(1.0, 2.0, n), np.zeros(n)
    g = vkml.Graph().add(look.bind(i=i, u=u, table=np.array([1.0, 2.0, 3.0]), y=y),
                         name="look").build(record=True)
    g.launch()
    g.record.keep()
    state = {k: v.numpy().tobytes() for k, v in g.planes.items()}
    g.planes["i"][...] = np.full(n, 7)                # out of range for a table of 3
    state["i"] = g.planes["i"].numpy().tobytes()
    with pytest.raises(vkml.ExecutionError, match="look"):
        g.launch()
    assert {k: v.numpy().tobytes() for k, v in g.planes.items()} == state
    assert g.generation == 1


@needs_cxx
def test_several_runs_back_up_the_written_planes_on_the_device(emulated_cuda):
    backend, driver = emulated_cuda
    n = 32
    s = np.random.default_rng(1).uniform(0.1, 1.0, n)
    vkml.set_backend("numpy")
    ref_s = s.copy()
    vkml.Graph().add(relax.bind(s=ref_s, k=0.5), name="a").build().launch(3)
    vkml.set_backend("cuda")
    g = vkml.Graph().add(relax.bind(s=s, k=0.5), name="a").build()
    before = copies(driver)
    g.launch(3)
    # one backup copy of s on the device, and s copied into after each of the three runs
    assert moved(driver, before) == {"htod": 3 * 2, "dtoh": 3, "dtod": 1 + 3}
    assert g.planes["s"].numpy().tobytes() == ref_s.tobytes()


@needs_cxx
def test_an_opaque_node_brings_the_planes_to_the_host_explicitly_and_back(emulated_cuda):
    """A node that runs Python on the values needs them on the host: each device plane made from
    a NumPy array is copied down once before the launch and each written one up once after; the
    kernels in between run on the GPU on host arguments (staged in, copied back)."""
    backend, driver = emulated_cuda
    n = 50

    def make():
        x, u, v = np.linspace(0.1, 0.9, n), np.zeros(n), np.zeros(n)
        node = vkml.graph.opaque(lambda r: {"v": 3.0 * r["u"]}, reads={"u": u}, writes={"v": v},
                                 name="triple")
        return (vkml.Graph().add(square.bind(x=x, c=0.5, u=u), name="square").add(node)
                .build(record=True))

    def vjp(primals, cts):
        return {"u": 3.0 * cts["v"]}

    vkml.set_backend("numpy")
    ref = make()
    ref.launch()
    want = {k: np.array(g) for k, g in
            vkml.diff.reverse(ref.record, {"v": np.ones(n)}, vjps={"triple": vjp}).items()}
    vkml.set_backend("cuda")
    g = make()
    before = copies(driver)
    g.launch()
    # down: x, u and v; square's kernel on host arguments: up its pointer table and its small
    # block (c, and x: 400 bytes), down its status words and u; up: u and v
    assert moved(driver, before) == {"htod": 2 + 2, "dtoh": 3 + 2, "dtod": 0}
    assert g.planes["v"].numpy().tobytes() == ref.planes["v"].tobytes()
    grads = vkml.diff.reverse(g.record, {"v": np.ones(n)}, vjps={"triple": vjp})
    same_bits({k: np.asarray(v) for k, v in grads.items()}, want)


@vkml.kernel
def halve(s, k: vkml.Param):
    return {"s": s * k}


@needs_cxx
def test_guards_and_loops_run_on_the_device_with_numpys_bits(emulated_cuda):
    """skippable and repeat_while whose guards are SkipGuard cells (read on the host, not planes
    of the graph) run node by node on the device planes, and so does their reverse; a plane
    bound as a device array is used where it lies (test_cuda_host_stepped_resident counts the
    copies)."""
    backend, driver = emulated_cuda
    n = 40

    def make(x):
        s, u = np.linspace(1.0, 2.0, n), np.zeros(n)
        loop = vkml.repeat_while(halve.bind(s=s, k=0.5), vkml.SkipGuard.nonzero(np.ones(1)),
                                 max_iters=5)
        return (vkml.Graph().add(square.bind(x=x, c=0.5, u=u), name="sq")
                .add(vkml.skippable(relax.bind(s=s, k=0.5), vkml.SkipGuard.nonzero(np.ones(1))),
                     name="maybe")
                .add(loop, name="loop").build(record=True))

    seeds = {"s": np.ones(n), "u": np.linspace(1.0, 2.0, n)}
    vkml.set_backend("numpy")
    ref = make(np.linspace(0.1, 0.9, n))
    ref.launch()
    want = {k: np.array(v) for k, v in vkml.diff.reverse(ref.record, seeds).items()}
    vkml.set_backend("cuda")
    x = ForeignArray(driver, np.linspace(0.1, 0.9, n))
    g = make(x)
    assert g.planes["x"].ptr == x.ptr
    g.launch()
    assert g.record.on_device and g.record.iterations == {"loop": 5}
    same_bits({k: v.numpy() for k, v in g.planes.items()}, dict(ref.planes))
    same_bits({k: np.asarray(v) for k, v in vkml.diff.reverse(g.record, seeds).items()}, want)


@needs_cxx
def test_host_threads_do_not_split_a_launch_on_the_device(emulated_cuda, monkeypatch):
    backend, driver = emulated_cuda
    monkeypatch.setenv("VKML_THREADS", "2")
    n = 600                                         # more than two host chunks' worth
    g = two_node(n)
    before = copies(driver)
    g.launch()
    assert g.record.on_device and moved(driver, before) == {"htod": 2, "dtoh": 1, "dtod": 0}
    grads = vkml.diff.reverse(g.record, {"y": backend.to_plane(np.ones(n))})
    assert type(grads["x"]).__name__ == "DeviceArray"
