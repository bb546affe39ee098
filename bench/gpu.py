"""The GPU section: the cuda backend side by side with itself kernel by kernel, PyTorch CUDA, and NumPy.

Four measurements in one run (``scripts/device-check`` runs it on a machine with a GPU):

1. **Host time per realize**: a 50-op lazy graph (elementwise chains, small matmuls, row
   reductions) on 64 x 64 float32, realized again and again: one replayed CUDA graph per realize,
   against the same executable launching its kernels one by one, and the NumPy backend.
2. **The MLP step** of ``bench/mlp_step.py`` (784-256-10, batch 64, float32, ReLU, cross-entropy,
   Adam): vkml on the GPU (the lazy step, and ``opt.compile_step``: one program per step), PyTorch
   CUDA eager, and PyTorch with the whole step captured in a CUDA
   graph (``torch.cuda.graph``, ``Adam(capturable=True)``), when torch with CUDA is installed.
   Every contender waits for its step to finish (vkml's realizes are synchronous).
3. **A recorded simulation at 10^6 samples**: the damped pendulum of ``bench/simulation.py``,
   forward (recorded, default window) and ``vkml.diff.Reverse``, on the GPU (one per-sample loop
   kernel each: a thread per sample through every step) and on the NumPy backend; the gradients
   agree.
4. **Bandwidth** of a large fused elementwise map (2^27 float32, one kernel, timed on the device
   with CUDA events) against the card's device-to-device copy bandwidth (bytes read + written).

Without a GPU (or PyCUDA) it says so and exits 0.

    python bench/gpu.py [--quick] [--json PATH] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import vkml
except ImportError:                       # a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(HERE, "..", "kit"))
    import vkml
from _models import DAMPING, DT, LENGTH, VkmlMlp, pendulum  # noqa: E402
from _timing import median_seconds, print_table, time_sides  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
parser.add_argument("--json", help="also write the numbers to this file")
parser.add_argument("--smoke", action="store_true",
                    help="tiny sizes: checks the script itself (e.g. on the emulated driver of tests/)")
args = parser.parse_args()

REPEAT = 3 if args.smoke else 30 if args.quick else 200
WARMUP = 1 if args.smoke else 10
RESULTS = {}


# -- 1. host time per realize ---------------------------------------------------------------------

def fifty_ops(x, w):
    y = x
    for i in range(50):
        y = [lambda u: u * 1.01 + 0.5, vkml.tanh, lambda u: u @ w * 0.05,
             lambda u: u - vkml.mean(u, axis=1, keepdims=True), vkml.exp][i % 5](y)
    return y


def submission(backend):
    rng = np.random.default_rng(0)
    size = 16 if args.smoke else 64
    x = rng.normal(size=(size, size)).astype(np.float32)
    w = rng.normal(size=(size, size)).astype(np.float32) * 0.1
    xt, wt = vkml.tensor(x), vkml.tensor(w)

    def realize():
        return fifty_ops(xt, wt).numpy()

    rows = []
    backend.use_graphs = True
    realize()
    exe = max(backend._executables.values(), key=lambda e: len(getattr(e, "launches", ())))
    kernels = len(exe.launches)
    rows.append(("graph replay", median_seconds(realize, repeat=REPEAT, warmup=WARMUP)))
    backend.use_graphs = False
    rows.append(("kernel by kernel", median_seconds(realize, repeat=REPEAT, warmup=WARMUP)))
    backend.use_graphs = True
    vkml.set_backend("numpy")
    xt, wt = vkml.tensor(x), vkml.tensor(w)
    rows.append(("numpy backend", median_seconds(realize, repeat=REPEAT, warmup=WARMUP)))
    vkml.set_backend("cuda")
    print_table(f"1. one realize of a 50-op graph ({size}x{size} float32; {kernels} kernels, "
                "host time incl. building the graph):", rows,
                baselines=("graph replay",))
    RESULTS["realize"] = {name: secs for name, secs in rows}
    RESULTS["realize"]["kernels"] = kernels


# -- 2. the MLP step -------------------------------------------------------------------------------

BATCH, D_IN, D_HID, D_OUT = (8, 24, 16, 4) if args.smoke else (64, 784, 256, 10)
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


def mlp():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    Y = rng.integers(0, D_OUT, BATCH)
    mlp_ = VkmlMlp(X, Y, (D_IN, D_HID, D_OUT), LR, (B1, B2), EPS)
    init, vkml_step, vkml_compiled_step = mlp_.init, mlp_.step, mlp_.compiled_step

    losses = {"vkml cuda": float(vkml_step().numpy()),
              "vkml cuda compile_step": float(vkml_compiled_step().numpy())}
    sides = {"vkml cuda": vkml_step, "vkml cuda compile_step": vkml_compiled_step}
    notes = {}
    for name, fn in (("vkml cuda", vkml_step), ("vkml cuda compile_step", vkml_compiled_step)):
        before = vkml.stats()
        for _ in range(REPEAT):
            fn().numpy()
        delta = vkml.stats() - before
        notes[name] = f"{delta.submissions / REPEAT:g}"
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch has no CUDA here")
    except ImportError as e:
        print(f"2. PyTorch CUDA skipped: {e}")
        torch = None
    if torch is not None:
        for name, graphed in (("torch cuda eager", False), ("torch cuda graph", True)):
            step, loss0 = torch_step(torch, init, X, Y, graphed)
            losses[name] = loss0
            sides[name] = step
    rounds = 1 if args.smoke else 5      # sides interleaved: a load spike hits them alike
    rows = list(time_sides(sides, rounds=rounds, reps=max(1, REPEAT // rounds)).items())
    print_table(f"2. one MLP training step ({D_IN}-{D_HID}-{D_OUT}, batch {BATCH}, float32, Adam), "
                "synchronized:", rows, baselines=("vkml cuda",),
                extra=[("submissions/step", notes)])
    print("   first-step losses: " + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
    RESULTS["mlp"] = {name: secs for name, secs in rows}
    RESULTS["mlp"]["submissions per step"] = notes


def torch_step(torch, init, X, Y, graphed):
    F = torch.nn.functional
    dev = torch.device("cuda")
    net = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.ReLU(),
                              torch.nn.Linear(D_HID, D_OUT)).to(dev)
    with torch.no_grad():
        for p, a in zip(net.parameters(), init):
            p.copy_(torch.from_numpy(a))
    opt = torch.optim.Adam(net.parameters(), lr=LR, betas=(B1, B2), eps=EPS, capturable=graphed)
    x, y = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)
    if not graphed:
        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            return loss
        return step, float(step().item())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):                 # warm up on a side stream, as torch.cuda.graph asks
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():                  # start the timed run from the same weights
        for p, a in zip(net.parameters(), init):
            p.copy_(torch.from_numpy(a))
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(net(x), y)
        static_loss.backward()
        opt.step()

    def step():
        graph.replay()
        torch.cuda.synchronize()
        return static_loss
    return step, float(step().item())


# -- 3. a recorded simulation at 10^6 samples --------------------------------------------------------

def simulation():
    n = 1000 if args.smoke else 10**5 if args.quick else 10**6
    steps = 8 if args.smoke else 32 if args.quick else 100
    rows, grads, notes = [], {}, {}
    for name in ("cuda", "numpy"):
        vkml.set_backend(name)
        theta0, omega0 = np.linspace(0.1, 1.0, n), np.linspace(-0.5, 0.5, n)
        theta, omega, t = theta0.copy(), omega0.copy(), np.zeros(n)
        sim = vkml.simulation(pendulum, max_steps=steps, record=True, theta=theta, omega=omega,
                              t=t, length=LENGTH, damping=DAMPING, t_end=(steps - 0.5) * DT)
        rev = vkml.diff.Reverse(sim)
        seeds = {"theta": np.ones(n), "omega": np.full(n, 0.5)}
        fwd, back = [], []
        backend = vkml.backends.current()
        loops, submissions = getattr(backend, "loop_launches", 0), vkml.stats().submissions
        for _ in range(2 if name == "cuda" else 1):
            for plane, start in (("theta", theta0), ("omega", omega0), ("t", np.zeros(n))):
                # on the GPU the simulation runs on its own device planes: reset those
                backend.copy_plane_into(sim.planes[plane], start)
            t0 = time.perf_counter()
            sim.run()
            t1 = time.perf_counter()
            g = rev(sim.record, seeds)
            t2 = time.perf_counter()
            fwd.append(t1 - t0)
            back.append(t2 - t1)
        grads[name] = {k: np.asarray(g[k]) for k in ("theta", "omega", "length", "damping")}
        loops = getattr(backend, "loop_launches", 0) - loops
        submissions = vkml.stats().submissions - submissions
        if name == "cuda" and loops == 0:
            print("   WARNING: the cuda side ran no per-sample loop kernel: the simulation stepped "
                  "batch by batch (one submission per step)")
        notes[name] = f"{submissions / len(fwd):g} submissions, {loops / len(fwd):g} loop kernels"
        rows.append((f"{name} forward", min(fwd)))
        rows.append((f"{name} reverse", min(back)))
    vkml.set_backend("cuda")
    for k in grads["numpy"]:
        np.testing.assert_allclose(grads["cuda"][k], grads["numpy"][k], rtol=1e-6, atol=1e-9)
    print_table(f"3. recorded pendulum, {n:,} samples x {steps} steps (default window), "
                "forward and Reverse (gradients agree):", rows, unit="ms")
    print("   per forward + reverse: " + "; ".join(f"{k}: {v}" for k, v in notes.items()))
    RESULTS["simulation"] = {"samples": n, "steps": steps, **{name: secs for name, secs in rows},
                             "work": notes}


# -- 4. bandwidth ---------------------------------------------------------------------------------------

def bandwidth(backend):
    """Raw launches and copies on the backend's stream (with its context current)."""
    with backend.gpu.active():
        from vkml.backends.cuda import CudaExecutable
        drv, stream = backend.gpu.drv, backend.gpu.stream
        n = 1 << (12 if args.smoke else 24 if args.quick else 27)
        prog = vkml.program(lambda x: ((x * 1.5 + 0.25) * x - 0.5) / (x * x + 1.0),
                            np.ones(n, np.float32))
        exe = backend.executable(("bench-bandwidth", n), lambda: prog)
        assert isinstance(exe, CudaExecutable) and len(exe.launches) == 1
        exe([np.linspace(-1, 1, n, dtype=np.float32)])
        spec, fn, grid, block, _ = exe.launches[0]
        reps = 2 if args.smoke else 20
        start, end = drv.Event(), drv.Event()

        def timed(launch):
            launch()
            start.record(stream)
            for _ in range(reps):
                launch()
            end.record(stream)
            end.synchronize()
            return end.time_since(start) / 1e3 / reps

        t_map = timed(lambda: fn._launch_kernel(grid, block, exe.args, 0, stream))
        nbytes = n * 4
        src, dst = exe.bufs[0], exe.bufs[1]
        t_copy = timed(lambda: drv.memcpy_dtod_async(dst, src, nbytes, stream))
        map_gbs, copy_gbs = 2 * nbytes / t_map / 1e9, 2 * nbytes / t_copy / 1e9
        print(f"4. bandwidth, {n:,} float32 ({nbytes / 2**20:.0f} MiB in, the same out), "
              "bytes read + written per second:")
        print(f"   fused elementwise map (1 kernel, {grid[0]} blocks x {block[0]}): {map_gbs:,.0f} GB/s "
              f"({t_map * 1e3:.3f} ms)")
        print(f"   device-to-device copy:                 {copy_gbs:,.0f} GB/s ({t_copy * 1e3:.3f} ms)")
        print(f"   map / copy: {map_gbs / copy_gbs:.2f}")
        RESULTS["bandwidth"] = {"map GB/s": map_gbs, "copy GB/s": copy_gbs, "elements": n}


def main():
    try:
        backend = vkml.set_backend("cuda")
    except vkml.BackendError as e:
        print(f"bench/gpu.py: no GPU here, skipped ({e})")
        return 0
    print(f"vkml cuda backend: {vkml.backend_info()['cuda']}")
    for name, fn in (("realize", lambda: submission(backend)), ("mlp", mlp),
                     ("simulation", simulation), ("bandwidth", lambda: bandwidth(backend))):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:            # one failing section must not hide the others
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"   ({name}: {time.perf_counter() - t0:.1f} s)\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1)
    return 1 if any("error" in v for v in RESULTS.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
