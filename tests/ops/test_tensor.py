"""The tensor layer: laziness, submissions, assign, eager mode, autograd semantics."""

import os
import subprocess
import sys

import numpy as np
import pytest

import vkml


def f32(*v):
    return np.array(v, dtype=np.float32)


def test_seed_example_and_accumulation():
    x = vkml.tensor(np.array([3.0], dtype=np.float32), requires_grad=True)
    vkml.backward(vkml.sum(vkml.mul(x, x)))
    g = x.grad.numpy()
    assert g.dtype == np.float32 and g.tolist() == [6.0]
    vkml.backward(vkml.sum(vkml.mul(x, x)))          # no zero_grad: gradients ACCUMULATE
    assert x.grad.numpy().tolist() == [12.0]
    x.zero_grad()
    (x * x).sum().backward()
    assert x.grad.numpy().tolist() == [6.0]


def test_ops_are_lazy_until_observed():
    a = vkml.tensor(f32(1, 2, 3))
    b = (a * 2 + 1).exp().sum()
    assert vkml.stats().submissions == 0
    assert b.ir_var.value is None
    assert b.item() == pytest.approx(np.exp([3, 5, 7]).sum(), rel=1e-6)
    assert vkml.stats().submissions == 1


def test_realize_many_is_one_submission_and_idempotent():
    a = vkml.tensor(f32(1, 2, 3))
    ts = [a + 1, a * 2, (a - 1).sum()]
    vkml.realize(ts)
    assert vkml.stats().submissions == 1
    vkml.realize(ts)
    vkml.realize(ts[0])
    assert vkml.stats().submissions == 1
    assert ts[0].numpy().tolist() == [2, 3, 4] and ts[2].item() == 3
    assert vkml.stats().submissions == 1


def test_assign_eight_pairs_is_one_submission():
    dsts = [vkml.tensor(np.zeros(3, np.float32)) for _ in range(8)]
    srcs = [vkml.tensor(f32(i, i, i)) * 2 for i in range(8)]
    vkml.reset_stats()
    vkml.assign(dsts, srcs)
    assert vkml.stats().submissions == 1
    for i, d in enumerate(dsts):
        assert d.numpy().tolist() == [2 * i] * 3
    assert vkml.stats().submissions == 1


def test_assign_sources_reading_destinations_see_old_values():
    a, b = vkml.tensor(f32(1)), vkml.tensor(f32(2))
    vkml.assign([a, b], [b, a])                       # a swap
    assert (a.item(), b.item()) == (2, 1)
    pending = a * 10                                  # reads a's current value lazily
    a.assign_(vkml.tensor(f32(5)))
    assert pending.item() == 20                       # the old value, not the new one
    assert a.item() == 5


def test_assign_refuses_bad_pairs_and_changes_nothing():
    a, b = vkml.tensor(f32(1, 2)), vkml.tensor(f32(3, 4))
    with pytest.raises(vkml.ShapeError, match="source 1 has shape"):
        vkml.assign([a, b], [vkml.tensor(f32(7, 7)), vkml.tensor(f32(1, 2, 3))])
    with pytest.raises(vkml.DTypeError, match="cast the source"):
        vkml.assign([a], [vkml.tensor(np.array([1, 2], dtype=np.int64))])
    with pytest.raises(vkml.ArgumentError):
        vkml.assign([a, b], [a])
    assert a.numpy().tolist() == [1, 2] and b.numpy().tolist() == [3, 4]


def test_numpy_returns_read_only_and_tensor_copies_input():
    src = np.array([1.0, 2.0])
    t = vkml.tensor(src)
    src[0] = 100
    assert t.numpy().tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        t.numpy()[0] = 5


def test_requires_grad_propagates_and_detach_stops_it():
    x = vkml.tensor(f32(1, 2), requires_grad=True)
    c = vkml.tensor(f32(3, 4))
    y = x * c
    assert y.requires_grad and not c.requires_grad
    z = y.detach()
    assert not z.requires_grad
    assert not (x > 1).requires_grad                  # bool results carry no gradient
    loss = (y.detach() * x).sum()                     # d/dx = y (held constant) = x*c
    loss.backward()
    assert x.grad.numpy().tolist() == [3, 8]
    with vkml.no_grad():
        assert not (x * 2).requires_grad


