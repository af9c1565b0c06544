"""What a search keeps in its folder OUT: `records` (the record files and their lines, `SearchRecord`), `resume`
(the folder lock, the state format, what `resume=true` checks), `control_cache` (control milestones shared across
searches), `atomic_file` (`write_atomically`)."""
