"""What Velocity means: events, rules, buckets, windows, alerts and the cooldown, each
as a per-event reference the columnar engine is held to. Pure: no Spark, Delta, Redis
or Airflow."""
