"""Bad ``make()`` functions and bad counts on a LocalCluster: refused, named, and harmless.

A forward whose ``make(planes)`` raises ``SystemExit``/``KeyboardInterrupt``/an error, or returns
the wrong thing (a graph of another size, something that is no graph) in one block, chosen at
random, must end the launch with a ``VkmlError`` that names the block, leave the previous launch
current (its generation, Record and planes), and leave the cluster with all its workers: the next
good launch gives the same bits as one process.  Also: ``local()`` refuses counts the machine
cannot hold, and works with ``processes=False``.
"""

import random
import sys
from pathlib import Path

import numpy as np
import pytest

import vkml

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import vkml.distributed as vd  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])    # the workers cannot import this file

pytestmark = pytest.mark.timeout(600)

N = 600


@vkml.kernel
def wave(u, k: vkml.Param):
    return {"y": vkml.sin(k * u) * u}


def make_good(planes):
    g = vkml.Graph()
    g.add(wave.bind(u=planes["u"], y=np.zeros_like(planes["u"]), k=1.3), name="wave")
    return g


class BadMake:
    """``make`` that misbehaves (``how``) in the block holding sample ``bad``, while the file
    ``switch`` exists (the workers share the file system, not this process's memory)."""

    def __init__(self, how, bad, switch):
        self.how, self.bad, self.switch = how, bad, str(switch)

    def __call__(self, planes):
        ids = planes["i"]
        if Path(self.switch).exists() and ids[0] <= self.bad <= ids[-1]:
            if self.how == "SystemExit":
                raise SystemExit(3)
            if self.how == "KeyboardInterrupt":
                raise KeyboardInterrupt
            if self.how == "ValueError":
                raise ValueError("a user's bug")
            if self.how == "seven samples":
                return make_good({"u": np.zeros(7)})
            if self.how == "not a graph":
                return {"u": planes["u"]}
        return make_good(planes)


HOW = ["SystemExit", "KeyboardInterrupt", "ValueError", "seven samples", "not a graph"]


@pytest.fixture(scope="module", params=[True, False], ids=["processes", "threads"])
def client(request):
    c = vd.local(n_workers=2, processes=request.param, dashboard=False)
    yield c
    c.shutdown()
    c.close()


def test_bad_make_functions_are_refused_by_block_and_change_nothing(client, tmp_path):
    rng = random.Random(11)
    switch = tmp_path / "misbehave"
    u = np.linspace(-1.0, 1.0, N)
    planes = {"u": u, "i": np.arange(N, dtype=np.int64)}
    one = make_good({"u": u.copy()}).build(record=True)
    one.launch()
    want = vkml.diff.reverse(one.record, {"wave.y": np.ones(N)})
    workers = len(client.scheduler_info()["workers"])
    for trial in range(8):
        how, bad = rng.choice(HOW), rng.randrange(N)
        sg = vd.Sharded(BadMake(how, bad, switch), planes, client=client, record=True, block=128)
        sg.launch()                                    # a good launch first: the current one
        first = sg.reverse({"y": np.ones(N)})
        y_before = np.asarray(sg.plane("y")).copy()
        switch.touch()
        start = bad // 128 * 128
        with pytest.raises(vkml.VkmlError, match=rf"samples \[{start}, {min(start + 128, N)}\)"):
            sg.launch()
        switch.unlink()
        assert sg.generation == 1, how
        assert np.asarray(sg.plane("y")).tobytes() == y_before.tobytes(), how
        sg.launch()                                    # the cluster still works, same bits
        got = sg.reverse({"y": np.ones(N)})
        for grads in (first, got):
            assert np.asarray(grads["u"]).tobytes() == want["u"].tobytes(), how
            assert np.asarray(grads["k"]).tobytes() == want["k"].tobytes(), how
        assert len(client.scheduler_info()["workers"]) == workers, f"{how}: a worker was lost"


@pytest.mark.parametrize("kwargs", [dict(n_workers=2 ** 70), dict(threads_per_worker=2 ** 40),
                                    dict(n_workers=0), dict(n_workers=64, threads_per_worker=64)])
def test_local_refuses_counts_the_machine_cannot_hold(kwargs):
    with pytest.raises(vkml.ArgumentError, match="vkml.distributed.local"):
        vd.local(**kwargs)
