"""`velocity reviews export`: analysts' reviews of alerts as JSON lines."""

from __future__ import annotations

import argparse
from typing import Any

from velocity.cli.shared import export, settings_from
from velocity.domain.decimals import dumps_json
from velocity.settings import Settings


def _review_store(settings: Settings) -> Any:
    """The reviews of alerts (delta-rs, like the rule store)."""
    from velocity.delta.names import ALERT_REVIEWS
    from velocity.delta.review_store import ReviewStore

    return ReviewStore(settings.table_path(ALERT_REVIEWS))


def export_reviews(args: argparse.Namespace) -> int:
    store = _review_store(settings_from(args))
    # The review that counts per alert, or with --all every review ever recorded.
    reviews = store.all() if args.all else store.latest().values()
    ordered = sorted(reviews, key=lambda r: (r.when, r.alert_id))
    text = "".join(dumps_json(r.to_json()) + "\n" for r in ordered)
    return export(text, args.out, f"{len(ordered)} reviews")
