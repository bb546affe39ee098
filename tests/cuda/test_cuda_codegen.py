"""The CUDA code generator, checked without a GPU.

Programs are collected by running representative functions -- elementwise
chains, reductions (small and split in two stages), broadcasting, indexing,
gather/scatter, matmul, the running-sum scan of the tutorial and the programs derived
from it, cond and while, vmap, a graph kernel with its reverse, an MLP
training step -- on a recording backend (the NumPy backend that keeps every
program it compiles, with the arguments of its first run and its results).

- On every machine with ``nvcc`` (CI included): every kernel the generator
  emits for those programs compiles with ``nvcc --ptx``, without a warning.
- On every machine with a C++ compiler: the same CUDA source, compiled for
  the host with an emulation header (blocks one after another, the threads
  of a block as fibers switching at each ``__syncthreads``), gives
  the NumPy backend's results for every collected program; the tree-sum
  kernel gives ``tree_sum``'s bits; a failing gather reports its index, axis
  and size through the status words, and later kernels do nothing.

This checks the renderer's code and launch plan; it cannot check a GPU's
scheduling, memory model or libdevice's math (``tests/cuda/test_cuda.py`` does,
on a machine with a GPU).
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX, emulate, fake_driver, host_library
from test_programs import running_sum_body
from vkml.backends import base
from vkml.backends.codegen import cuda_render
from vkml.backends.codegen.cuda_render import cuda_plan, module_source, tree_sum_levels
from vkml.backends.codegen.lower import Unsupported
from vkml.backends.numpy_backend import NumpyBackend, compile_program
from vkml.graph.treesum import tree_sum

NVCC = shutil.which("nvcc")
RNG = np.random.default_rng(11)


# -- collecting programs ----------------------------------------------------------------------------

class Recording(NumpyBackend):
    """The NumPy backend, keeping each compiled program with its first arguments and results."""

    name = "cuda-codegen-recording"

    def __init__(self):
        super().__init__()
        self.seen = []

    def _compile(self, program):
        run = super()._compile(program)
        entry = [program, None, None]
        self.seen.append(entry)

        def recorded(args):
            out = run(args)
            if entry[1] is None:
                entry[1] = [np.array(a, copy=True) for a in args]
                entry[2] = [np.array(o, copy=True) for o in out]
            return out
        return recorded


def _elementwise():
    x = RNG.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    y = RNG.uniform(-2.0, 2.0, (3, 4)).astype(np.float32)
    a, b = vkml.tensor(x), vkml.tensor(y)
    outs = [vkml.exp(a) * b + vkml.sin(a) / (vkml.cos(b) + 3.0) - vkml.tanh(b) ** 2,
            vkml.sqrt(a) + vkml.log(a) + vkml.abs(b) + vkml.sign(b) - vkml.maximum(a, b)
            + vkml.minimum(a, b), vkml.where(a > b, a, -b), (a >= b) & (a != b) | ~(a < b),
            vkml.cast(b, "int32") // 2 + vkml.cast(a, "int32") ** 2, vkml.clip(b, -1.0, 1.0)]
    vkml.realize(outs)
    xd = RNG.normal(size=(5,))
    t = vkml.tensor(xd)
    chain = t
    for i in range(40):
        chain = vkml.tanh(chain * 1.01 + 0.1 * i) if i % 2 else chain - vkml.sin(chain)
    chain.numpy()
    ints = vkml.tensor(np.arange(-6, 6, dtype=np.int64))
    (ints // 4 + ints * 3 - vkml.abs(ints) + vkml.sign(ints)).numpy()
    nan = vkml.tensor(np.array([np.nan, 1.0, -np.inf, 0.0, -0.0]))
    vkml.maximum(nan, vkml.tensor(np.array([0.0, np.nan, 1.0, -0.0, 0.0]))).numpy()


def _reductions():
    x = vkml.tensor(RNG.normal(size=(4, 5, 6)))
    vkml.realize([vkml.sum(x, axis=1), vkml.max(x, axis=(0, 2)), vkml.argmax(x, axis=2),
                  vkml.mean(x), vkml.logsumexp(x, axis=-1), vkml.softmax(x, axis=0), vkml.min(x)])
    big = vkml.tensor(RNG.normal(size=(3, 5000)))
    vkml.realize([vkml.sum(big), vkml.max(big, axis=1), vkml.sum(big, axis=0)])
    vkml.sum(vkml.tensor(RNG.normal(size=(9000,)).astype(np.float32))).numpy()


def _broadcasting():
    a = vkml.tensor(RNG.normal(size=(3, 1)))
    b = vkml.tensor(RNG.normal(size=(1, 4)))
    vkml.realize([a + b, a * b - 1.0, vkml.broadcast_to(a, (2, 3, 4)) * b])


def _indexing():
    x = vkml.tensor(RNG.normal(size=(5, 6)))
    idx = vkml.tensor(np.array([4, 0, 2, 2]))
    vkml.realize([x[1:4, ::2], vkml.flip(x, (0,)), x[idx], vkml.take(x, idx, axis=1),
                  vkml.take_along_axis(x, vkml.tensor(RNG.integers(0, 6, (5, 2))), axis=1),
                  vkml.pad(x, (1, 2), (0, 1), (0, 1)), vkml.concatenate([x, x * 2], axis=0),
                  vkml.stack([x, -x], axis=1), vkml.reshape(x, (3, 10)), vkml.transpose(x),
                  x[None, 2], x[..., -1]])
    base_ = vkml.tensor(np.zeros((4, 3)))
    ind = vkml.tensor(np.array([[1], [3], [1], [0]]))
    vkml.scatter_add(base_, ind, vkml.tensor(RNG.normal(size=(4, 3)))).numpy()
    vkml.gather(x, vkml.tensor(np.array([[0, 1], [4, 5], [2, 2]]))).numpy()


def _matmul():
    a = vkml.tensor(RNG.normal(size=(5, 7)), requires_grad=True)
    b = vkml.tensor(RNG.normal(size=(7, 3)), requires_grad=True)
    vkml.sum(vkml.tanh(a @ b)).backward()
    a.grad.numpy()
    batched = vkml.tensor(RNG.normal(size=(2, 17, 19)).astype(np.float32))
    (batched @ vkml.transpose(batched, (0, 2, 1))).numpy()
    ints = vkml.tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    (ints @ vkml.transpose(ints)).numpy()


DERIVED = []


def _scan():
    f = vkml.jit(running_sum_body([0]))
    vkml.grad(f)(np.array([1.0, 2.0, 3.0]))
    vkml.grad(f)(RNG.normal(size=40))
    for derived in f.derived_programs():
        for value in derived.values():
            items = value if isinstance(value, tuple) else (value,)
            DERIVED.extend(p for p in items if isinstance(p, vkml.Program))
    carry, ys = vkml.scan(lambda c, r: (c * 0.9 + vkml.sum(r), vkml.tanh(r) * c),
                          np.float32(1.0), vkml.tensor(RNG.normal(size=(6, 3)).astype(np.float32)),
                          reverse=True)
    vkml.realize([carry, ys])


def _control():
    f = lambda x: vkml.cond(x.sum() > 0, lambda x: (x ** 2).sum(),  # noqa: E731
                            lambda x: vkml.sin(x).sum(), x)
    x = np.array([1.0, -2.0, 3.0])
    vkml.grad(f)(x).numpy()
    vkml.grad(f)(-x).numpy()
    vkml.vmap(vkml.grad(f))(np.stack([x, -x])).numpy()
    body = lambda c: (c[0] * 1.5, c[1] + 1)  # noqa: E731
    test = lambda c: c[1] < 5  # noqa: E731
    vkml.while_loop(test, body, (x, 0))[0].numpy()
    vkml.grad(lambda x: vkml.while_loop(test, body, (x, 0), max_iters=8)[0].sum())(x).numpy()
    ck = vkml.checkpoint(lambda x: vkml.sin(vkml.sin(x) * 2))
    vkml.grad(lambda x: ck(x).sum())(x).numpy()


def _vmap():
    xs = RNG.normal(size=(4, 5))
    f = lambda x: vkml.scan(lambda c, r: (c + r, c * r), np.float64(0.0), x)[1]  # noqa: E731
    vkml.vmap(f, in_axes=1, out_axes=1)(xs).numpy()
    w = RNG.normal(size=(3, 2))
    loss = lambda w, x: vkml.sum(vkml.tanh(x @ w) ** 2)  # noqa: E731
    vkml.vmap(vkml.grad(loss), in_axes=(None, 0))(w, RNG.normal(size=(6, 3))).numpy()


@vkml.kernel
def _poly(x, a: vkml.Param, b: vkml.Param):
    return {"y": (a * x * x + b * x) / (x + 2.0) + vkml.sin(a * x)}


def _graph():
    n = 300
    x = np.linspace(-1, 1, n)
    y = np.zeros(n)
    g = vkml.Graph().add(_poly.bind(x=x, a=0.3, b=-1.7, y=y), name="poly").build(record=True)
    g.launch()
    vkml.diff.reverse(g.record, {"y": np.cos(x)})


def _mlp():
    vkml.nn.manual_seed(0)
    model = vkml.nn.Sequential(vkml.nn.Linear(12, 16), vkml.nn.ReLU(), vkml.nn.Linear(16, 3))
    opt = vkml.optim.Adam(model.parameters(), lr=1e-2)
    xt = vkml.tensor(RNG.normal(size=(8, 12)).astype(np.float32))
    yt = vkml.tensor(RNG.integers(0, 3, 8))
    for _ in range(2):
        opt.zero_grad()
        loss = vkml.nn.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
    loss.numpy()


def _conv():
    x = vkml.tensor(RNG.normal(size=(2, 3, 6, 6)), requires_grad=True)
    w = vkml.tensor(RNG.normal(size=(4, 3, 3, 3)), requires_grad=True)
    vkml.sum(vkml.max_pool2d(vkml.relu(vkml.conv2d(x, w, padding=1)), 2)).backward()
    w.grad.numpy()


SOURCES = [_elementwise, _reductions, _broadcasting, _indexing, _matmul, _scan, _control, _vmap,
           _graph, _mlp, _conv]


@pytest.fixture(scope="module")
def collected():
    """``(label, program, args, results)`` for every program the sources compiled (args and results
    None for derived programs that were never run on their own)."""
    base.register(Recording.name, Recording)
    previous = base.current()
    base._INSTANCES.pop(Recording.name, None)         # a fresh recorder: everything compiles
    vkml.set_backend(Recording.name)
    recorder = base.current()
    DERIVED.clear()
    try:
        for source in SOURCES:
            source()
    finally:
        vkml.set_backend(previous.name)
        base._INSTANCES.pop(Recording.name, None)
    out = []
    for i, (prog, args, results) in enumerate(recorder.seen):
        out.append((f"program{i}", prog, args, results))
    for i, prog in enumerate(DERIVED):
        out.append((f"derived{i}", prog, None, None))
    return out


@pytest.fixture(scope="module")
def plans(collected):
    result = []
    for label, prog, args, results in collected:
        try:
            plan = cuda_plan(prog, prefix=f"p{len(result)}_")
        except Unsupported as e:
            # the only primitive the shared lowering leaves out (the NumPy backend runs it)
            assert "custom_lin" in str(e), (label, str(e))
            continue
        result.append((label, prog, args, results, plan))
    return result


def test_the_collection_is_broad(plans):
    prims = set()

    def walk(p):
        for e in p.eqns:
            prims.add(e.prim.name)
            for v in e.params.values():
                if hasattr(v, "eqns"):
                    walk(v)
                elif isinstance(v, tuple):
                    for b in v:
                        if hasattr(b, "eqns"):
                            walk(b)
    for _, prog, *_ in plans:
        walk(prog)
    want = {"add", "mul", "exp", "sin", "tanh", "reduce_sum", "reduce_max", "argmax", "gather",
            "scatter_add", "matmul", "scan", "cond", "while", "broadcast_in_dim", "transpose",
            "slice", "pad", "concatenate", "reshape", "flip", "where", "cast", "pow"}
    assert want <= prims, want - prims
    kinds = {k.kind for *_, plan in plans for k in plan.kernels}
    assert kinds == {"grid", "block", "matmul", "chunks"}
    assert len(plans) > 60


# -- nvcc --------------------------------------------------------------------------------------------

def _nvcc_ptx(source, workdir, name):
    path = os.path.join(workdir, name + ".cu")
    with open(path, "w") as f:
        f.write(source)
    out = path[:-3] + ".ptx"
    proc = subprocess.run([NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o", out, path],
                          capture_output=True, text=True)
    return proc, out


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_ptx_has_no_fma_where_bits_are_promised_and_no_float_atomics(tmp_path):
    """The programs whose bits equal the CPU's (+, -, *, /, sqrt, float sums in both split
    layouts, the deterministic and the tiled product, a scan's running sum, the device tree sum)
    compile to PTX without a fused multiply-add (``-fmad=false`` holds) and without a
    floating-point atomic (sums never depend on the order threads arrive in)."""
    x = np.ones((300, 70))
    programs = [
        vkml.program(lambda a, b: ((a * b - a) / (b + 1.5)) * vkml.sqrt(a * a + b) - b, x, x),
        vkml.program(lambda a: vkml.sum(a), np.ones(100_000)),
        vkml.program(lambda a: vkml.sum(a, axis=0), np.ones((5000, 3), np.float32)),
        vkml.program(lambda a, b: a @ b, x, x.T),
        vkml.program(lambda a: a.cumsum(axis=1), x),
    ]
    with vkml.deterministic_matmul():
        programs.append(vkml.program(lambda a, b: a @ b, x, x.T))     # the tree over k
    plans = [cuda_plan(p, prefix=f"vk_{i}_") for i, p in enumerate(programs)]
    assert {"chunks", "grid", "matmul"} <= {k.kind for p in plans for k in p.kernels}
    source = module_source(plans, namespaces=True) + "\n" + cuda_render.template("tree_sum.cu")
    proc, out = _nvcc_ptx(source, str(tmp_path), "exact")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = open(out).read()
    assert re.search(r"\badd\.rn\.f64", ptx) and re.search(r"\bmul\.rn\.f64", ptx)  # it is there
    assert not re.search(r"\bfma\.", ptx), re.findall(r".*\bfma\..*", ptx)[:5]
    assert not re.search(r"\b(atom|red)(\.\w+)*\.f(16|32|64)\b", ptx)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_generated_kernel_compiles_with_nvcc(plans, tmp_path):
    """Every kernel of every collected program, in two translation units compiled side by side."""
    groups = [[p[-1] for p in plans[i::2]] for i in range(2)]
    procs = []
    for i, group in enumerate(groups):
        path = tmp_path / f"group{i}.cu"
        path.write_text(module_source(group, namespaces=True))
        out = tmp_path / f"group{i}.ptx"
        procs.append((group, out, subprocess.Popen(
            [NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o", str(out), str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for group, out, proc in procs:
        log, _ = proc.communicate()
        assert proc.returncode == 0, log[-4000:]
        assert log.strip() == "", log[-4000:]          # PyCUDA warns on any compiler output
        ptx = out.read_text()
        for plan in group:
            for k in plan.kernels:
                assert f".entry {k.name}(" in ptx, k.name


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_single_program_module_and_the_tree_sum_kernel_compile(plans, tmp_path):
    plan = next(p[-1] for p in plans if any(k.kind == "matmul" for k in p[-1].kernels))
    for name, source in [("one", plan.source), ("tree_sum", cuda_render.template("tree_sum.cu"))]:
        proc, out = _nvcc_ptx(source, str(tmp_path), name)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stderr[-3000:]
    assert ".entry vk_tree_sum_double(" in open(out).read()


# -- the structure of what is generated ------------------------------------------------------------

def test_a_fused_chain_is_one_grid_kernel():
    def f(x):
        for i in range(6):
            x = vkml.tanh(x * 1.5 + 0.25) * 0.5 - 0.125
        return x
    plan = cuda_plan(vkml.program(f, np.ones((64, 64), np.float32)))
    assert [k.kind for k in plan.kernels] == ["grid"]
    assert plan.kernels[0].total == 64 * 64
    assert plan.kernels[0].launch() == ((16, 1, 1), (256, 1, 1))
    assert [b[0] for b in plan.buffers] == ["a0", "o0"]       # nothing stored in between


def test_a_scan_is_one_block_kernel_with_its_carry_inside():
    prog = vkml.program(running_sum_body([0]), np.arange(1000.0))
    plan = cuda_plan(prog)
    kernels = plan.body.split('extern "C" __global__ void ')[1:]
    looping = [(k, text) for k, text in zip(plan.kernels, kernels) if "row" in text]
    assert len(looping) == 1
    spec, text = looping[0]
    assert spec.kind == "block" and spec.threads == cuda_render.COOP_THREADS
    assert "__syncthreads()" in text and "__shared__ double" in text
    # the scalar carry is not a device buffer: it lives in the kernel's shared memory
    assert len(plan.buffers) == len(prog.inputs) + len(prog.outputs) + 3


def _per_sample_scans():
    """vmapped scans: batched and unbatched consts and xs, reversed, nested, and a gradient."""
    B, L = 37, 9
    x0, xs, w = RNG.normal(size=B), RNG.normal(size=(L, B)), RNG.normal(size=(B, 3))
    table = RNG.normal(size=(L,))

    def exact(c0, rows, wk):                      # + - * / only: every backend's bits
        step = lambda c, r: ((c * 0.5 + r * wk[0]) / (1.0 + c * c), c - r * wk[1] + wk[2])  # noqa: E731
        return vkml.scan(step, c0, rows)

    def mixed(c0, wk):                            # unbatched xs, transcendental, reversed
        step = lambda c, r: (c + vkml.sin(c * wk[0] + r), vkml.exp(-c * c) * r)  # noqa: E731
        return vkml.scan(step, c0, table, reverse=True)

    def nested(c0, rows):                         # a scan inside the step: sequential per thread
        def step(c, r):
            inner, _ = vkml.scan(lambda a, q: (a * 0.5 + q, a), c, vkml.stack([r, r * 2.0]))
            return inner, inner * c
        return vkml.scan(step, c0, rows)

    def loss(c0, rows, wk):
        c, ys = exact(c0, rows, wk)
        return vkml.sum(ys * ys) + c * c

    return [("exact", vkml.vmap(exact, in_axes=(0, 1, 0), out_axes=(0, 1)), (x0, xs, w), True),
            ("mixed", vkml.vmap(mixed, in_axes=(0, 0), out_axes=(0, 1)), (x0, w), False),
            ("nested", vkml.vmap(nested, in_axes=(0, 1), out_axes=(0, 1)), (x0, xs), True),
            ("gradient", vkml.vmap(vkml.grad(loss, argnums=(0, 2)), in_axes=(0, 1, 0)),
             (x0, xs, w), False)]


@pytest.mark.parametrize("case", range(4), ids=["exact", "mixed", "nested", "gradient"])
def test_a_vmapped_scan_runs_one_thread_per_sample(case, tmp_path):
    """A top-level scan whose step is vmapped (its samples never interact) is one grid kernel with
    a thread per sample looping over the rows -- no block kernel, no barrier -- and gives the NumPy
    backend's results (bit for bit where the step is + - * / only)."""
    name, fn, args, bitwise = _per_sample_scans()[case]
    prog = vkml.program(fn, *args)
    plan = cuda_plan(prog)
    looping = [t for t in plan.body.split('extern "C" __global__ void ')[1:] if "row" in t]
    assert looping and all("sample" in t and "__syncthreads" not in t for t in looping), name
    assert "block" not in {k.kind for k in plan.kernels}
    if NVCC is not None:
        proc, _ = _nvcc_ptx(plan.source, str(tmp_path), name)
        assert proc.returncode == 0, proc.stderr[-3000:]
    if CXX is None:
        return
    lib = host_library(plan.source, str(tmp_path), name)
    want = compile_program(prog)([np.asarray(a) for a in args])
    outs, status = emulate(lib, plan, [np.asarray(a) for a in args],
                           [(v.shape, v.dtype) for v in prog.outputs])
    assert status[0] == 0
    for o, w in zip(outs, want):
        if bitwise:
            assert o.tobytes() == np.asarray(w).tobytes(), name
        else:
            np.testing.assert_allclose(o, w, rtol=1e-12, atol=1e-14, err_msg=name)


