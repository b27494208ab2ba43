"""Verification-only mode: one testinfra suite per step, run against a pyinfra inventory.

Each suite reads the same facts the deploy reads (over the connection
gpunode.connection builds for every command: the inventory's user, keys, ssh
config and sudo, as pyinfra reaches the host) and asserts that the step's
diagnosis finds nothing wrong.
Nothing here changes a host.
"""
