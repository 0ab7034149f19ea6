"""The kube-scheduler extender: its v1 wire format (:mod:`.wire`).

The decisions it answers with are pure functions of a testbed's state, in
:mod:`fleetledger.domain.testbeds.extender`.
"""
