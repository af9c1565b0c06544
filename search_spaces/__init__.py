"""Named search spaces (Hydra config group `space`)."""