def test_a_large_sum_runs_in_two_parallel_stages_over_every_multiprocessor():
    """A contiguous sum's first stage is the block-cooperative kernel (a thread per pair of
    neighbouring elements) with enough blocks for every multiprocessor of an H100 (132); a sum
    over a leading axis is a thread per (chunk, output) with the outputs innermost."""
    plan = cuda_plan(vkml.program(lambda x: vkml.sum(x), np.ones(1_000_000)))
    assert [k.kind for k in plan.kernels] == ["chunks", "block"]      # a scalar: one thread
    (blocks, _, _), (threads, _, _) = plan.kernels[0].launch(sm_count=132)
    assert blocks >= 132 and threads == cuda_render.CHUNK_THREADS
    assert "vk_tree_chunks<double>" in plan.body
    down = cuda_plan(vkml.program(lambda x: vkml.sum(x, axis=0),
                                  np.empty((1 << 22, 4), np.float32)))
    first = down.kernels[0]
    assert first.kind == "grid" and first.total == cuda_render.SPLIT_THREADS
    small = cuda_plan(vkml.program(lambda x: vkml.sum(x, axis=1), np.ones((5000, 8))))
    assert [k.kind for k in small.kernels] == ["grid"] and small.kernels[0].total == 5000


@pytest.mark.parametrize("shape, axis", [((70_001,), None), ((3, 50_000), 1), ((1 << 15, 3), 0),
                                         ((5, 3, 4096), (0, 2)), ((2, 4097), None)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_emulated_split_sums_have_the_canonical_trees_bits(shape, axis, dtype, tmp_path):
    """Both first stages (the block-cooperative one, and a thread per chunk) under the emulator
    (garbage shared memory, the block's threads as fibers): NumPy backend's bits, with
    values spread over twelve decades, signed zeros and an infinity."""
    x = (RNG.normal(size=shape) * 10.0 ** RNG.integers(-6, 6, shape)).astype(dtype)
    x.reshape(-1)[::997] = -0.0
    x.reshape(-1)[5] = np.inf
    fn = (lambda a: vkml.sum(a)) if axis is None else (lambda a: vkml.sum(a, axis=axis))
    prog = vkml.program(fn, x)
    plan = cuda_plan(prog)
    lib = host_library(cuda_render.module_source([plan]), str(tmp_path), "split")
    got, status = emulate(lib, plan, [x], [(v.shape, v.dtype) for v in prog.outputs])
    want = fn(vkml.tensor(x)).numpy()
    assert not status[0] and got[0].tobytes() == np.asarray(want).tobytes()


def test_matmul_is_tiled_and_offered_to_cublas():
    plan = cuda_plan(vkml.program(lambda a, b: a @ b, np.ones((3, 40, 30), np.float32),
                                  np.ones((3, 30, 20), np.float32)))
    (k,) = plan.kernels
    assert k.kind == "matmul" and k.gemm is not None
    a, b, c, batch, m, n, kk, dtype = k.gemm
    assert (a, b, c, batch, m, n, kk) == (0, 1, 2, 3, 40, 20, 30) and dtype == np.float32
    assert k.launch() == ((2, 3, 3), (16, 16, 1))


def test_every_kernel_has_the_same_two_arguments(plans):
    for *_, plan in plans:
        for k in plan.kernels:
            assert (f'extern "C" __global__ void {k.name}(void* const* vk_bufs, '
                    "unsigned long long* vk_status) {") in plan.body


def test_tree_sum_levels():
    assert tree_sum_levels(1) == [(1, 1, 1)]
    assert tree_sum_levels(3) == [(3, 1, 4)]
    assert tree_sum_levels(1024) == [(1024, 1, 1024)]
    assert tree_sum_levels(1025) == [(1025, 2, 1024), (2, 1, 2)]
    assert tree_sum_levels(3_000_000) == [(3_000_000, 4096, 1024), (4096, 4, 1024), (4, 1, 4)]


# -- the emulator ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emulated(plans, tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    work = str(tmp_path_factory.mktemp("emulate"))
    return host_library(module_source([p[-1] for p in plans], namespaces=True), work, "all")


def _args_for(prog):
    args = []
    for v in prog.inputs:
        if v.dtype.kind == "f":
            args.append(RNG.normal(size=v.shape).astype(v.dtype))
        elif v.dtype.kind == "b":
            args.append(RNG.integers(0, 2, v.shape).astype(bool))
        else:
            args.append(np.zeros(v.shape, v.dtype))
    return args


def test_emulated_kernels_give_the_numpy_backends_results(plans, emulated):
    checked = 0
    for label, prog, args, results, plan in plans:
        if args is None:
            args = _args_for(prog)
            results = compile_program(prog)(args)
        avals = [(v.shape, v.dtype) for v in prog.outputs]
        outs, status = emulate(emulated, plan, [np.asarray(a) for a in args], avals)
        assert status[0] == 0, (label, status)
        for o, r, v in zip(outs, results, prog.outputs):
            r = np.asarray(r)
            assert o.shape == r.shape, label
            if v.dtype.kind == "f":
                tol = 1e-4 if v.dtype == np.float32 else 1e-10
                np.testing.assert_allclose(o, r, rtol=tol, atol=tol, err_msg=f"{label}\n{prog}")
            else:
                np.testing.assert_array_equal(o, r, err_msg=f"{label}\n{prog}")
        checked += 1
    assert checked == len(plans)


def test_emulated_exact_operations_have_numpys_bits(tmp_path):
    if CXX is None:
        pytest.skip("no C++ compiler")
    a = RNG.uniform(0.1, 10, (50, 7))
    b = RNG.uniform(0.1, 10, (50, 7))
    fn = lambda x, y: ((x * y - x) / (y + 1.5)) * vkml.sqrt(x * x + y) - y  # noqa: E731
    prog = vkml.program(fn, a, b)
    plan = cuda_plan(prog)
    lib = host_library(plan.source, str(tmp_path), "exact")
    (out,), status = emulate(lib, plan, [a, b], [((50, 7), np.float64)])
    np.testing.assert_array_equal(out, ((a * b - a) / (b + 1.5)) * np.sqrt(a * a + b) - b)


def test_emulated_gather_out_of_range_reports_index_axis_and_size(tmp_path):
    if CXX is None:
        pytest.skip("no C++ compiler")
    x = np.arange(12.0).reshape(4, 3)
    prog = vkml.program(lambda x, i: vkml.exp(vkml.take(x, i, axis=0)) * 2.0, x,
                        np.array([0, 1, 7, 2]))
    plan = cuda_plan(prog)
    lib = host_library(plan.source, str(tmp_path), "gather")
    _, status = emulate(lib, plan, [x, np.array([0, 1, 7, 2])], [((4, 3), np.float64)])
    code, bad, axis, size = (int(np.int64(s)) for s in status.view(np.int64))
    assert plan.errors[code - 1] == "gather" and (bad, axis, size) == (7, 0, 4)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 1024, 1025, 5000])
