"""Load generation: Locust users, the workload model, honest latency recording, reports.

``loadgen`` talks to the API over HTTP only and imports nothing of ours but
:mod:`ingest` (DESIGN §2); ``fanout load`` (:mod:`infra.load.run`) composes it with a stack.
"""
