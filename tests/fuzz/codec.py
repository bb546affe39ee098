"""NumPy arrays as JSON (dtype, shape, base64 bytes): how cases and results cross the worker's pipe."""

import base64

import numpy as np


def encode(array) -> dict:
    a = np.ascontiguousarray(array)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def decode(blob) -> np.ndarray:
    raw = base64.b64decode(blob["data"])
    return np.frombuffer(raw, dtype=np.dtype(blob["dtype"])).reshape(blob["shape"]).copy()


def describe(blob, limit=12) -> str:
    """A short readable form of an encoded array, for failure messages."""
    a = decode(blob)
    text = np.array2string(a.reshape(-1)[:limit], separator=", ")
    more = "..." if a.size > limit else ""
    return f"np.array({text}{more}, dtype={a.dtype.name}).reshape({tuple(a.shape)})"
