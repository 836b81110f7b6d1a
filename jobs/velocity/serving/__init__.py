"""The HTTP check service, `velocity serve`: the pre-authorization check (SPEC §5a) for
services in other languages, a thin door over ``velocity.redis.check.check_payment``, the
function `velocity check` and Python services call (one semantics, several doors)."""
