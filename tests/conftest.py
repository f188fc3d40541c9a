"""The suite's shared fixtures, loaded as plugins: the broker, per-test topics, Spark,
Cassandra, an empty store of each kind, a freshly booted clock and Hypothesis's settings.

Real services start once per session on random loopback ports; each test gets its
own uniquely prefixed topics (docs/style.md §8). The fixtures live in ``tests/plugins/``, one
module per service; pytest takes ``pytest_plugins`` only from this, the root
conftest. Code the tests share that is not a fixture is in ``tests/support/``.
"""

pytest_plugins = [
    "tests.plugins.nodes",
    "tests.plugins.kafka",
    "tests.plugins.spark",
    "tests.plugins.cassandra",
    "tests.plugins.stores",
    "tests.plugins.clock",
    "tests.plugins.workers",
    "tests.plugins.properties",
]
