"""What a simulation checks before it runs or reverses anything: its arguments, its step, the
seeds and names of a reverse.

Each check refuses bad input with a :class:`vkml.VkmlError` that names the argument and says
what to pass instead, before anything is changed.  The checks run in a fixed order, so the
same mistake always gets the same message.  ``simulation.py`` keeps the stepping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ... import backends
from ...errors import ArgumentError, DTypeError, RefusedError, ShapeError
from ...validate import check_int
from ..diff import seed_array
from ..nodes import Opaque
from ..kernel import Kernel, Launch
from .schedules import NAMED, default_window

#: The most steps a simulation takes (2**40, about 10**12): more than any run finishes, so a
#: larger max_steps is a mistake, refused rather than left running for ever.
MAX_STEPS = 2 ** 40


def positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 1


def check_arguments(step, *, max_steps, record, window, memory_budget, snapshots, steps_per_launch,
                    events, progress, bindings):
    """Every argument of ``vkml.simulation``, checked: ``(launch, nodes, state, window)`` -- the
    bound step kernel, the model nodes run before it, the names of the state planes it updates in
    place and the window (the default where none was given)."""
    if events is not None:
        raise RefusedError("simulation: events= (event refinement) is not supported by vkml; "
                           "detect crossings inside the step kernel with vkml.where instead")
    if not positive_int(max_steps):
        raise ArgumentError(f"simulation: max_steps must be a positive int, got {max_steps!r}")
    check_int(max_steps, "max_steps", "simulation", high=MAX_STEPS)
    check_options(record, memory_budget, snapshots, steps_per_launch, progress)
    if not record and (window is not None or memory_budget is not None):
        raise ArgumentError("simulation: window= and memory_budget= apply to a recorded run; "
                            "pass record=True (or leave them out)")
    kernel, nodes = split_step(step, record, steps_per_launch)
    launch = kernel if isinstance(kernel, Launch) else kernel.bind(**bindings)
    if isinstance(kernel, Launch) and bindings:
        raise ArgumentError("simulation: the kernel is already bound; do not pass planes again")
    if record:
        for node in nodes:
            if any(name in launch.params for name in node.reads):
                raise RefusedError(f"simulation: node {node.name!r} reads a Param; a recorded "
                                   "node reads planes only")
    state = [n for n in launch.kernel.inputs if n in launch.writes and
             launch.reads[n] is launch.writes[n]]
    if not state:
        raise ArgumentError(f"simulation: {launch.kernel.name} updates no state plane in place; bind "
                            "a plane as both an input and an output of the same name (theta=theta)")
    if window is None:
        window = default_window(max_steps)
    if not (isinstance(window, str) and window in NAMED) and not positive_int(window):
        raise ArgumentError(f"simulation: window must be a positive int, 'full' or 'binomial', got "
                            f"{window!r}")
    return launch, nodes, state, window


def split_step(step, record, steps_per_launch):
    """A step (one kernel, or a list of opaque nodes and one kernel) as ``(kernel, nodes)``;
    refused where a recorded run could not reverse it."""
    parts = list(step) if isinstance(step, (list, tuple)) else [step]
    kernels = [p for p in parts if isinstance(p, (Kernel, Launch))]
    nodes = [p for p in parts if isinstance(p, Opaque)]
    others = [p for p in parts if not isinstance(p, (Kernel, Launch, Opaque))]
    if others:
        raise ArgumentError(f"simulation: a step is kernels and opaque nodes, got "
                            f"{type(others[0]).__name__}")
    if len(kernels) != 1:
        if record:
            names = [(k.kernel if isinstance(k, Launch) else k).name for k in kernels]
            raise RefusedError(f"simulation: a record=True run of a step made of {len(kernels)} "
                               f"kernels {names} cannot be reversed; record one kernel per step "
                               "(fuse them into one kernel)")
        raise ArgumentError("simulation: give exactly one step kernel")
    if steps_per_launch != 1 and record:
        raise RefusedError("simulation: a record=True run of a kernel taking several steps per "
                           "launch cannot be reversed; record one kernel step per launch "
                           "(steps_per_launch=1)")
    if record and parts and isinstance(parts[-1], Opaque):
        raise RefusedError(f"simulation: node {parts[-1].name!r} comes after the kernel; a recorded "
                           "step runs its nodes before the kernel: put the node first")
    if record:
        written = set()
        for node in nodes:
            if any(id(p) in written for p in node.reads.values()):
                raise RefusedError(f"simulation: node {node.name!r} reads a plane another node writes; "
                                   "in a recorded step each node reads only the kernel's planes")
            written.update(id(p) for p in node.writes.values())
    return kernels[0], nodes


def check_options(record, memory_budget, snapshots, steps_per_launch, progress):
    """The simulation's keyword options, each of the right kind and range."""
    if not isinstance(record, (bool, np.bool_)):
        raise ArgumentError(f"simulation: record must be True or False, got {record!r}")
    if memory_budget is not None and (not isinstance(memory_budget, (int, float, np.integer, np.floating))
                                      or isinstance(memory_budget, (bool, np.bool_))
                                      or not math.isfinite(memory_budget) or memory_budget <= 0):
        raise ArgumentError(f"simulation: memory_budget must be a positive number of bytes, got "
                            f"{memory_budget!r}")
    if snapshots is not None and (not isinstance(snapshots, (int, np.integer)) or
                                  isinstance(snapshots, (bool, np.bool_)) or snapshots < 0):
        raise ArgumentError(f"simulation: snapshots must be a whole number >= 0 (with "
                            f"window='binomial'), got {snapshots!r}")
    if not positive_int(steps_per_launch):
        raise ArgumentError(f"simulation: steps_per_launch must be a positive int, got "
                            f"{steps_per_launch!r}")
    if progress is not None and not isinstance(progress, (bool, np.bool_)):
        raise ArgumentError(f"simulation: progress must be True, False or None, got {progress!r}")


