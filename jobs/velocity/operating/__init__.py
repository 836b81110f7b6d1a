"""How the stream is run and watched: its health, control files, metrics, progress,
step timing and the worker processes it keeps. Standard library, prometheus_client
and rich; no Spark, Delta or Redis."""
