"""tune_dfrl: Ray Tune-driven search service for RLVR data policies."""
