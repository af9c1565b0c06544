"""Ray as the search uses it: `services` (the private loopback-only, token-authenticated node, `start_private_ray`,
`stop_ray`; checks of the Ray address, the tracking server and the storage), `head_watch` (`ClusterWatch`: the head
is gone -> `ClusterLost`), `lost_nodes` (`LostNodes`: a lost worker node in one line)."""
