"""Data policies: signals in, token weights or domain proportions out (pure torch)."""
