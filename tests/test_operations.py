"""Data-driven operation tests (pyinfra-testing): facts in, exact commands out, under tests/operations/."""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

TESTS_BASE = Path(__file__).parent / "operations"

for op_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir() and any(d.iterdir())):
    locals()[op_path.replace(".", "_")] = make_operation_tests("gpunode.operations", op_path, TESTS_BASE / op_path)
