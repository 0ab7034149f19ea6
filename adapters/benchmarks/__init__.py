"""Benchmarks behind ``fleetledger bench``: one module per subject (``grouper``, ``store``, …).

Nothing is imported here, so loading one benchmark never drags in another's dependencies.
"""
