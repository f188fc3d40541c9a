"""Small integer codes shared by the Kafka source and the pure join.

The source decodes each changelog record into one typed row; ``kind`` says which
event it is (0 for a record that failed validation and must be dead-lettered).
Kept free of pyspark so the join and its tests import it without Spark.
"""

from enum import IntEnum


class Kind(IntEnum):
    """The event a source row carries."""

    INVALID = 0
    POST = 1
    DELETE = 2
    FOLLOW = 3
    UNFOLLOW = 4
    USER = 5
