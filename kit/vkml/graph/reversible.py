"""The interface a forward run offers its reverse: what ``vkml.diff.Reverse`` calls.

A :class:`~vkml.graph.Graph` and a simulation record their runs in different ways (a tape of
plane versions; checkpointed states) and reverse them in different ways (one sweep over the
tape; windows recomputed from checkpoints), but a ``Reverse`` treats them alike: it asks the
forward once whether it can be reversed with the given vjps, and then has it reverse each
Record.  So ``diff.py`` needs to know neither class.

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

    def reverse(self, record, seeds, wrt=None, vjps=None, strict=False, lock=None):
        """Every gradient of ``record`` (a Record of this forward's) seeded with ``seeds``, as
        :class:`vkml.diff.Gradients`; ``lock``: the calling Reverse's own, refused (``Busy``)
        when another thread holds it."""
        raise NotImplementedError
