"""Convolution and pooling, composed from other operations rather than primitive, and why:

- ``conv2d`` = pad + one strided slice per kernel tap + concatenate + matmul
  (im2col).  A kernel of k*k taps costs k*k slices, all movement ops whose
  transposes are pads, so its backward is a handful of matmuls and pads; a
  dedicated primitive would need its own backward kernels, which the design
  rule forbids unless a derivative cannot be composed.
- ``max_pool2d``/``avg_pool2d`` = reshape + reduce_max/sum for
  non-overlapping windows, strided slices + max otherwise.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, ShapeError
from ..validate import check_int, check_sequence, describe
from .operands import as_floating, as_var, constant, promote
from .api import (MAX_PAD, add, concatenate, matmul, max, mean, pad, reshape, slice, stack,
    transpose, where)


def _pair(v, name, op, lowest):
    """An int or a pair of ints (each at least ``lowest``) as a pair: a window, stride or padding."""
    items = [v, v] if hasattr(v, "__index__") and not isinstance(v, np.ndarray) else \
        check_sequence(v, name, op)
    if len(items) != 2:
        raise ArgumentError(f"{op}: {name} must be an int or a pair of ints, got {describe(v)}")
    return tuple(check_int(i, name, op, low=lowest, high=MAX_PAD, error=ShapeError) for i in items)


def _windows(x, kh, kw, sh, sw, dh=1, dw=1):
    """Every (i, j) kernel tap of x (N, C, H, W) as a strided slice (N, C, Ho, Wo); taps
    ``dh``/``dw`` apart (a dilated kernel)."""
    n, c, h, w = x.shape
    ho, wo = (h - (kh - 1) * dh - 1) // sh + 1, (w - (kw - 1) * dw - 1) // sw + 1
    taps = []
    for i in range(0, kh * dh, dh):
        for j in range(0, kw * dw, dw):
            taps.append(slice(x, (0, 0, i, j), (n, c, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1),
                              (1, 1, sh, sw)))
    return taps, ho, wo


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation, NCHW input, (O, C / groups, kh, kw) weight, as
    torch.nn.functional.conv2d (``dilation`` spaces the kernel's taps; ``groups`` splits the
    channels into that many independent convolutions).

    >>> x = vkml.ones((1, 1, 3, 3))
    >>> w = vkml.ones((1, 1, 2, 2))
    >>> vkml.conv2d(x, w).shape
    (1, 1, 2, 2)
    >>> vkml.conv2d(x, w)[0, 0]
    tensor([[4., 4.],
            [4., 4.]], dtype=float32)
    """
    x, weight = promote(x, weight)
    if x.ndim != 4 or weight.ndim != 4:
        raise ShapeError(f"conv2d: needs a 4-D input (N, C, H, W) and a 4-D weight (O, C, kh, kw), "
                         f"got {x.shape} and {weight.shape}")
    n, c, h, w = x.shape
    o, c2, kh, kw = weight.shape
    groups = check_int(groups, "groups", "conv2d", low=1)
    if c % groups or o % groups:
        raise ShapeError(f"conv2d: groups={groups} must divide the input's {c} channels and the "
                         f"weight's {o} outputs; choose a common divisor")
    if c // groups != c2:
        hint = f" per group ({c} / groups={groups})" if groups > 1 else ""
        raise ShapeError(f"conv2d: input has {c // groups} channels{hint} but the weight expects "
                         f"{c2}; the weight's second axis must be the input's channels / groups")
    sh, sw = _pair(stride, "stride", "conv2d", 1)
    ph, pw = _pair(padding, "padding", "conv2d", 0)
    dh, dw = _pair(dilation, "dilation", "conv2d", 1)
    if ph or pw:
        x = pad(x, (0, 0, ph, pw), (0, 0, ph, pw))
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if x.shape[2] < span_h or x.shape[3] < span_w:
        raise ShapeError(f"conv2d: kernel {kh}x{kw} (spanning {span_h}x{span_w} with dilation) is "
                         f"larger than the padded input {x.shape[2:]}; pad the input or use a "
                         "smaller kernel")
    if groups > 1:
        per_in, per_out = c // groups, o // groups
        outs = [conv2d(slice(x, (0, g * per_in, 0, 0), (n, (g + 1) * per_in) + x.shape[2:]),
                       slice(weight, (g * per_out, 0, 0, 0), ((g + 1) * per_out,) + weight.shape[1:]),
                       None, (sh, sw), 0, (dh, dw)) for g in range(groups)]
        out = concatenate(outs, 1)
        return out if bias is None else add(out, reshape(as_var(bias), (1, o, 1, 1)))
    taps, ho, wo = _windows(x, kh, kw, sh, sw, dh, dw)
    # the columns (C*kh*kw, N*Ho*Wo): a row per (channel, tap), the whole batch's pixels along
    # it, so that the convolution is one product with the weight as it is stored, (O, C*kh*kw)
    # -- and its gradients one product each (the weight's summed over every pixel of the batch
    # in k order), where a product per image would read the weight once per image and sum the
    # images' weight gradients afterwards
    # (each window kept 4-D until stored: its rows are read and written at unit stride, where
    # merging its pixels first would divide every index by the row's width)
    cols = stack([transpose(t, (1, 0, 2, 3)) for t in taps], axis=1)  # (C, taps, N, Ho, Wo)
    cols = reshape(cols, (c * kh * kw, n * ho * wo))
    out = matmul(reshape(weight, (o, c * kh * kw)), cols)              # (O, N*Ho*Wo)
    out = transpose(reshape(out, (o, n, ho, wo)), (1, 0, 2, 3))
    if bias is not None:
        out = add(out, reshape(as_var(bias), (1, o, 1, 1)))
    return out


