"""Long runs: a step kernel iterated per sample, and its checkpointed reverse.

``simulation(step, max_steps=..., record=True, window=..., memory_budget=..., **planes)``
runs ``step`` (a kernel updating its state planes in place, e.g. ``theta``
bound as input and output) until every sample has returned
``terminated=True`` or ``max_steps`` steps (at most ``MAX_STEPS``, 2**40)
have run; each sample stops at its own step (``record.steps``).
``until_done([node, step], ...)`` also runs
a user model node (``vkml.graph.opaque``) before the kernel on every step.

A recorded run keeps the state at the start of every ``window`` steps.  The
reverse works one window at a time from the last: it recomputes the
window's states from its checkpoint and steps the adjoint back through
them, so a sample holds about ``ceil(max_steps / window) + window`` states
(default window ``clamp(ceil(sqrt(max_steps)), 16, 1024)``; ``"full"`` keeps
every state and recomputes nothing; ``"binomial"`` keeps the initial state, the
state before the last step and ``snapshots`` checkpoints placed by Griewank's
binomial rule (Revolve), recomputing the fewest steps any schedule holding
those states can).  Each choice is a schedule object (``sim.schedule``, see
``schedules.py``) that says which states the run stores, how the reverse
rebuilds the others, and predicts the reverse's ``recomputed_steps`` and
``peak_states``.

``memory_budget`` (bytes) caps what the reverse holds: when the batch does
not fit, it runs in passes of ``256 * 2**q`` aligned samples, the largest
that fits, and combines the passes' Param sums with the canonical tree --
they are subtrees of the one-pass tree, so the bits do not depend on the
budget.  Its default is half the free memory where the Record lives: the
GPU's on the cuda backend (see below), else half the available host RAM.

On the cuda backend a simulation the per-sample loops cover (one kernel, the
window schedule) lives in device memory: its planes are copied to the GPU
once, when the simulation is made (a NumPy array; a device array --
anything with ``__cuda_array_interface__``, such as a CuPy array -- is used
as it is, without a copy), and ``sim.planes[name]`` is the device plane (read
it on the host explicitly: ``.numpy()`` or ``np.asarray``; the NumPy array
passed in is not updated).  ``run()`` and the reverse are one kernel each
(``backends/cuda_loops.py``); the Record's checkpoints, step counts and the
gradients are device arrays (Param gradients are summed on the GPU with the
canonical tree and come back as NumPy values); no plane crosses PCIe.  A
budget's passes read their samples of every plane through views (pointer
offsets, no copy) and of the checkpoints through one device-to-device copy
per window.

A simulation stepped from the host (model nodes, the ``"full"`` and
``"binomial"`` schedules, a step the loops do not cover) lives in device
memory as well (``device_steps.py``): each step is one program on
device arrays in and out -- the state, the per-sample step counts and
"stopped" flags, the checkpoints (a stored state is the step's own output,
never written again: only the initial state is copied, on the device) and,
in the reverse, the adjoints and the per-sample Param sums.  A step sends its
pointer table and its small arguments (Param values, the step's index) and
reads back its status words and, forward, one word saying whether any sample
still runs; the reverse first finds the longest and fewest steps on the
device (two words).  A model node runs user Python on host values: the planes
it reads are copied to the host and those it writes to the device on every
step, and in the reverse the adjoints its vjp reads and adds to, explicitly.
Device arrays are taken as planes here too, and a failing run writes no
plane.

How a simulation runs is one *stepper*, chosen once when it is made (``stepper_for``), each in a
module of its own, lowest first:

- ``schedules``, ``checks``, ``record``: the checkpoint schedules, the checks of the arguments,
  the ``SimulationRecord``;
- ``host_steps``: stepped from the host on NumPy arrays (the NumPy backend; model nodes; the
  ``"full"`` and ``"binomial"`` schedules) -- the base the others build on;
- ``compiled_loops``: every step of every sample in one call of the cpu tier's loops;
- ``device_programs``, ``device_loops``, ``device_steps``: on the cuda backend, the GPU's loops,
  or steps from the host on device arrays;
- ``simulation``: ``Simulation`` itself, ``simulation`` and ``until_done``.
"""

from .checks import MAX_STEPS
from .record import SimulationRecord, available_memory
from .schedules import Binomial, Full, Window, binomial_cost, default_window
from .simulation import Simulation, simulation, until_done

__all__ = ["Simulation", "SimulationRecord", "simulation", "until_done", "available_memory",
           "MAX_STEPS", "Binomial", "Full", "Window", "binomial_cost", "default_window"]
