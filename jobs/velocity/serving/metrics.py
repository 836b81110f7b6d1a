"""The check service's metrics, in Prometheus's text format (its ``GET /metrics``;
docs/reference/metrics.md lists them, generated from this registry).

Counters count this process's requests and start at 0 with each run. Every POST /check
counts once: in ``velocity_checks_total`` by its decision when it was answered, else in
``velocity_check_errors_total`` by why not (a request without the token counts there too,
whatever its route). The latency histogram holds the answered
checks only, from the request's arrival to its answer (the body read, the payment
validated, the Redis call); an error's latency says nothing about the check's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

DECISIONS = ("ALLOW", "REVIEW", "BLOCK")
# bad_request: 400 (malformed JSON or payment, or a body too large); unauthorized: 401;
# unavailable: 503 (Redis holds no rules, or does not answer).
ERROR_REASONS = ("bad_request", "unauthorized", "unavailable")
# The target is 5 ms at the 99th percentile through HTTP: fine steps below it.
CHECK_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.5)


class CheckMetrics:
    """One registry of one service: its own, so two services in one process (tests) never
    share a figure."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.checks = Counter(
            "velocity_checks",
            "Checks answered (HTTP 200), by the answer's decision.",
            ["decision"],
            registry=self.registry,
        )
        self.errors = Counter(
            "velocity_check_errors",
            "Requests not answered with a decision, by reason: bad_request (a POST /check "
            "answered 400 or 413), unauthorized (401, on any route that needs the token), "
            "unavailable (a POST /check answered 503).",
            ["reason"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "velocity_check_seconds",
            "Time from a check's arrival to its answer (answered checks only).",
            buckets=CHECK_SECONDS_BUCKETS,
            registry=self.registry,
        )
        # Every label value from the start: a rate over a series that appears late is wrong.
        for decision in DECISIONS:
            self.checks.labels(decision=decision)
        for reason in ERROR_REASONS:
            self.errors.labels(reason=reason)
        ProcessCollector(registry=self.registry)

    def answered(self, decision: str, seconds: float) -> None:
        self.checks.labels(decision=decision).inc()
        self.seconds.observe(seconds)

    def refused(self, reason: str) -> None:
        self.errors.labels(reason=reason).inc()
