"""Velocity: dynamic fraud velocity rules on Spark, Delta Lake and Redis.

The pure core (schema, rules, buckets, windows, engine) imports nothing of
Spark, Delta, Redis or Airflow; the edges (spark/, delta/, redis/, cli) call it.
"""

__version__ = "0.1.0"
