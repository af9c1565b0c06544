"""Packaged Hydra configs (`pkg://tune_dfrl.conf`)."""
