"""Sizes too big to allocate: each must be refused with a ``vkml.VkmlError`` (run in the worker,
whose address space is limited, so an attempt to allocate fails at once instead of swapping)."""

import os


def _vk():
    import vkml
    return vkml


def _huge_temporary():
    vkml = _vk()
    z = vkml.exp(vkml.broadcast_to(vkml.tensor(1.0), (10 ** 5, 10 ** 5)))
    return vkml.sum(z * z)          # z read twice: a stored temporary of 10^10 floats


def _jitted_broadcast():
    vkml = _vk()
    return vkml.jit(lambda x: vkml.broadcast_to(x, (10 ** 5, 10 ** 5)) * 2.0)(vkml.tensor(1.0))


#: name -> a call that asks for far more memory than there is
CASES = {
    "zeros of 2**40 elements": lambda: _vk().zeros((2 ** 40,)),
    "full of 10**12 elements": lambda: _vk().full((10 ** 6, 10 ** 6), 1.0),
    "zeros whose size overflows int64": lambda: _vk().zeros((2 ** 40, 2 ** 40)),
    "arange of 10**12 elements": lambda: _vk().arange(10 ** 12),
    "broadcast then add, 10**10 results": lambda: _vk().broadcast_to(_vk().tensor(1.0), (10 ** 5, 10 ** 5)) + 1.0,
    "broadcast to a size that overflows int64": lambda: _vk().broadcast_to(_vk().tensor(1.0), (2 ** 62, 2 ** 62)) + 1.0,
    "a huge temporary, a scalar result": _huge_temporary,
    "jit of a huge broadcast": _jitted_broadcast,
    "pad by 10**10": lambda: _vk().pad(_vk().ones(3), (10 ** 10,), (0,)),
    "sum of an empty axis into a huge result": lambda: _vk().sum(_vk().zeros((0,)).reshape((0, 2 ** 31, 2 ** 31)), 0),
}


def run(args) -> dict:
    """Make the call ``args["case"]`` on ``args["backend"]`` (the cpu tier compiling at once)."""
    vkml = _vk()
    os.environ["VKML_CPU_HOT"] = "0"
    vkml.set_backend(args["backend"])
    try:
        out = CASES[args["case"]]()
        if isinstance(out, vkml.Tensor):
            out.numpy()
        return {"error": None}
    except vkml.VkmlError as err:
        return {"error": type(err).__name__, "vkml": True, "message": str(err)[:200]}
    except Exception as err:      # noqa: BLE001 -- a leak is what this looks for
        return {"error": type(err).__name__, "vkml": False, "message": str(err)[:200]}
    finally:
        vkml.set_backend("numpy")
