"""Private federated learning (issue 48): client-level DP and secure aggregation.

- ``accountant``: epsilon(delta) of DP-FedAvg over rounds, through ``dp-accounting`` (RDP, PLD).
- ``mechanisms``: clipping, central/local Gaussian noise and adaptive clipping on update dicts.
- ``secagg``: an exact simulation of SecAgg (Bonawitz et al. 2017) with dropouts and bytes;
  ``fixedpoint`` and ``shamir`` are its field encoding and secret sharing.

Nothing here imports the engine or the params: each module holds pure functions (or small state
objects with plain-JSON ``state_dict()``) that the engine calls.
"""
