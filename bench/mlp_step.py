"""One training step of a 784-256-10 MLP (ReLU, cross-entropy, Adam) at batch 64, float32.

Side by side in one run:

- ``vkml``: ``vkml.nn`` + ``vkml.optim`` on the NumPy backend (forward, ``backward``, ``Adam.step``);
- ``vkml compile_step``: the same step as ``opt.compile_step(loss_fn)`` -- traced once into one
  program (forward, gradient, update), replayed each step in one submission;
- ``numpy``: the same step written by hand -- forward, manual backward, Adam -- the floor for
  a backend that runs NumPy;
- ``torch``: PyTorch on the CPU (skipped with a note when torch is not installed).

All run on ONE thread, the process pinned to one CPU (thread variables set before NumPy is
imported, ``torch.set_num_threads``), so the comparison is of work and overhead, not of thread
pools; ``--threads N`` changes that for all of them (and does not pin).  They start from the same
weights and batch, and the script checks that they compute the same loss.  The sides are timed
interleaved, in rounds: a side's time is the minimum over rounds of its per-round median
(``_timing.py`` says why).

    python3 bench/mlp_step.py [--quick] [--repeat 200] [--threads 1] [--parts] [--profile]
                              [--compiled-parts]

``--parts`` splits vkml's step into building the forward graph, backward (host side: collecting the
graph and its key; and the derived program's run), and the optimiser step (host side; and the update
program's run), beside the NumPy step's forward+backward and Adam, so it shows where vkml's time goes.
``--compiled-parts`` does the same for compile_step: its program's run against the Python around it,
page faults per step, and whether parameters and moments are updated in their own arrays.
"""

import argparse
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps per round (seconds)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed steps per contender, over all rounds "
                             "(default 200; 50 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the interleaving (5)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before --parts")
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads for all three")
    parser.add_argument("--parts", action="store_true",
                        help="also split vkml's step into host work and program runs, part by part")
    parser.add_argument("--profile", action="store_true",
                        help="also profile vkml's step with cProfile")
    parser.add_argument("--compiled-parts", action="store_true",
                        help="also split compile_step's step into its program's run and the Python "
                             "around it, with page faults per step")
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (50 if args.quick else 200)
    args.rounds = args.rounds or 5
    return args


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_seconds, pin, print_table, sampler, time_sides  # noqa: E402

if __name__ == "__main__":        # before numpy is imported, or pinning has no effect
    args = parse_args()
    PINNED = pin(args.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kit"))
import vkml  # noqa: E402
from _models import VkmlMlp  # noqa: E402

BATCH, D_IN, D_HID, D_OUT = 64, 784, 256, 10
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8

rng = np.random.default_rng(0)
X = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
Y = rng.integers(0, D_OUT, BATCH)


# -- vkml ----------------------------------------------------------------------------------------

MLP = VkmlMlp(X, Y, (D_IN, D_HID, D_OUT), LR, (B1, B2), EPS)
model, opt, xt, yt, INIT = MLP.model, MLP.opt, MLP.xt, MLP.yt, MLP.init   # W1, b1, W2, b2 for the others
vkml_step = MLP.step                       # zero_grad, backward, Adam.step
vkml_compiled_step = MLP.compiled_step     # the same step traced once into one program


# -- hand-written NumPy --------------------------------------------------------------------------

class NumpyMLP:
    """Forward, manual backward and an in-place Adam: what a careful NumPy programmer writes."""

    def __init__(self, params):
        self.params = [p.copy() for p in params]
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0
        self.onehot = np.zeros((BATCH, D_OUT), np.float32)
        self.onehot[np.arange(BATCH), Y] = 1.0

    def step(self):
        return self.adam(self.forward_backward())

    def forward_backward(self):
        w1, b1, w2, b2 = self.params
        h = X @ w1.T + b1
        a = np.maximum(h, 0)
        z = a @ w2.T + b2
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s)[:, 0] - z[np.arange(BATCH), Y]))
        dz = (e / s - self.onehot) * np.float32(1.0 / BATCH)
        dw2 = dz.T @ a
        db2 = dz.sum(axis=0)
        da = dz @ w2
        da *= h > 0
        dw1 = da.T @ X
        db1 = da.sum(axis=0)
        self.loss = loss
        return dw1, db1, dw2, db2

    def adam(self, grads):
        self.t += 1
        step_size = np.float32(LR / (1 - B1 ** self.t))
        inv_bc2 = np.float32(1 / np.sqrt(1 - B2 ** self.t))
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= B1
            m += np.float32(1 - B1) * g
            v *= B2
            v += np.float32(1 - B2) * (g * g)
            p -= step_size * m / (np.sqrt(v) * inv_bc2 + np.float32(EPS))
        return self.loss


