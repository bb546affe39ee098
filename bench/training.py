"""Training steps at the sizes people train, side by side: vkml's compiled step on the cpu tier
against hand-written NumPy, PyTorch eager, ``torch.compile`` and ``jax.jit``.

The steps (float32, Adam, one step = forward, gradient, update):

- ``mlp-256`` / ``mlp-1024``: 784-256-10 MLP (ReLU, cross-entropy) at batch 256 / 1024;
- ``big-mlp``: 1024-4096-4096-10 MLP at batch 256;
- ``cnn``: LeNet-style, 1x28x28 -> conv 5x5 32 -> ReLU -> max-pool 2 -> conv 5x5 64 -> ReLU ->
  max-pool 2 -> 1024-128-10, batch 64;
- ``strided-cnn``: CIFAR-sized, 3x32x32 -> conv 3x3 32 -> ReLU -> conv 3x3 stride 2 64 -> ReLU ->
  conv 3x3 stride 2 128 -> ReLU -> global mean -> 128-10 (every convolution padded by 1), batch 32;
- ``transformer``: one pre-LN block (sequence 128, width 128, 4 heads, MLP 512 with GELU; mean
  squared error against a fixed target), batch 8.

Every side starts from the same weights and batch; their first losses are checked to agree before
anything is timed.  A side that is not installed (or fails to build) is named, not faked.  One
thread, the process pinned to one CPU, unless ``--threads N`` (then N threads for every side, not
pinned).  The sides are interleaved in rounds (``_timing.py``).  vkml runs on the cpu tier, its
products in the default fused mode (``--plain``: ``VKML_FMA=0``).

    python bench/training.py [--quick] [--threads N] [--only mlp-256,cnn] [--plain]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import blas, cpu_model, interleave, pin, print_rows, sampler  # noqa: E402

STEPS = ("mlp-256", "mlp-1024", "big-mlp", "cnn", "strided-cnn", "transformer")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repetitions")
    parser.add_argument("--threads", type=int, default=1, help="threads for every side (default 1)")
    parser.add_argument("--only", default=",".join(STEPS), help="comma-separated steps to run")
    parser.add_argument("--plain", action="store_true", help="vkml's products in the plain mode")
    return parser.parse_args(argv)


if __name__ == "__main__":        # before NumPy or a peer is imported, or pinning has no effect
    ARGS = parse_args()
    PINNED = pin(ARGS.threads)
    os.environ["VKML_BACKEND"] = "cpu"
    if ARGS.plain:
        os.environ["VKML_FMA"] = "0"

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kit"))
import vkml  # noqa: E402
from vkml.backends import background  # noqa: E402

LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8


# -- the models' shapes and weights (one seed for every side) --------------------------------------

def mlp_weights(sizes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        bound = 1 / np.sqrt(d_in)
        out += [rng.uniform(-bound, bound, (d_out, d_in)).astype(np.float32),
                rng.uniform(-bound, bound, d_out).astype(np.float32)]
    return out


def cnn_weights(seed=0):
    rng = np.random.default_rng(seed)

    def u(fan_in, *shape):
        return rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), shape).astype(np.float32)
    return [u(25, 32, 1, 5, 5), u(25, 32), u(800, 64, 32, 5, 5), u(800, 64),
            u(1024, 128, 1024), u(1024, 128), u(128, 10, 128), u(128, 10)]


def strided_cnn_weights(seed=0):
    rng = np.random.default_rng(seed)

    def u(fan_in, *shape):
        return rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), shape).astype(np.float32)
    return [u(27, 32, 3, 3, 3), u(27, 32), u(288, 64, 32, 3, 3), u(288, 64),
            u(576, 128, 64, 3, 3), u(576, 128), u(128, 10, 128), u(128, 10)]


#: (stride, padding) of the strided CNN's three convolutions
STRIDED = ((1, 1), (2, 1), (2, 1))

D, HEADS, SEQ, HIDDEN, TBATCH = 128, 4, 128, 512, 8


def transformer_weights(seed=0):
    rng = np.random.default_rng(seed)

    def u(fan_in, *shape):
        return rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), shape).astype(np.float32)
    ones, zeros = np.ones(D, np.float32), np.zeros(D, np.float32)
    # ln1 (g, b), qkv (W, b), out (W, b), ln2 (g, b), fc1 (W, b), fc2 (W, b)
    return [ones, zeros, u(D, 3 * D, D), u(D, 3 * D), u(D, D, D), u(D, D), ones.copy(),
            zeros.copy(), u(D, HIDDEN, D), u(D, HIDDEN), u(HIDDEN, D, HIDDEN), u(HIDDEN, D)]


def batch(name, seed=1):
    rng = np.random.default_rng(seed)
    if name.startswith("mlp") or name == "big-mlp":
        n, d_in = {"mlp-256": (256, 784), "mlp-1024": (1024, 784), "big-mlp": (256, 1024)}[name]
        return rng.standard_normal((n, d_in)).astype(np.float32), rng.integers(0, 10, n)
    if name == "cnn":
        return rng.standard_normal((64, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 64)
    if name == "strided-cnn":
        return rng.standard_normal((32, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 32)
    return (rng.standard_normal((TBATCH, SEQ, D)).astype(np.float32),
            rng.standard_normal((TBATCH, SEQ, D)).astype(np.float32))


SIZES = {"mlp-256": (784, 256, 10), "mlp-1024": (784, 256, 10), "big-mlp": (1024, 4096, 4096, 10)}


def weights(name):
    if name in SIZES:
        return mlp_weights(SIZES[name])
    return {"cnn": cnn_weights, "strided-cnn": strided_cnn_weights}.get(name, transformer_weights)()


# -- vkml ------------------------------------------------------------------------------------------

def vkml_side(name):
    params = [vkml.nn.Parameter(w) for w in weights(name)]
    F = vkml

    def linear(x, w, b):
        return x @ F.swapaxes(w, -1, -2) + b

    if name in SIZES:
        def loss_fn(x, y):
            h = x
            for i in range(0, len(params) - 2, 2):
                h = F.relu(linear(h, params[i], params[i + 1]))
            return vkml.nn.cross_entropy(linear(h, params[-2], params[-1]), y)
    elif name == "cnn":
        def loss_fn(x, y):
            c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = params
            h = F.relu(F.conv2d(x, c1w) + F.reshape(c1b, (1, 32, 1, 1)))
            h = F.max_pool2d(h, 2)
            h = F.relu(F.conv2d(h, c2w) + F.reshape(c2b, (1, 64, 1, 1)))
            h = F.reshape(F.max_pool2d(h, 2), (x.shape[0], 1024))
            h = F.relu(linear(h, f1w, f1b))
            return vkml.nn.cross_entropy(linear(h, f2w, f2b), y)
    elif name == "strided-cnn":
        def loss_fn(x, y):
            h = x
            for i, (s, p) in enumerate(STRIDED):
                w, b = params[2 * i], params[2 * i + 1]
                h = F.relu(F.conv2d(h, w, stride=s, padding=p) + F.reshape(b, (1, -1, 1, 1)))
            return vkml.nn.cross_entropy(linear(F.mean(h, axis=(2, 3)), params[6], params[7]), y)
    else:
        def loss_fn(x, target):
            return F.mean((transformer_block(F, params, x, linear) - target) ** 2)
    opt = vkml.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
    step = opt.compile_step(loss_fn)
    x, y = (vkml.tensor(v) for v in batch(name))
    return lambda: step(x, y), lambda: float(step(x, y).numpy())


def transformer_block(F, p, x, linear):
    """One pre-LN block in any of the array libraries here (``F``: its namespace of functions)."""
    g1, b1, wqkv, bqkv, wo, bo, g2, b2, w1, bb1, w2, bb2 = p
    n, s, d = x.shape
    hd = d // HEADS

    def norm(v, g, b):
        mu = F.mean(v, axis=-1, keepdims=True)
        var = F.mean((v - mu) ** 2, axis=-1, keepdims=True)
        return (v - mu) / F.sqrt(var + 1e-5) * g + b

    qkv = linear(norm(x, g1, b1), wqkv, bqkv)                            # n, s, 3d
    qkv = F.transpose(F.reshape(qkv, (n, s, 3, HEADS, hd)), (2, 0, 3, 1, 4))
    q, k, v = qkv[0], qkv[1], qkv[2]                                     # n, h, s, hd
    scores = q @ F.swapaxes(k, -1, -2) * (1.0 / hd ** 0.5)      # (a Python float: float32 stays)
    scores = scores - F.max(scores, axis=-1, keepdims=True)
    e = F.exp(scores)
    att = e / F.sum(e, axis=-1, keepdims=True)
    mixed = F.reshape(F.transpose(att @ v, (0, 2, 1, 3)), (n, s, d))
    x = x + linear(mixed, wo, bo)
    h = linear(norm(x, g2, b2), w1, bb1)
    h = 0.5 * h * (1.0 + F.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))   # GELU (tanh)
    return x + linear(h, w2, bb2)


# -- hand-written NumPy (the MLPs) -----------------------------------------------------------------

def numpy_side(name):
    if name not in SIZES:
        raise NotImplementedError("hand-written NumPy only for the MLPs")
    params = [w.copy() for w in weights(name)]
    m = [np.zeros_like(w) for w in params]
    v = [np.zeros_like(w) for w in params]
    t = [0]
    x, y = batch(name)

    def step():
        hs, h = [x], x
        for i in range(0, len(params) - 2, 2):
            h = np.maximum(h @ params[i].T + params[i + 1], 0)
            hs.append(h)
        logits = h @ params[-2].T + params[-1]
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y]).mean()
        d = p
        d[np.arange(len(y)), y] -= 1
        d /= len(y)
        grads = [None] * len(params)
        for i in range(len(params) - 2, -1, -2):
            grads[i], grads[i + 1] = d.T @ hs[i // 2], d.sum(axis=0)
            if i:
                d = (d @ params[i]) * (hs[i // 2] > 0)
        t[0] += 1
        b1, b2 = BETAS
        for w, g, mm, vv in zip(params, grads, m, v):
            mm *= b1
            mm += (1 - b1) * g
            vv *= b2
            vv += (1 - b2) * g * g
            w -= LR * (mm / (1 - b1 ** t[0])) / (np.sqrt(vv / (1 - b2 ** t[0])) + EPS)
        return loss
    return step, lambda: float(step())


# -- PyTorch (eager and torch.compile) -------------------------------------------------------------

def torch_side(name, compiled=False):
    import torch
    import torch.nn.functional as TF
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    params = [torch.tensor(w, requires_grad=True) for w in weights(name)]
    opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
    x, y = (torch.tensor(v) for v in batch(name))

    def loss_fn():
        if name in SIZES:
            h = x
            for i in range(0, len(params) - 2, 2):
                h = torch.relu(TF.linear(h, params[i], params[i + 1]))
            return TF.cross_entropy(TF.linear(h, params[-2], params[-1]), y)
        if name == "cnn":
            c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = params
            h = TF.max_pool2d(torch.relu(TF.conv2d(x, c1w, c1b)), 2)
            h = TF.max_pool2d(torch.relu(TF.conv2d(h, c2w, c2b)), 2).reshape(x.shape[0], 1024)
            h = torch.relu(TF.linear(h, f1w, f1b))
            return TF.cross_entropy(TF.linear(h, f2w, f2b), y)
        if name == "strided-cnn":
            h = x
            for i, (s, p) in enumerate(STRIDED):
                h = torch.relu(TF.conv2d(h, params[2 * i], params[2 * i + 1], stride=s, padding=p))
            return TF.cross_entropy(TF.linear(h.mean(dim=(2, 3)), params[6], params[7]), y)
        return ((transformer_block(_TorchF, params, x, TF.linear) - y) ** 2).mean()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss
    if compiled:
        step = torch.compile(step)
    return step, lambda: float(step().detach())


class _TorchF:
    """The few functions ``transformer_block`` calls, spelled as PyTorch spells them."""

    @staticmethod
    def mean(v, axis, keepdims):
        return v.mean(dim=axis, keepdim=keepdims)

    @staticmethod
    def max(v, axis, keepdims):
        return v.amax(dim=axis, keepdim=keepdims)

    @staticmethod
    def sum(v, axis, keepdims):
        return v.sum(dim=axis, keepdim=keepdims)

    @staticmethod
    def sqrt(v):
        import torch
        return torch.sqrt(v)

    @staticmethod
    def exp(v):
        import torch
        return torch.exp(v)

    @staticmethod
    def tanh(v):
        import torch
        return torch.tanh(v)

    @staticmethod
    def reshape(v, shape):
        return v.reshape(shape)

    @staticmethod
    def transpose(v, perm):
        return v.permute(perm)

    @staticmethod
    def swapaxes(v, a, b):
        return v.transpose(a, b)


# -- JAX (jax.jit of the whole step, Adam written out) ---------------------------------------------

def jax_side(name):
    import jax
    import jax.numpy as jnp
    params = [jnp.asarray(w) for w in weights(name)]
    x, y = (jnp.asarray(v) for v in batch(name))

    def linear(h, w, b):
        return h @ w.T + b

    def xent(logits, labels):
        z = logits - jax.lax.stop_gradient(logits.max(axis=1, keepdims=True))
        logp = z - jnp.log(jnp.exp(z).sum(axis=1, keepdims=True))
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    def loss_fn(p):
        if name in SIZES:
            h = x
            for i in range(0, len(p) - 2, 2):
                h = jax.nn.relu(linear(h, p[i], p[i + 1]))
            return xent(linear(h, p[-2], p[-1]), y)
        if name == "cnn":
            c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = p

            def conv(h, w, b):
                out = jax.lax.conv_general_dilated(h, w, (1, 1), "VALID")
                return out + b[None, :, None, None]

            def pool(h):
                return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                             "VALID")
            h = pool(jax.nn.relu(conv(x, c1w, c1b)))
            h = pool(jax.nn.relu(conv(h, c2w, c2b))).reshape(x.shape[0], 1024)
            h = jax.nn.relu(linear(h, f1w, f1b))
            return xent(linear(h, f2w, f2b), y)
        if name == "strided-cnn":
            h = x
            for i, (s, pad) in enumerate(STRIDED):
                h = jax.lax.conv_general_dilated(h, p[2 * i], (s, s), ((pad, pad), (pad, pad)))
                h = jax.nn.relu(h + p[2 * i + 1][None, :, None, None])
            return xent(linear(h.mean(axis=(2, 3)), p[6], p[7]), y)
        return ((transformer_block(jnp, p, x, linear) - y) ** 2).mean()

    b1, b2 = BETAS

    @jax.jit
    def step(p, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(p)
        t = t + 1
        m = [b1 * mm + (1 - b1) * gg for mm, gg in zip(m, g)]
        v = [b2 * vv + (1 - b2) * gg * gg for vv, gg in zip(v, g)]
        p = [w - LR * (mm / (1 - b1 ** t)) / (jnp.sqrt(vv / (1 - b2 ** t)) + EPS)
             for w, mm, vv in zip(p, m, v)]
        return p, m, v, t, loss

    state = [params, [jnp.zeros_like(w) for w in params], [jnp.zeros_like(w) for w in params],
             jnp.float32(0)]

    def run():
        *new, loss = step(*state)
        state[:] = new
        loss.block_until_ready()
        return loss
    return run, lambda: float(run())


# -- the run ---------------------------------------------------------------------------------------

SIDES = {"vkml": vkml_side, "numpy": numpy_side, "torch": torch_side,
         "torch.compile": lambda name: torch_side(name, compiled=True), "jax.jit": jax_side}


def main():
    args = ARGS
    names = [n for n in args.only.split(",") if n]
    print(f"training steps -- {PINNED}")
    print(f"CPU: {cpu_model()}; numpy {np.__version__} with {blas()}")
    print(f"vkml: {vkml.backend_info()['backend']} tier, products: {vkml.backend_info()['products']}")
    rounds, reps = (3, 3) if args.quick else (5, 5)
    rows = []
    for name in names:
        sides, firsts = {}, {}
        for side, make in SIDES.items():
            try:
                t0 = time.perf_counter()
                run, first = make(name)
                firsts[side] = first()            # compiles (timed: first call)
                sides[side] = run
                print(f"  {name}: {side} ready in {time.perf_counter() - t0:.1f} s "
                      f"(first loss {firsts[side]:.5f})")
            except Exception as err:  # noqa: BLE001  (a missing or failing peer is said, not faked)
                print(f"  {name}: {side} skipped: {type(err).__name__}: {str(err)[:120]}")
        background.wait(120)                  # vkml times its optimised build (see backends.md)
        ref = firsts.get("vkml")
        for side, loss in firsts.items():
            assert ref is None or abs(loss - ref) <= 1e-3 * max(1.0, abs(ref)), \
                f"{name}: {side}'s first loss {loss} differs from vkml's {ref}"
        best = interleave({s: sampler(run, reps=reps) for s, run in sides.items()}, rounds=rounds)
        times = {s: secs[0] for s, secs in best.items()}
        peers = [s for s in times if s != "vkml"]
        fastest = min(peers, key=times.get) if peers else None
        rows.append((name, f"{times['vkml'] * 1e3:.2f} ms",
                     *[f"{times['vkml'] / times[p]:.2f}x" if p in times else "-"
                       for p in ("numpy", "torch", "torch.compile", "jax.jit")],
                     f"{times['vkml'] / times[fastest]:.2f}x ({fastest})" if fastest else "-"))
    head = ("step", "vkml", "/numpy", "/torch", "/torch.compile", "/jax.jit", "/best peer")
    print_rows(head, rows)
    print("  (vkml's time over each peer's: below 1 means vkml is faster)")


def ab_workloads(quick):
    """vkml's side of each step (``bench/ab.py``), on the cpu tier, built (its optimised build
    waited for) and warmed: name -> (phase names, sampler)."""
    vkml.set_backend("cpu")
    out = {}
    for name in ("mlp-256", "mlp-1024", "cnn", "strided-cnn", "transformer") if quick else STEPS:
        run, first = vkml_side(name)
        first()
        background.wait(120)
        run(), run()
        reps = 3 if name == "big-mlp" else 10 if quick else 20
        out[f"training step, {name}"] = (("step",), sampler(run, reps=reps))
    return out


if __name__ == "__main__":
    main()
