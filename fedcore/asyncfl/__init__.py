"""Asynchronous federated learning and system heterogeneity on a deterministic virtual clock
(issue 50, docs/async.md): device profiles and availability (``clock``, ``availability``),
FedBuff's event-driven server (``fedbuff``), its events (``events``) and step (``buffer``),
and their settings (``config``).

Standalone for now: nothing in the engine imports it yet (the wiring is a later change).
"""