# -- PyTorch ---------------------------------------------------------------------------------------

def torch_contender():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed: skipped (pip install torch)"
    torch.set_num_threads(args.threads)
    net = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.ReLU(), torch.nn.Linear(D_HID, D_OUT))
    with torch.no_grad():
        for p, init in zip(net.parameters(), INIT):
            p.copy_(torch.from_numpy(init))
    topt = torch.optim.Adam(net.parameters(), lr=LR, betas=(B1, B2), eps=EPS)
    tx, ty = torch.from_numpy(X), torch.from_numpy(Y)

    def step():
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(tx), ty)
        loss.backward()
        topt.step()
        return loss

    return step, f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def main():
    ref = NumpyMLP(INIT)
    tstep, tnote = torch_contender()
    # Same weights, same batch: the first losses agree (a wrong contender would be a useless bench).
    l_vkml, l_np = vkml_step().item(), ref.step()
    parts_ref = NumpyMLP(INIT)
    losses = {"vkml": l_vkml, "vkml compile_step": vkml_compiled_step().item(), "numpy": l_np}
    if tstep is not None:
        losses["torch"] = tstep().item()
    assert all(abs(v - l_np) < 1e-4 for v in losses.values()), losses

    sides = {"vkml": vkml_step, "vkml compile_step": vkml_compiled_step, "numpy": ref.step}
    if tstep is not None:
        sides["torch"] = tstep
    rows = list(time_sides(sides, rounds=args.rounds,
                           reps=max(1, args.repeat // args.rounds)).items())
    before = vkml.stats()
    n = 20
    for _ in range(n):
        vkml_step()
    delta = vkml.stats() - before
    before = vkml.stats()
    for _ in range(n):
        vkml_compiled_step()
    delta_c = vkml.stats() - before
    per_step = {"vkml": f"{delta.submissions / n:g}", "vkml compile_step": f"{delta_c.submissions / n:g}"}

    print(f"MLP {D_IN}-{D_HID}-{D_OUT}, batch {BATCH}, float32, Adam; {PINNED}; {args.rounds} "
          f"rounds of {max(1, args.repeat // args.rounds)} steps per side, min of the round medians")
    print(f"numpy {np.__version__}; {tnote}")
    print("first-step loss: " + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
    print_table("one training step (forward, backward, Adam):", rows, baselines=("numpy", "torch"),
                extra=[("submissions/step", per_step)])
    print(f"vkml over {n} more steps: {delta.submissions} submissions, {delta.compiles} compiles, "
          f"{delta.cache_hits} cache hits; compile_step: {delta_c.submissions} submissions, "
          f"{delta_c.compiles} compiles, {delta_c.traces} traces")

    if args.parts:
        parts(parts_ref)
    if args.compiled_parts:
        compiled_parts()
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            vkml_step()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


def parts(ref):
    """Median time of each part of vkml's step, program runs timed apart from the host work around them."""
    import statistics
    import time

    backend = vkml.backends.current()
    in_program = [0.0]
    run = backend.run

    def timed_run(exe, run_args, *rest):
        t0 = time.perf_counter()
        try:
            return run(exe, run_args, *rest)
        finally:
            in_program[0] += time.perf_counter() - t0

    backend.run = timed_run
    # a jitted call that takes its fast path (the optimiser's update) runs its executable without
    # backend.run: its plan's run is timed whole (the executable, and the result tensors it makes)
    plan_run = vkml.programs.arguments.FastPlan.run

    def timed_plan_run(plan, run_args, *rest, **options):
        t0 = time.perf_counter()
        try:
            return plan_run(plan, run_args, *rest, **options)
        finally:
            in_program[0] += time.perf_counter() - t0

    vkml.programs.arguments.FastPlan.run = timed_plan_run
    names = ["forward: build the graph", "backward: host (collect, key, args)", "backward: program run",
             "optimizer step: host", "optimizer step: program run", "whole step"]
    samples = {n: [] for n in names}
    clock = time.perf_counter
    try:
        for i in range(args.repeat + args.warmup):
            t0 = clock()
            opt.zero_grad()
            loss = vkml.nn.cross_entropy(model(xt), yt)
            t1 = clock()
            in_program[0] = 0.0
            loss.backward()
            t2, bwd = clock(), in_program[0]
            in_program[0] = 0.0
            opt.step()
            t3, upd = clock(), in_program[0]
            if i >= args.warmup:
                for n, v in zip(names, (t1 - t0, t2 - t1 - bwd, bwd, t3 - t2 - upd, upd, t3 - t0)):
                    samples[n].append(v)
    finally:
        del backend.run
        vkml.programs.arguments.FastPlan.run = plan_run
    rows = [(n, statistics.median(v)) for n, v in samples.items()]
    print_table("vkml's step, part by part (medians; parts need not add up to the whole exactly):",
                rows)
    grads = ref.forward_backward()
    ref_rows = [("forward + manual backward", median_seconds(ref.forward_backward, repeat=args.repeat)),
                ("Adam, in place", median_seconds(lambda: ref.adam(grads), repeat=args.repeat))]
    print_table("the hand-written NumPy step, part by part:", ref_rows)


def compiled_parts():
    """Where compile_step's time goes: its program's run (jit's fast path: the executable and the
    results' Tensors) and the Python around it (the optimiser's host part, flattening, handing
    the results over); the page faults a step takes (a fresh page faults; a steady step should
    touch none); the equations of its program; and whether it updates the parameters and
    moments where they are (the same arrays after a step)."""
    import resource
    import statistics
    import time
    import weakref

    plan_class = vkml.programs.arguments.FastPlan
    run = plan_class.run
    inside = [0.0]

    def timed_run(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return run(self, *a, **k)
        finally:
            inside[0] += time.perf_counter() - t0

    whole, program = [], []
    plan_class.run = timed_run
    try:
        for i in range(args.warmup + args.repeat):
            inside[0] = 0.0
            t0 = time.perf_counter()
            vkml_compiled_step()
            if i >= args.warmup:
                whole.append(time.perf_counter() - t0)
                program.append(inside[0])
    finally:
        plan_class.run = run
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.repeat):
        vkml_compiled_step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.repeat
    state = MLP._compiled.opt
    arrays = lambda: [t.ir_var.value for t in [*state.params, *state.exp_avg, *state.exp_avg_sq]]
    refs = [weakref.ref(a) for a in arrays()]
    vkml_compiled_step()
    in_place = sum(r() is a for r, a in zip(refs, arrays()))
    whole_s, program_s = statistics.median(whole), statistics.median(program)
    print_table("compile_step's step, part by part (medians):",
                [("whole step", whole_s), ("its program's run", program_s),
                 ("Python around the run", whole_s - program_s)])
    eqns = sum(len(p.eqns) for p in MLP._compiled.programs())
    print(f"page faults per step: {faults:.2f}; equations in the step's program: {eqns}; "
          f"parameter and moment arrays updated in place: {in_place} of {len(refs)}")


def ab_workloads(quick):
    """vkml's sides of this bench (``bench/ab.py``): the lazy step and the compiled step on the
    cpu tier and the NumPy backend, built and warmed: name -> (phase names, sampler)."""
    out = {}
    for backend in ("cpu", "numpy"):
        vkml.set_backend(backend)
        mlp = VkmlMlp(X, Y, (D_IN, D_HID, D_OUT), LR, (B1, B2), EPS)
        for _ in range(4):           # traced, then NumPy runs, then the compiled runs
            mlp.step(), mlp.compiled_step()
        for name, fn in (("lazy", mlp.step), ("compile_step", mlp.compiled_step)):
            out[f"training step, {name}, {backend}"] = (
                ("step",), sampler(fn, reps=10 if quick else 30,
                                   between=lambda b=backend: vkml.set_backend(b)))
    return out


if __name__ == "__main__":
    main()
