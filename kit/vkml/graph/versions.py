"""Plane versions during one run of a graph, and the one rule for what a Record copies.

Every write of a plane makes a new *version* of it, named ``(id(plane), n)``: ``n`` counts the
writes so far in the run (0 is the plane as the run found it).  A reverse needs every version
some launch read.  Most of them are still in the planes when it runs (the last version of each
plane); the exception is a version that a later write overwrites.  Hence the rule:

    A recording run copies a plane version just before it is overwritten, if some launch read
    it, and only once.  Nothing else is copied.

So a graph that overwrites nothing copies nothing (``record.nbytes == 0``), a plane that is
written without being read first (an output) is never copied, and a version is never copied
twice.  :class:`PlaneVersions` keeps the versions and applies the rule; every way a graph runs
asks it before a write (:meth:`PlaneVersions.copy_before_write`):

- the node-by-node run (``record._Run.write``) copies the plane itself;
- the fused run (``record._fused_plan``) makes the version an extra output of its one program;
- a ``repeat_while`` loop follows the rule on its first iteration; its later iterations
  overwrite only versions the loop made itself, which its reverse rebuilds from the loop's own
  checkpoints instead of copies.

A simulation never overwrites a plane while it runs (it steps private copies and writes the
planes once at the end), so it copies no versions: it stores the states its checkpoint schedule
names (``graph/simulation/schedules.py``).
"""

from __future__ import annotations


class PlaneVersions:
    """The current version of each plane in one run, the versions read, and the copy rule."""

    __slots__ = ("recording", "version", "read", "copied")

    def __init__(self, recording: bool):
        self.recording = recording
        #: plane id -> its current version (a plane first seen being read is at version 0)
        self.version = {}
        #: the versions some launch read
        self.read = set()
        #: the versions the rule has copied (each once)
        self.copied = set()

    def current(self, pid) -> int:
        return self.version.get(pid, 0)

    def note_read(self, pid):
        """A launch reads plane ``pid``: the version it reads, remembered."""
        key = (pid, self.version.setdefault(pid, 0))
        self.read.add(key)
        return key

    def copy_before_write(self, pid):
        """The rule: the version of plane ``pid`` that the write about to happen overwrites, when
        the Record must copy it first (a recording run, some launch read it, not copied yet);
        otherwise None.  The caller copies it (or has its program output it) before writing."""
        key = (pid, self.current(pid))
        if not self.recording or key not in self.read or key in self.copied:
            return None
        self.copied.add(key)
        return key

    def wrote(self, pid):
        """Plane ``pid`` was written: its new version."""
        self.version[pid] = self.current(pid) + 1
        return (pid, self.version[pid])
