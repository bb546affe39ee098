"""The interface a forward run offers its reverse: what ``vkml.diff.Reverse`` calls.

A :class:`~vkml.graph.Graph`, a simulation and a sharded graph record their runs in different ways
(a tape of plane versions; checkpointed states; blocks on a cluster) and reverse them in different
ways (one sweep over the tape; windows recomputed from checkpoints; a task per block), but a
``Reverse`` treats them alike.  It asks the forward once whether it can be reversed with the given
vjps; then, for each Record, it

1. has the forward check the call (``prepare_reverse``: the Record is its own and current, the
   seeds and ``wrt`` make sense) before anything is locked or read;
2. takes its own lock (one call of a Reverse at a time: another thread gets ``Busy``);
3. registers as a reader of the Record (``reading``), so no launch or run overwrites what it reads
   until it is done;
4. has the forward sweep the Record backwards (``sweep``) into its gradients,
5. and marks the Record reversed.

So the locking and the reader count are written once, in ``Reverse``, and ``diff.py`` needs to know
none of the forwards.  A forward's own ``reverse(record, seeds, ...)`` is the same call through a
Reverse made for it.

A plain base class rather than an ``abc.ABC``: the metaclass would show in messages that name a
class passed by mistake (``Reverse(vkml.Graph)`` names ``type``).
"""

from __future__ import annotations


class Reversible:
    """Something whose recorded runs ``vkml.diff.Reverse`` reverses; each method is the
    subclass's to give."""

    __slots__ = ()

    def check_reversible(self, vjps: dict) -> None:
        """Refuse, before any Record exists, what no reverse could do: a forward that records
        nothing, a node whose derivative vkml cannot know and ``vjps`` does not give."""
        raise NotImplementedError

    def bitwise(self) -> dict:
        """Per gradient name, whether its bits are the same on every backend and thread count."""
        raise NotImplementedError

    def prepare_reverse(self, record, seeds, wrt, strict):
        """Check one reverse call before anything is locked or read: ``record`` is this forward's
        and still current, ``seeds`` name its outputs with one value per sample, ``wrt`` (a tuple
        of names, or None) names gradients it has, and ``strict`` refuses the ones that are not
        bitwise.  Returns what :meth:`sweep` needs (the seeds, resolved)."""
        raise NotImplementedError

    def reading(self, record):
        """A context manager: ``record`` counts one more reader inside it, so no launch or run of
        this forward overwrites what it reads; refused (``Busy``) while one is under way."""
        raise NotImplementedError

    def sweep(self, record, prepared, vjps, workspace):
        """The reverse itself (inside :meth:`reading`): every gradient of ``record`` for the
        seeds :meth:`prepare_reverse` resolved, as a Gradients mapping; ``workspace``: the calling
        Reverse's buffers, reused from call to call."""
        raise NotImplementedError