def _pool(x, kernel_size, stride, op, padding=0, fill=0.0, name="pool2d"):
    x = as_var(x)
    if x.ndim != 4:
        raise ShapeError(f"{name}: needs a 4-D input (N, C, H, W), got {x.shape}")
    kh, kw = _pair(kernel_size, "kernel_size", name, 1)
    sh, sw = _pair(stride if stride is not None else (kh, kw), "stride", name, 1)
    ph, pw = _pair(padding, "padding", name, 0)
    if ph > kh // 2 or pw > kw // 2:
        raise ShapeError(f"{name}: padding ({ph}, {pw}) must be at most half the window "
                         f"({kh}, {kw}), as in PyTorch; use a larger window or less padding")
    if ph or pw:            # the border: -inf for a maximum (never picked), 0 for a mean
        h0, w0 = x.shape[2:]
        x = pad(x, (0, 0, ph, pw), (0, 0, ph, pw))
        if fill:
            border = np.ones(x.shape[2:], bool)
            border[ph:ph + h0, pw:pw + w0] = False
            x = where(constant(border), fill, x)
    n, c, h, w = x.shape
    if h < kh or w < kw:
        raise ShapeError(f"{name}: window {kh}x{kw} is larger than the input {x.shape[2:]} "
                         "(padded); use a smaller kernel_size or pad the input")
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    if (sh, sw) == (kh, kw):
        # non-overlapping windows: crop, then one reshape and one reduction
        x = slice(x, (0, 0, 0, 0), (n, c, ho * kh, wo * kw))
        return op(reshape(x, (n, c, ho, kh, wo, kw)), (3, 5))
    taps, _, _ = _windows(x, kh, kw, sh, sw)
    return op(stack(taps, axis=-1), (4,))


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """The maximum over (kh, kw) windows of NCHW input (``stride`` defaults to the window;
    ``padding`` adds a border that is never the maximum).

    >>> x = vkml.reshape(vkml.arange(16.0), (1, 1, 4, 4))
    >>> vkml.max_pool2d(x, 2)[0, 0]
    tensor([[ 5.,  7.],
            [13., 15.]], dtype=float64)
    """
    x = as_var(x)
    fill = -np.inf if x.dtype.kind == "f" else int(np.iinfo(x.dtype).min) if x.dtype.kind in "iu" else 0
    return _pool(x, kernel_size, stride, lambda v, axes: max(v, axes), padding, fill, "max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """The mean over (kh, kw) windows of NCHW input (``stride`` defaults to the window; a
    ``padding`` border of zeros counts in the mean, as PyTorch's default).

    >>> x = vkml.reshape(vkml.arange(16.0), (1, 1, 4, 4))
    >>> vkml.avg_pool2d(x, 2)[0, 0]
    tensor([[ 2.5,  4.5],
            [10.5, 12.5]], dtype=float64)
    """
    return _pool(as_floating(x), kernel_size, stride, lambda v, axes: mean(v, axes), padding, 0.0,
                 "avg_pool2d")
