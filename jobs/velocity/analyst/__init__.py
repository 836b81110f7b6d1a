"""What the analyst works with: cases and reviews, the case queue, alert search, explain,
the preview, shadow comparisons, rule rates and backfill runs. Pure: the page, the
command line and the stores call it."""