def test_backward_through_an_already_realized_intermediate():
    x = vkml.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * x
    assert h.numpy().tolist() == [1, 4]               # observed before backward
    (h * 3).sum().backward()
    assert x.grad.numpy().tolist() == [6, 12]


def test_backward_errors_change_nothing():
    x = vkml.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * x).sum().backward()
    before = x.grad.numpy().copy()
    with pytest.raises(vkml.GradError, match=r"0-d tensor, got shape \[2\]"):
        (x * x).backward()
    with pytest.raises(vkml.GradError, match="does not require grad"):
        vkml.tensor(np.array(1.0)).backward()
    with pytest.raises(vkml.GradError, match="only floating tensors"):
        vkml.tensor(np.array([1, 2]), requires_grad=True)
    with pytest.raises(vkml.ArgumentError):
        vkml.backward(np.float32(1.0))
    assert np.array_equal(x.grad.numpy(), before)
    assert x.numpy().tolist() == [1, 2]


def test_training_loop_compiles_once():
    rng = np.random.default_rng(0)
    w = vkml.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    data = [rng.normal(size=(8, 4)) for _ in range(20)]
    for i, xb in enumerate(data):
        w.zero_grad()
        loss = ((vkml.tensor(xb) @ w).tanh() ** 2).mean()
        loss.backward()
        with vkml.no_grad():
            w.assign_(w - 0.1 * w.grad)
        if i == 0:
            first = vkml.stats()
    after = vkml.stats()
    assert first.compiles == after.compiles           # steps 2..20 compile nothing
    assert after.cache_hits - first.cache_hits == 2 * 19
    assert after.submissions == 2 * 20


def test_eager_mode_flag_and_env():
    assert not vkml.is_eager()
    vkml.set_eager(True)
    assert vkml.is_eager()
    a = vkml.tensor(f32(1, 2))
    b = a + 1
    assert b.ir_var.value is not None                    # ran at once
    vkml.set_eager(False)
    with vkml.eager():
        assert vkml.is_eager()
    assert not vkml.is_eager()
    out = subprocess.run([sys.executable, "-c", "import vkml; print(vkml.is_eager())"],
                         env=dict(os.environ, VKML_EAGER="1"), capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_eager_error_names_the_op_at_the_line():
    vkml.set_eager(True)
    x = vkml.tensor(np.arange(5.0))
    with pytest.raises(vkml.ExecutionError, match=r"gather.*test_tensor\.py:\d+.*index 9 is out of range"):
        x[vkml.tensor(np.array([1, 9]))]


def test_lazy_error_at_realize_names_the_op_and_line():
    x = vkml.tensor(np.arange(5.0))
    y = x[vkml.tensor(np.array([1, 9]))] * 2          # nothing runs yet
    with pytest.raises(vkml.ExecutionError, match=r"gather.*test_tensor\.py:\d+.*out of range"):
        y.numpy()
    assert y.ir_var.value is None and x.numpy().tolist() == [0, 1, 2, 3, 4]


def test_stats_reset_and_snapshot_difference():
    a = vkml.tensor(f32(1))
    (a + 1).numpy()
    s0 = vkml.stats()
    (a + 2).numpy()
    d = vkml.stats() - s0
    assert d.submissions == 1 and d.cache_hits == 1 and d.compiles == 0
    vkml.reset_stats()
    assert vkml.stats().submissions == 0


def test_python_scalars_are_inputs_not_program_constants():
    a = vkml.tensor(f32(1, 2))
    assert (a * 7.0).numpy().tolist() == [7, 14]
    before = vkml.stats()
    for k in range(5):
        assert (a * float(k)).numpy().tolist() == [k, 2 * k]
    d = vkml.stats() - before
    assert d.compiles == 0 and d.cache_hits == 5


def test_repr_and_item():
    t = vkml.tensor(np.array([1.5, 2.0], dtype=np.float32), requires_grad=True)
    assert repr(t) == "tensor([1.5, 2. ], dtype=float32, requires_grad=True)"
    assert vkml.tensor(3.0).item() == 3.0
    with pytest.raises(vkml.ShapeError, match="one element"):
        t.item()
