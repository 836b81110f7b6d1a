"""Developer tools that ship with the repository, not with the velocity package."""
