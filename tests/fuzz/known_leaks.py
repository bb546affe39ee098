"""Public entries that leak a non-vkml exception (or hang) on some bad argument today.

Generated from a run of ``test_fuzz_entries.py`` on today's code: entry -> one leaking call (a hang
first, where there is one).  Each entry is a strict xfail there; once an entry's validation is
fixed its test passes, strict xfail fails it, and its line here is deleted."""

KNOWN_LEAKS = {}
