"""Hydra config group `backend`: one YAML per training backend."""