# -- a reverse's arguments ------------------------------------------------------------------------

def check_wrt(sim, wrt, bitwise, strict):
    """``wrt`` (names, checked by the caller) names inputs, Params or state planes of the step;
    ``strict`` refuses the gradients among them that are not bitwise."""
    kern = sim.launch.kernel
    if wrt is not None:
        unknown = [w for w in wrt if w not in bitwise and w not in sim.state]
        if unknown:
            raise ArgumentError(f"reverse: wrt names {unknown} are not inputs or Params of "
                                f"{kern.name}; choose from {sorted(bitwise)}")
    if strict:
        bad = [k for k, ok in bitwise.items() if not ok and (wrt is None or k in wrt)]
        if bad:
            raise RefusedError(f"reverse(strict=True): the gradients of {bad} in "
                               f"{kern.name} are scatter-adds across samples (a "
                               "table read by index), which are not bitwise; pass strict=False, "
                               "or leave them out by naming only the other inputs in wrt")


def check_seeds(seeds):
    if not isinstance(seeds, Mapping):
        raise ArgumentError(f"seeds must be a dict of state plane name -> per-sample seed, got "
                            f"{type(seeds).__name__}")


def seed_cotangents(sim, seeds):
    """The seeds as the final state's cotangents, ``{state plane name: array}``; a seed of
    anything but the final state is refused saying what it is."""
    launch = sim.launch
    ct0 = {}
    for name, seed in seeds.items():
        if not isinstance(name, str):
            raise ArgumentError(f"seed names are state plane names (strings), got {name!r}")
        by_node = [node.name for node in sim.nodes if name in node.writes]
        if by_node:
            raise ArgumentError(f"seed {name!r}: node {by_node[0]!r} writes that plane on every "
                                f"step; only the final state {sim.state} can be seeded")
        if name in sim.state or name in launch.out_names:
            plane = launch.writes.get(name)
        elif name in launch.reads or name in launch.params:
            raise ArgumentError(f"seed {name!r}: that is an input of the simulation, not part of its "
                                f"final state; its gradient is grads[{name!r}]")
        else:
            raise ArgumentError(f"seed {name!r}: the simulation's state planes are {sim.state}")
        if name not in sim.state:
            raise ArgumentError(f"seed {name!r}: only the final state {sim.state} can be seeded")
        ct0[name] = device_seed(name, seed, plane) if sim.on_device else \
            seed_array(name, seed, plane).astype(plane.dtype)
    return ct0


def device_seed(name, seed, plane):
    """A seed as a device plane of ``plane``'s shape and dtype: a device array as it is (no copy;
    refused unless of the plane's dtype: converting it would be a copy), anything else checked
    as on the host and copied to the device once."""
    backend = backends.current()
    if not hasattr(seed, "__cuda_array_interface__"):
        return backend.to_plane(seed_array(name, seed, plane).astype(plane.dtype))
    got = backend.to_plane(seed)
    if tuple(got.shape) != plane.shape:
        raise ShapeError(f"seed {name!r} has shape {tuple(got.shape)}, but plane {name!r} holds one "
                         f"value per sample, {plane.shape}; pass one seed per sample")
    if got.dtype != plane.dtype:
        raise DTypeError(f"seed {name!r} is a device array of {got.dtype}, but plane {name!r} holds "
                         f"{plane.dtype}; pass a seed of {plane.dtype} (a device array is not "
                         "converted: that would be a copy)")
    return got
