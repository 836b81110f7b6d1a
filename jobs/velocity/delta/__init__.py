"""Delta Lake edges: table layout, idempotent writes and the versioned rule store."""
