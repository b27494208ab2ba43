"""Verification-only mode: one testinfra suite per step, run against a pyinfra inventory.

Each suite reads the same facts the deploy reads (over testinfra's connection,
not pyinfra's) and asserts that the step's diagnosis finds nothing wrong.
Nothing here changes a host.
"""
