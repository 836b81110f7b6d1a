"""Velocity's Redis edge: the local server that `velocity up` manages, and the mirror of aggregates.

Nothing in the pure core imports this package; it builds on ``velocity.settings``.
"""
