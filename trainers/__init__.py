"""Backends that train one trial (one arm at one seed)."""
