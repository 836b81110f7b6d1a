"""Every error Velocity raises on purpose. Messages name the bad value and the fix."""

from __future__ import annotations

from dataclasses import dataclass


class VelocityError(Exception):
    """Base of Velocity's own errors; the CLI maps it to exit code 1."""


class UsageError(VelocityError):
    """Bad input or usage from the caller; the CLI maps it to exit code 2."""


class InvalidFieldError(UsageError):
    """A request refused whole because of one field; ``field`` names it, ``reason`` says
    why, ``outcome`` what (not) happened (a review: "; no review recorded")."""

    def __init__(self, field: str, reason: str, outcome: str = "") -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"field '{field}': {reason}{outcome}")


class SettingsError(UsageError):
    """A setting (environment variable or config file) has a bad value."""


@dataclass(frozen=True)
class FieldProblem:
    """One bad field of one rule: where it is and why it is rejected."""

    field: str
    reason: str
    rule_index: int | None = None
    rule_id: object | None = None

    def __str__(self) -> str:
        where = []
        if self.rule_index is not None:
            where.append(f"rule #{self.rule_index + 1}")
        if self.rule_id is not None:
            where.append(f"ruleId {self.rule_id!r}")
        prefix = f"{' '.join(where)}: " if where else ""
        return f"{prefix}field '{self.field}': {self.reason}"


class InvalidRuleError(UsageError):
    """One or more rules are invalid; nothing of them is applied."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class UnknownRuleError(UsageError):
    """A command names a ruleId that is not in force."""
