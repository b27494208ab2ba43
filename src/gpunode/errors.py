"""Errors that tell an operator what is wrong and how to fix it."""

from __future__ import annotations


class GpunodeError(Exception):
    """A failure with the problem in one line and the fix in another."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return self.problem if not self.fix else f"{self.problem}\n  fix: {self.fix}"
