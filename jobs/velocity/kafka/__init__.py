"""Velocity's Kafka edge: the local broker that `velocity up` manages, the events topic the
stream can read, and the alerts topic it publishes to.

Nothing in the pure core imports this package; it builds on ``velocity.settings``.
"""
