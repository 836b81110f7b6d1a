"""`velocity`, the one console script: the parser's wiring in ``velocity.cli.main``, each
command group's handlers in ``velocity.cli.commands.<group>`` (imported when its command
runs), what they share in ``velocity.cli.shared``; ``python -m velocity.cli`` runs it.
"""
