"""Data-driven fact tests (pyinfra-testing): one case file per command output under tests/facts/."""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

TESTS_BASE = Path(__file__).parent / "facts"

for fact_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[fact_path.replace(".", "_")] = make_fact_tests("gpunode.facts", fact_path, TESTS_BASE / fact_path)
