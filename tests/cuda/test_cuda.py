"""The CUDA backend on a GPU: results against the NumPy backend, bitwise tree sums, graph launches.

Marked ``cuda`` and skipped cleanly on a machine without PyCUDA or without a
GPU (``scripts/device-check`` runs them where there is one).  What runs
without a GPU -- the generated code compiling with nvcc, its emulated
results, the error when no GPU is there -- is in ``test_cuda_codegen.py``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import vkml
from vkml.graph.treesum import tree_sum

pytestmark = pytest.mark.cuda

drv = pytest.importorskip("pycuda.driver", exc_type=ImportError)


def _gpus() -> int:
    try:
        drv.init()
        return drv.Device.count()
    except Exception:
        return 0


if _gpus() == 0:
    pytest.skip("no GPU on this machine", allow_module_level=True)

from vkml.backends.cuda import DeviceArray  # noqa: E402

RNG = np.random.default_rng(5)


@pytest.fixture
def cuda(vk_backend):
    """The cuda backend for the test (after conftest's reset to NumPy and zeroed counters)."""
    backend = vkml.set_backend("cuda")
    vkml.reset_stats()
    yield backend
    backend.use_graphs = True
    vkml.set_backend("numpy")


def on_both(fn, *arrays):
    """``fn`` of tensors made from ``arrays``, on the NumPy backend and on the cuda backend."""
    out = []
    for name in ("numpy", "cuda"):
        vkml.set_backend(name)
        res = fn(*[vkml.tensor(a) for a in arrays])
        res = res if isinstance(res, (list, tuple)) else [res]
        out.append([np.asarray(r.numpy()) for r in res])
    vkml.set_backend("cuda")
    return out


def assert_close(got, want, dtype):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if np.dtype(dtype).kind == "f":
            tol = 2e-5 if np.dtype(dtype) == np.float32 else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(g, w)


UNARY = {
    "neg": lambda x: -x, "exp": vkml.exp, "log": lambda x: vkml.log(vkml.abs(x) + 0.5),
    "sin": vkml.sin, "cos": vkml.cos, "tanh": vkml.tanh, "sqrt": lambda x: vkml.sqrt(vkml.abs(x)),
    "abs": vkml.abs, "sign": vkml.sign, "relu": vkml.relu, "sigmoid": vkml.sigmoid,
    "square": vkml.square, "sum": vkml.sum, "sum_axis": lambda x: vkml.sum(x, axis=0),
    "max": lambda x: vkml.max(x, axis=1), "min": vkml.min, "mean": lambda x: vkml.mean(x, axis=1),
    "argmax": lambda x: vkml.argmax(x, axis=1), "logsumexp": vkml.logsumexp,
    "softmax": vkml.softmax, "transpose": vkml.transpose, "flip": lambda x: vkml.flip(x, (1,)),
    "slice": lambda x: x[1:, ::2], "reshape": lambda x: vkml.reshape(x, (-1,)),
    "pad": lambda x: vkml.pad(x, (1, 0), (0, 2)), "concat": lambda x: vkml.concatenate([x, x], 1),
    "broadcast": lambda x: vkml.broadcast_to(x[:, :1], (x.shape[0], 5)) * x[:1, :1],
    "cast": lambda x: vkml.cast(x * 3, "int32"), "clip": lambda x: vkml.clip(x, -0.5, 0.5),
    "big_sum": lambda x: vkml.sum(vkml.broadcast_to(x[:1], (4000,) + x.shape[1:])),
}

BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (vkml.abs(b) + 0.5), "pow": lambda a, b: vkml.abs(a) ** b,
    "maximum": vkml.maximum, "minimum": vkml.minimum, "where": lambda a, b: vkml.where(a > b, a, b),
    "compare": lambda a, b: (a >= b) & (a != b) | ~(a < b),
    "matmul": lambda a, b: a @ vkml.transpose(b),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_operators_match_numpy(op, dtype, cuda):
    x = RNG.normal(size=(6, 7)).astype(dtype)
    want, got = on_both(UNARY[op], x)
    assert_close(got, want, got[0].dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_operators_match_numpy(op, dtype, cuda):
    a = RNG.normal(size=(6, 7)).astype(dtype)
    b = RNG.normal(size=(6, 7)).astype(dtype)
    want, got = on_both(BINARY[op], a, b)
    assert_close(got, want, got[0].dtype)


def test_integer_operators_are_exact(cuda):
    a = np.arange(-12, 12, dtype=np.int64).reshape(4, 6)
    b = np.array([3, -2, 5, 1, -7, 4] * 4, dtype=np.int64).reshape(4, 6)
    want, got = on_both(lambda a, b: [a // b, a * b - a, vkml.abs(a) ** 2, a @ vkml.transpose(b),
                                      vkml.sum(a, axis=1)], a, b)
    assert_close(got, want, np.int64)


def test_indexing_gather_and_scatter(cuda):
    x = RNG.normal(size=(5, 6))
    idx = np.array([4, 0, 2, 2])
    want, got = on_both(lambda x, i: [x[i], vkml.take(x, i, axis=1),
                                      vkml.scatter_add(x * 0.0, i[:, None], x[:4])],
                        x, idx)
    assert_close(got, want, np.float64)


def test_a_gather_out_of_range_names_index_axis_and_size(cuda):
    x = vkml.tensor(np.arange(12.0).reshape(4, 3))
    with pytest.raises(vkml.ExecutionError, match="index 7 is out of range for axis 0 of size 4"):
        vkml.take(x, vkml.tensor(np.array([0, 7])), axis=0).numpy()
    assert vkml.take(x, vkml.tensor(np.array([3, 0])), axis=0).numpy()[0, 0] == 9.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients_match_numpy(dtype, cuda):
    x = RNG.normal(size=(5, 4)).astype(dtype)
    w = RNG.normal(size=(4, 3)).astype(dtype)

    def grads(x, w):
        x.requires_grad_()
        w.requires_grad_()
        loss = vkml.sum(vkml.tanh(x @ w) ** 2 + vkml.softmax(x @ w, axis=1))
        loss.backward()
        return [loss, x.grad, w.grad]
    want, got = on_both(grads, x, w)
    assert_close(got, want, dtype)


def test_the_seeds_scan_gradient(cuda):
    def body(xs):
        _, sums = vkml.scan(lambda acc, row: (acc + row, acc + row), np.float64(0.0), xs)
        return vkml.sum(sums * sums)
    f = vkml.jit(body)
    assert vkml.grad(f)(np.array([1.0, 2.0, 3.0])).numpy().tolist() == [20, 18, 12]
    x = RNG.normal(size=500)
    want = np.cumsum(np.cumsum(x)[::-1])[::-1] * 2
    np.testing.assert_allclose(vkml.grad(f)(x).numpy(), want, rtol=1e-10)


def test_a_vmapped_scan_runs_one_thread_per_sample(cuda):
    """4096 samples, each its own 500-row scan (+ - * / only): one grid kernel, the NumPy bits."""
    B, L = 4096, 500
    x0 = RNG.normal(size=B)
    xs = RNG.normal(size=(L, B)) * 0.1

    def run(c0, rows):
        return vkml.scan(lambda c, r: ((c * 0.5 + r) / (1.0 + c * c), c * r - 0.25), c0, rows)

    f = vkml.vmap(run, in_axes=(0, 1), out_axes=(0, 1))
    (c_np, y_np), (c_gpu, y_gpu) = on_both(lambda a, b: list(f(a, b)), x0, xs)
    assert c_gpu.tobytes() == c_np.tobytes() and y_gpu.tobytes() == y_np.tobytes()


def test_cond_and_while(cuda):
    f = lambda x: vkml.cond(x.sum() > 0, lambda x: (x ** 2).sum(),  # noqa: E731
                            lambda x: vkml.sin(x).sum(), x)
    x = np.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(vkml.grad(f)(x).numpy(), 2 * x)
    np.testing.assert_allclose(vkml.grad(f)(-x).numpy(), np.cos(-x))
    out = vkml.while_loop(lambda c: c[1] < 5, lambda c: (c[0] * 1.5, c[1] + 1), (x, 0))
    np.testing.assert_allclose(out[0].numpy(), x * 1.5 ** 5)


def test_a_large_matmul_matches_numpy(cuda):
    a = RNG.normal(size=(300, 200)).astype(np.float32)
    b = RNG.normal(size=(200, 100)).astype(np.float32)
    got = (vkml.tensor(a) @ vkml.tensor(b)).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


# -- bits ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 1000, 1025, 70_000, 1_000_000])
def test_tree_sums_are_bitwise_equal_to_the_cpus(n, cuda):
    for dtype in (np.float32, np.float64):
        x = (RNG.normal(size=(n, 3)) * 10.0 ** RNG.integers(-6, 6, (n, 3))).astype(dtype)
        assert cuda.tree_sum(x).tobytes() == tree_sum(x).tobytes()


def test_exact_operations_and_graph_gradients_have_the_cpus_bits(cuda):
    """+, -, *, / compiled without FMA: a graph's per-sample and Param (canonical-tree) gradients
    are bitwise equal on the NumPy and cuda backends."""
    @vkml.kernel
    def poly(x, a: vkml.Param, b: vkml.Param):
        return {"y": (a * x * x + b * x) / (x + 2.0)}

    results, launches = [], []
    for name in ("numpy", "cuda"):
        vkml.set_backend(name)
        n = 3000
        x = np.linspace(-1, 1, n)
        y = np.zeros(n)
        for rounds in range(2):      # on the GPU the first round runs launch by launch, checked
            before = vkml.stats().graph_launches
            g = vkml.Graph().add(poly.bind(x=x, a=0.3, b=-1.7, y=y), name="poly").build(record=True)
            g.launch()
            grads = vkml.diff.reverse(g.record, {"y": np.cos(x)})
        # on the cuda backend the planes and gradients live on the GPU: read them explicitly
        results.append([np.asarray(v) for v in (g.planes["y"], grads["x"], grads["a"], grads["b"])])
        launches.append(vkml.stats().graph_launches - before)
    # each side ran on its own backend (not on executables cached by the other one); on the GPU
    # the launch and the reverse are one CUDA-graph replay each
    assert launches[0] == 0 and launches[1] == 2
    for r, c in zip(*results):
        np.testing.assert_array_equal(r, c)


def test_a_recorded_simulation_and_its_reverse_run_on_the_gpu(cuda):
    dt = 0.01

    @vkml.kernel
    def pendulum(theta, omega, t, length: vkml.Param, t_end: vkml.Param):
        om = omega + dt * (-(9.81 / length) * vkml.sin(theta) - 0.3 * omega)
        th = theta + dt * om
        tn = t + dt
        return {"theta": th, "omega": om, "t": tn, "terminated": tn >= t_end}

    grads, launches, submissions = {}, {}, {}
    for name in ("numpy", "cuda"):
        vkml.set_backend(name)
        n, steps = 5000, 40
        theta, omega, t = np.linspace(0.1, 1.0, n), np.linspace(-0.5, 0.5, n), np.zeros(n)
        before, loops = vkml.stats(), cuda.loop_launches
        sim = vkml.simulation(pendulum, max_steps=steps, record=True, theta=theta, omega=omega,
                              t=t, length=1.2, t_end=(steps - 0.5) * dt)
        sim.run()
        g = vkml.diff.Reverse(sim)(sim.record, {"theta": np.ones(n), "omega": np.full(n, 0.5)})
        grads[name] = {k: np.asarray(g[k]) for k in ("theta", "omega", "length")}
        launches[name] = cuda.loop_launches - loops
        submissions[name] = (vkml.stats() - before).submissions
    # on the GPU: the forward and the reverse are one per-sample loop kernel each (one thread per
    # sample through every step), where the NumPy backend submits once per step
    assert launches == {"numpy": 0, "cuda": 2}
    assert submissions["cuda"] == 2 and submissions["numpy"] >= steps
    for k in grads["numpy"]:
        np.testing.assert_allclose(grads["cuda"][k], grads["numpy"][k], rtol=1e-9, atol=1e-12)


class _HostCopies:
    """Counts the copies between host and device the backend issues from the host (through
    PyCUDA's driver module), by size: copies a captured CUDA graph replays are not issued from
    the host and are not counted (the pointer table, the small-argument block, the status
    words)."""

    NAMES = ("memcpy_htod", "memcpy_htod_async", "memcpy_dtoh", "memcpy_dtoh_async")

    def __init__(self, monkeypatch, drv_module):
        self.sizes = []
        for name in self.NAMES:
            real = getattr(drv_module, name)

            def counting(dst, src, *rest, _real=real, _name=name):
                host = src if "htod" in _name else dst
                self.sizes.append(getattr(host, "nbytes", 0))
                return _real(dst, src, *rest)
            monkeypatch.setattr(drv_module, name, counting)

    def at_least(self, nbytes, since=0) -> int:
        return sum(1 for s in self.sizes[since:] if s >= nbytes)


def test_a_graph_and_a_simulation_keep_their_planes_on_the_gpu(cuda, monkeypatch):
    """After build, a launch, a reverse, a simulation's run and its reverse copy no plane between
    host and device (a plane here is 24 kB; what may cross is a Param sum of 8 bytes), also for a
    simulation stepped from the host (the binomial schedule: one program on device arrays per
    step), and the planes read back explicitly have the NumPy backend's bits."""
    n, dt = 3000, 0.01

    @vkml.kernel
    def poly(x, a: vkml.Param):
        return {"y": (a * x * x + x) / (x + 2.0)}

    @vkml.kernel
    def drag(x, v, k: vkml.Param):
        v2 = v + dt * (-k * x - 0.2 * v * vkml.sqrt(v * v + 1.0))
        return {"x": x + dt * v2, "v": v2}

    def run(name, copies):
        vkml.set_backend(name)
        x = np.linspace(-1.0, 1.0, n)
        g = vkml.Graph().add(poly.bind(x=x, a=0.3, y=np.zeros(n)), name="poly").build(record=True)
        sim = vkml.simulation(drag, max_steps=50, record=True, window=8, x=x.copy(), v=np.zeros(n),
                              k=1.5)
        stepped = vkml.simulation(drag, max_steps=50, record=True, window="binomial", snapshots=3,
                                  x=x.copy(), v=np.zeros(n), k=1.5)
        # the seeds made on the device first (a NumPy seed is copied in once, by the user's choice)
        seed_y, seed_x = np.cos(x), np.ones(n)
        if name == "cuda":
            seed_y, seed_x = cuda.to_plane(seed_y), cuda.to_plane(seed_x)
        since = len(copies.sizes) if copies else 0
        g.launch()
        grads = vkml.diff.reverse(g.record, {"y": seed_y})
        sim.run()
        sg = vkml.diff.Reverse(sim)(sim.record, {"x": seed_x})
        stepped.run()
        hg = vkml.diff.reverse(stepped.record, {"x": seed_x, "v": seed_x})
        moved = copies.at_least(n * 8, since) if copies else None
        out = [np.asarray(v) for v in (g.planes["y"], grads["x"], grads["a"], sim.planes["x"],
                                       sim.planes["v"], sg["x"], sg["k"], stepped.planes["x"],
                                       hg["x"], hg["v"], hg["k"])]
        return out, moved

    want, _ = run("numpy", None)
    copies = _HostCopies(monkeypatch, cuda.gpu.drv)
    for rounds in range(2):                          # the first captures the CUDA graphs
        got, moved = run("cuda", copies)
        assert moved == 0, copies.sizes
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_graph_replay_and_kernel_by_kernel_give_the_same_bits(cuda):
    x = RNG.normal(size=(64, 33)).astype(np.float32)
    fn = lambda t: vkml.softmax(vkml.tanh(t * 1.7) @ vkml.transpose(t), axis=1)  # noqa: E731
    cuda.use_graphs = True
    a = fn(vkml.tensor(x)).numpy()
    cuda.use_graphs = False
    before = cuda.kernel_launches
    b = fn(vkml.tensor(x)).numpy()
    assert cuda.kernel_launches > before
    assert a.tobytes() == b.tobytes()


# -- submissions, graph launches, caches ------------------------------------------------------------

def test_a_realize_of_a_50_op_graph_is_one_graph_launch(cuda):
    x = vkml.tensor(RNG.normal(size=(32, 32)).astype(np.float32))

    def chain():
        y = x
        for i in range(50):
            y = [lambda t: t * 1.01 + 0.5, vkml.tanh, lambda t: t @ x * 0.01,
                 lambda t: t - vkml.mean(t, axis=1, keepdims=True), vkml.exp][i % 5](y)
        return y
    chain().numpy()                # the first run: launch by launch (checked), then captured
    vkml.reset_stats()
    chain().numpy()                # the same program again: one replay of its graph
    s = vkml.stats()
    assert (s.submissions, s.graph_launches) == (1, 1)


def test_a_repeated_training_step_compiles_and_captures_nothing_new(cuda):
    vkml.nn.manual_seed(0)
    model = vkml.nn.Sequential(vkml.nn.Linear(20, 32), vkml.nn.ReLU(), vkml.nn.Linear(32, 4))
    opt = vkml.optim.Adam(model.parameters(), lr=1e-2)
    xt = vkml.tensor(RNG.normal(size=(16, 20)).astype(np.float32))
    yt = vkml.tensor(RNG.integers(0, 4, 16))

    def step():
        opt.zero_grad()
        loss = vkml.nn.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        return float(loss.numpy())

    losses = [step(), step(), step()]
    captures = cuda.captures
    gc.collect()                      # values dropped in Var/Eqn cycles go back to the pool
    allocations = cuda.gpu.pool.allocations
    vkml.reset_stats()
    losses.append(step())
    s = vkml.stats()
    assert s.compiles == 0 and cuda.captures == captures
    assert s.graph_launches == s.submissions > 0
    assert losses[3] < losses[0]
    # parameters, gradients and optimizer state stay on the GPU; the steady state allocates nothing
    assert cuda.gpu.pool.allocations == allocations
    assert all(isinstance(p.ir_var.value, DeviceArray) for p in model.parameters())
    assert all(isinstance(p.grad.ir_var.value, DeviceArray) for p in model.parameters())


def test_a_compiled_training_step_is_one_graph_launch_and_matches_numpy(cuda):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 20)), rng.integers(0, 4, 16)
    params = {}
    for name in ("numpy", "cuda"):
        vkml.set_backend(name)
        vkml.nn.manual_seed(0)
        model = vkml.nn.Sequential(vkml.nn.Linear(20, 32, dtype=np.float64), vkml.nn.ReLU(),
                                   vkml.nn.Linear(32, 4, dtype=np.float64))
        opt = vkml.optim.Adam(model.parameters(), lr=1e-2)
        step = opt.compile_step(lambda xb, yb: vkml.nn.cross_entropy(model(xb), yb))
        xt, yt = vkml.tensor(x), vkml.tensor(y)
        step(xt, yt)
        vkml.reset_stats()
        for _ in range(3):
            step(xt, yt)
        s = vkml.stats()
        assert (s.submissions, s.compiles, s.traces) == (3, 0, 0)
        if name == "cuda":
            assert s.graph_launches == 3
        params[name] = [np.asarray(p.numpy()) for p in model.parameters()]
    for a, b in zip(params["cuda"], params["numpy"]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_a_new_process_finds_its_kernels_in_the_disk_cache(cuda):
    prog_fn = lambda t: vkml.sin(t) * 3.25 - vkml.cos(t)  # noqa: E731
    x = RNG.normal(size=(17,))
    first = prog_fn(vkml.tensor(x)).numpy()
    cuda.clear_cache()
    cuda.gpu.modules.clear()
    vkml.reset_stats()
    again = prog_fn(vkml.tensor(x)).numpy()
    s = vkml.stats()
    assert s.compiles == 0 and s.cache_hits >= 1
    assert first.tobytes() == again.tobytes()


def test_backend_info_names_the_gpu(cuda):
    info = vkml.backend_info()
    assert info["backend"] == "cuda" and info["arch"].startswith("sm_")
    assert info["gpu"] in info["cuda"]
    assert cuda.free_memory() > 0
