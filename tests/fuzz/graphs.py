"""Random graphs of kernels over random planes, launched and reversed on NumPy and on the cpu tier.

A case names the number of samples, the planes' dtype, how each plane is
viewed (planes are the user's own arrays, written in place, so a reversed or
strided view is something the launch must write through correctly), the
Param ``k`` and the seed.  :func:`run_graph_case` (in the worker) builds the
graph ``x -> square -> u -> wave(k) -> y`` on fresh copies of the planes,
launches it with a Record, reverses it, and returns the planes and gradients.
"""

from __future__ import annotations

import numpy as np

from .codec import decode, encode

_KERNELS = {}


def _kernels():
    import vkml
    if not _KERNELS:
        @vkml.kernel
        def square(x):
            return {"u": x * x}

        @vkml.kernel
        def wave(u, k: vkml.Param):
            return {"y": vkml.sin(k * u) * u}
        _KERNELS.update(square=square, wave=wave)
    return _KERNELS


def plane(n, dtype, view, fill=None):
    """A plane of ``n`` rows, as a view of a larger base array when ``view`` says so."""
    base_n = 2 * n if view == "step" else n
    base = np.zeros(base_n, dtype) if fill is None else np.resize(np.asarray(fill, dtype), base_n)
    if view == "rev":
        return base[::-1]
    if view == "step":
        return base[::2]
    return base


def run_graph_case(case) -> dict:
    import vkml
    out = {}
    for backend in ("numpy", "cpu"):
        vkml.set_backend(backend)
        try:
            k = _kernels()
            n, dtype, views = case["n"], case["dtype"], case["views"]
            x = plane(n, dtype, views["x"], fill=decode(case["x"]))
            u, y = plane(n, dtype, views["u"]), plane(n, dtype, views["y"])
            g = (vkml.Graph().add(k["square"].bind(x=x, u=u), name="square")
                 .add(k["wave"].bind(u=u, k=np.asarray(case["k"], dtype), y=y), name="wave")
                 .build(record=True))
            g.launch()
            grads = vkml.diff.reverse(g.record, {"wave.y": np.full(n, case["seed"], dtype)})
            out[backend] = {"u": encode(u), "y": encode(y), "x_bar": encode(grads["x"]),
                            "k_bar": encode(np.asarray(grads["k"]))}
        except Exception as err:     # noqa: BLE001 -- compared between the backends
            out[backend] = {"error": type(err).__name__, "message": str(err)[:300]}
        finally:
            vkml.set_backend("numpy")
    return out


def compare(result) -> list:
    """Disagreements: u bit for bit (a product), y and the gradients within a few ulps
    (sin and cos come from libm on the cpu tier)."""
    a, b = result["numpy"], result["cpu"]
    if "error" in a or "error" in b:
        return [] if a.get("error") == b.get("error") else [f"NumPy: {a}, cpu: {b}"]
    problems = []
    for name in ("u", "y", "x_bar", "k_bar"):
        want, got = decode(a[name]), decode(b[name])
        if want.shape != got.shape or want.dtype != got.dtype:
            problems.append(f"{name}: {want.dtype}{want.shape} vs {got.dtype}{got.shape}")
            continue
        if name == "u":
            same = np.array_equal(want, got, equal_nan=True)
        else:
            eps = float(np.finfo(want.dtype).eps) if want.dtype.kind == "f" else 0.0
            scale = np.maximum(np.abs(want.astype(np.float64)), 1.0) * (
                want.size if name == "k_bar" else 1)
            same = bool(np.all((np.abs(want.astype(np.float64) - got) <= 64 * eps * scale) |
                               (np.isnan(want) & np.isnan(got)) | (want == got)))
        if not same:
            problems.append(f"{name}: NumPy {want[:6]} vs cpu {got[:6]}")
    return problems
