"""The handlers of ``velocity``'s commands, one module per command group.

A handler receives the arguments ``velocity.cli.main`` parsed (with the loaded settings
as ``args.settings``) and returns the exit code; it parses nothing itself.
"""
