"""What a value may be, and every setting's default: `constraints` (`Interval`, `Options`, `declared`,
`check_value`; policies, settings and recipes share it), `settings` (`SearchSettings`, `ReportSettings`, ...:
typed, validated in one place), `cache_root` (`default_cache_dir`, the folder kept across searches)."""
