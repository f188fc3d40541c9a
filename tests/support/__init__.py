"""Code the tests share that is not a test: helpers, test benches, constants.

Test modules import from here (and get fixtures from ``tests/plugins``), never from
one another.
"""