def test_emulated_tree_sum_has_tree_sums_bits(n, tmp_path):
    if CXX is None:
        pytest.skip("no C++ compiler")
    lib = host_library(cuda_render.template("tree_sum.cu"), str(tmp_path), "tree")
    for dtype, name in ((np.float64, "vk_tree_sum_double"), (np.float32, "vk_tree_sum_float")):
        x = (RNG.normal(size=(n, 3)) * 10.0 ** RNG.integers(-8, 8, (n, 3))).astype(dtype)
        x[0, 1] = -0.0
        if n == 1:
            x[0, 2] = -0.0
        cur = x
        for valid, chunks, chunk in tree_sum_levels(n):
            out = np.empty((chunks, 3), dtype)
            lib.vk_launch_tree(ctypes.cast(getattr(lib, name), ctypes.c_void_p),
                               cur.ctypes.data_as(ctypes.c_void_p),
                               out.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(valid),
                               ctypes.c_longlong(3), ctypes.c_longlong(chunks), chunk,
                               min(chunks * 3, 5), max(1, chunk // 2))
            cur = out
        want = tree_sum(x)
        assert cur[0].tobytes() == want.tobytes(), (n, dtype, cur[0], want)


# -- the backend on an emulated driver -----------------------------------------------------------------

def _fifty_ops(t, w):
    y = t
    for i in range(50):
        y = [lambda u: u * 1.01 + 0.5, vkml.tanh, lambda u: u @ w * 0.05,
             lambda u: u - vkml.mean(u, axis=1, keepdims=True), vkml.exp][i % 5](y)
    return y


def test_the_backend_on_an_emulated_driver():
    """``cuda.py`` itself -- buffers, staging, one captured graph per executable, replay, the status
    words, the disk cache, kernel-by-kernel runs, the tree sum -- on the emulated driver."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    w = RNG.normal(size=(8, 8)).astype(np.float32)
    xs = [RNG.normal(size=(8, 8)).astype(np.float32) for _ in range(2)]
    want = [_fifty_ops(vkml.tensor(x), vkml.tensor(w)).numpy() for x in xs]
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            assert "Emulated GPU" in vkml.backend_info()["cuda"]
            vkml.reset_stats()
            got = _fifty_ops(vkml.tensor(xs[0]), vkml.tensor(w)).numpy()
            s = vkml.stats()
            # the first run goes launch by launch (checked), then its graph is captured
            assert (s.submissions, s.graph_launches, s.compiles, backend.captures) == (1, 0, 1, 1)
            np.testing.assert_allclose(got, want[0], rtol=2e-5, atol=2e-5)
            vkml.reset_stats()               # the same structure again: nothing compiled or captured
            again = _fifty_ops(vkml.tensor(xs[1]), vkml.tensor(w)).numpy()
            s = vkml.stats()
            assert (s.submissions, s.graph_launches, s.compiles, backend.captures) == (1, 1, 0, 1)
            np.testing.assert_allclose(again, want[1], rtol=2e-5, atol=2e-5)
            backend.use_graphs = False       # kernel by kernel: the same bits
            assert _fifty_ops(vkml.tensor(xs[1]), vkml.tensor(w)).numpy().tobytes() == again.tobytes()
            assert backend.kernel_launches > 1
            backend.use_graphs = True
            x = vkml.tensor(np.arange(12.0).reshape(4, 3))
            with pytest.raises(vkml.ExecutionError, match="index 7 is out of range for axis 0 of "
                                                          "size 4"):
                vkml.take(x, vkml.tensor(np.array([0, 7])), axis=0).numpy()
            assert vkml.take(x, vkml.tensor(np.array([3, 1])), axis=0).numpy()[0, 2] == 11.0
            backend.clear_cache()            # a new process: kernels come from the disk cache
            backend.gpu.modules.clear()
            vkml.reset_stats()
            assert _fifty_ops(vkml.tensor(xs[1]), vkml.tensor(w)).numpy().tobytes() == again.tobytes()
            assert vkml.stats().compiles == 0 and vkml.stats().cache_hits >= 1
            v = RNG.normal(size=(1025, 2))
            assert backend.tree_sum(v).tobytes() == tree_sum(v).tobytes()
            assert driver.compiles >= 2 and not driver.capturing
        finally:
            vkml.set_backend("numpy")


def test_values_stay_on_the_emulated_gpu_between_submissions():
    """Realized tensors hold DeviceArrays; a submission reading them points the kernels' table at
    them (no copy); only NumPy arguments and tensor.numpy() cross to or from the host; a training
    loop's steady state allocates nothing; other backends take the values through the host."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    from vkml.backends.cuda import DeviceArray
    x0 = RNG.normal(size=(6, 5))
    want = np.tanh(x0 * 2.0) ** 2
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            y = vkml.tanh(vkml.tensor(x0) * 2.0)
            y.realize()
            assert isinstance(y.ir_var.value, DeviceArray) and y.ir_var.value.shape == (6, 5)
            before = dict(driver.copies)
            z = (y * y).realize()
            moved = {k: driver.copies[k] - before[k] for k in before}
            # the pointer table and the (here unused) block of small inputs in, the status words
            # out: the values themselves stayed put
            assert moved == {"htod": 2, "dtoh": 1, "dtod": 0}
            # twenty Python scalars and a small array from the host: still those two copies in
            before = dict(driver.copies)
            w = y
            for k in range(20):
                w = w * (1.0 + k / 100.0) + np.float64(k)
            w = (w + vkml.tensor(np.ones(5))).realize()
            moved = {k: driver.copies[k] - before[k] for k in before}
            assert moved == {"htod": 2, "dtoh": 1, "dtod": 0}
            scale = np.prod([1.0 + k / 100.0 for k in range(20)])
            np.testing.assert_allclose(w.numpy()[0, 0], y.numpy()[0, 0] * scale + sum(
                k * np.prod([1.0 + j / 100.0 for j in range(k + 1, 20)]) for k in range(20)) + 1.0,
                rtol=1e-12)
            assert isinstance(z.ir_var.value, DeviceArray)
            np.testing.assert_allclose(z.numpy(), want, rtol=1e-13)
            copies = driver.copies["dtoh"]
            z.numpy(), repr(z)
            assert driver.copies["dtoh"] == copies          # copied to the host once
            with pytest.raises(ValueError):
                z.numpy()[0, 0] = 5.0                        # the host copy is read-only
            import copy
            import pickle
            for clone in (copy.deepcopy(z), pickle.loads(pickle.dumps(z.ir_var.value))):
                np.testing.assert_array_equal(np.asarray(clone), z.numpy())

            # a product large enough for (the emulated) cuBLAS: the buffers its captured call
            # holds keep their addresses, so device arguments and results are copied in and out
            a = (vkml.tensor(RNG.normal(size=(64, 64))) * 1.0).realize()
            b = (vkml.tensor(RNG.normal(size=(64, 64))) * 1.0).realize()
            outs = []
            for _ in range(2):                       # launch by launch, then the graph's replay
                before = dict(driver.copies)
                c = vkml.matmul(a, b).realize()
                assert isinstance(c.ir_var.value, DeviceArray)
                assert driver.copies["dtod"] - before["dtod"] == 3        # a, b in; c out
                outs.append(c.numpy())
            np.testing.assert_allclose(outs[0], a.numpy() @ b.numpy(), rtol=1e-12, atol=1e-12)
            assert outs[0].tobytes() == outs[1].tobytes()
            assert sum(name == "cublas gemm" for name, *_ in driver.launches) == 2

            # a training loop: parameters and gradients stay on the device, steady state allocates
            vkml.nn.manual_seed(0)
            model = vkml.nn.Sequential(vkml.nn.Linear(5, 8), vkml.nn.ReLU(), vkml.nn.Linear(8, 1))
            opt = vkml.optim.SGD(model.parameters(), lr=0.1)
            xt, yt = vkml.tensor(x0), vkml.tensor(want[:, :1])

            def step():
                opt.zero_grad()
                loss = vkml.nn.mse(model(xt), yt)
                loss.backward()
                opt.step()
                return float(loss)

            losses = [step() for _ in range(3)]
            gc.collect()                # values dropped in Var/Eqn cycles go back to the pool
            allocations = driver.allocations
            vkml.reset_stats()
            losses.append(step())
            assert driver.allocations == allocations and vkml.stats().compiles == 0
            assert losses[-1] < losses[0]
            assert all(isinstance(p.ir_var.value, DeviceArray) for p in model.parameters())
            assert all(isinstance(p.grad.ir_var.value, DeviceArray) for p in model.parameters())

            assert backend.gpu.pool.spare_bytes > 0
            released = backend.empty_cache()
            assert released > 0 and backend.gpu.pool.spare_bytes == 0

            # another backend receives the values through the host, as arguments and as constants
            vkml.set_backend("numpy")
            np.testing.assert_allclose((z * 2.0).numpy(), want * 2.0, rtol=1e-13)
            captured = vkml.jit(lambda t: t * vkml.cast(vkml.transpose(z), "float32"))
            np.testing.assert_allclose(captured(np.ones((5, 6), np.float32)).numpy(), want.T,
                                       rtol=1e-6)
        finally:
            vkml.set_backend("numpy")


def test_a_gpu_backends_default_memory_budget_is_half_its_free_memory(monkeypatch):
    from vkml.graph.simulation import available_memory
    with fake_driver():
        backend = vkml.set_backend("cuda")
        try:
            monkeypatch.setattr(backend.gpu.drv, "mem_get_info", lambda: (3 << 20, 1 << 34))
            assert available_memory() == 3 << 19
        finally:
            vkml.set_backend("numpy")
    assert available_memory() > 3 << 19      # the host's half again


def _add_one_program():
    return vkml.program(lambda t: t + 1.0, np.zeros((64, 16)))


def test_the_gpu_tests_pass_on_the_emulated_driver():
    """The ``cuda``-marked GPU tests (test_cuda.py, test_cuda_loops.py) run against the emulated
    driver in a fresh pytest process, so every line of the cuda backend they reach runs in CI (the
    two largest tree sums are left out: minutes on emulated threads; smaller ones run)."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))       # tests/
    env = dict(os.environ, VKML_EMULATED_CUDA="1",
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    big = [f"--deselect=tests/cuda/test_cuda.py::test_tree_sums_are_bitwise_equal_to_the_cpus[{n}]"
           for n in (70000, 1000000)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "cuda_emulation", "-p", "no:cacheprovider", "-o",
         "addopts=", "-q", "-m", "cuda", "tests/cuda/test_cuda.py", "tests/cuda/test_cuda_loops.py", *big],
        cwd=os.path.dirname(here), env=env, capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 100 and "skipped" not in proc.stdout.splitlines()[-1], tail


def test_the_gpu_benchmark_script_runs_on_the_emulated_driver(tmp_path):
    """bench/gpu.py --smoke end to end on the emulated driver: every section runs and reports (the
    numbers mean nothing here; the script is what a GPU session runs, so it must not break)."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))       # tests/
    root = os.path.dirname(here)
    out = tmp_path / "gpu.json"
    code = ("import runpy, sys\n"
            "from cuda_emulation import fake_driver\n"
            f"sys.argv = ['bench/gpu.py', '--smoke', '--json', {str(out)!r}]\n"
            "with fake_driver():\n"
            "    try:\n"
            "        runpy.run_path('bench/gpu.py', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        sys.exit(e.code)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.join(root, "kit"),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json
    results = json.loads(out.read_text())
    assert set(results) == {"realize", "mlp", "simulation", "bandwidth"}
    assert not any("error" in v for v in results.values())
    assert results["mlp"]["submissions per step"]["vkml cuda compile_step"] == "1"
    assert "2 loop kernels" in results["simulation"]["work"]["cuda"]


# -- the backend without a GPU ---------------------------------------------------------------------

def _gpu_present():
    try:
        import pycuda.driver as drv
        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False


def test_selecting_cuda_without_a_gpu_is_a_clear_error():
    if _gpu_present():
        pytest.skip("this machine has a GPU: tests/cuda/test_cuda.py runs instead")
    with pytest.raises(vkml.BackendError, match="cuda backend"):
        vkml.set_backend("cuda")
    info = vkml.backend_info()
    assert info["backend"] == "numpy" and "cuda" not in info["available"]   # it cannot run here
    assert "no GPU" in info["cuda"] or "pycuda" in info["cuda"].lower()


def test_importing_vkml_imports_no_pycuda():
    code = "import sys, vkml; vkml.backend_info(); print(any(m.startswith('pycuda') for m in sys.modules))"
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_reshape_of_an_empty_array_divides_no_index_by_zero():
    """Reshaping an empty array reads no element: its index expressions name no axis extent of
    0 (``i / 0``, which nvcc warns about and the fuzz counts as a defect)."""
    def f(y, t):
        return vkml.reshape(vkml.broadcast_to(y * 2, (2, 3, 0)), (0, 6)), t > 0
    for lowering_of in (lambda p: module_source([cuda_plan(p)]),
                        lambda p: vkml.backends.cpu.c_source(p)[0]):
        source = lowering_of(vkml.program(f, np.ones((2, 1, 1), np.int64), np.ones(4)))
        assert "o0[" in source and not re.search(r"/ 0\)|% 0\b", source)
