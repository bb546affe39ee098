"""The errors vkml raises.

Every refusal is a subclass of :class:`VkmlError`, and also of the builtin
exception a Python user would expect (``ValueError`` for a wrong shape,
``TypeError`` for a wrong kind of argument, ...), so ``except ValueError``
keeps working.  Messages name the op, node or plane and say what to do
instead; a refused call changes nothing.
"""


class VkmlError(Exception):
    """Base class of every error vkml raises on purpose."""


class ShapeError(VkmlError, ValueError):
    """Operands whose shapes do not fit the op."""


class IndexOutOfRangeError(ShapeError, IndexError):
    """An index past the end of an axis; an IndexError too, so ``for row in t`` stops there."""


class DTypeError(VkmlError, TypeError):
    """An operand of a dtype the op does not accept."""


class ArgumentError(VkmlError, TypeError):
    """An argument of the wrong kind (not an array, not a tensor, ...)."""


class GradError(VkmlError, RuntimeError):
    """A derivative that cannot be taken as asked (non-scalar root, integer input, ...)."""


class ExecutionError(VkmlError, RuntimeError):
    """An op that failed while its program ran (e.g. a gather index out of range)."""


class TracingError(VkmlError, TypeError):
    """A traced value used where a concrete one is needed (Python ``if``, ``bool()``)."""


class BackendError(VkmlError, RuntimeError):
    """A backend that is unknown or cannot run here."""


class RecordError(VkmlError, RuntimeError):
    """A Record used against its rules: live when a new recording launch comes, stale, ..."""


class RefusedError(VkmlError, RuntimeError):
    """A reverse that cannot be taken (an opaque node, a max reduction, second order, ...)."""


class BudgetError(VkmlError, ValueError):
    """A memory budget that cannot hold what a checkpointed reverse needs."""


class Busy(VkmlError, RuntimeError):
    """A launch while a reverse reads the Record, or one Reverse used by two threads at once."""


class VkmlWarning(UserWarning):
    """A result vkml returns but doubts, e.g. a ``while_loop`` cut off at ``max_iters`` while its
    condition still held.  Turn it into an error with ``warnings.simplefilter("error", VkmlWarning)``."""
