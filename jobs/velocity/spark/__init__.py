"""Spark edges: the session, DataFrame transforms and the jobs built on the pure core."""
