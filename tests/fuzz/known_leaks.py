"""Public entries that leak a non-vkml exception (or hang) on some bad argument today.

Generated from a run of ``test_fuzz_entries.py`` on today's code: entry -> one leaking call (a hang
first, where there is one).  Each entry is a strict xfail there; once an entry's validation is
fixed its test passes, strict xfail fails it, and its line here is deleted."""

KNOWN_LEAKS = {
    'Graph.launch': 'Graph.launch with huge int as n=: HANG (no return within 3 CPU seconds)',
    'SkipGuard': 'SkipGuard with str array as how=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'associative_scan': 'associative_scan with str array as reverse=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'check_grads': 'check_grads with huge int as order=: HANG (no return within 3 CPU seconds)',
    'checkpoint': "checkpoint with None as argument 0: AttributeError: 'function' object has no attribute '_lookup'",
    'fori_loop': 'fori_loop with huge int as argument 1: ValueError: Maximum allowed size exceeded',
    'grad': 'grad with str array as has_aux=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'hessian': 'hessian with str array as has_aux=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'hvp': "hvp with None as argument 1: TypeError: 'NoneType' object is not iterable",
    'jacfwd': 'jacfwd with str array as has_aux=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'jacrev': 'jacrev with str array as has_aux=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'jvp': "jvp with None as argument 0: AttributeError: 'function' object has no attribute '_lookup'",
    'linearize': "linearize with None as argument 0: AttributeError: 'function' object has no attribute '_lookup'",
    'program': "program with None as argument 0: AttributeError: 'function' object has no attribute '_lookup'",
    'scan': "scan with dict as reverse=: TypeError: unhashable type: 'dict'",
    'simulation': 'simulation with huge int as max_steps=: HANG (no return within 3 CPU seconds)',
    'until_done': 'until_done with huge int as max_steps=: HANG (no return within 3 CPU seconds)',
    'value_and_grad': 'value_and_grad with str array as has_aux=: ValueError: The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()',
    'vjp': "vjp with None as argument 0: AttributeError: 'function' object has no attribute '_lookup'",
}
