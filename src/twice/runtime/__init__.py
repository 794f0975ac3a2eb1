"""What runs inside the user's processes: the bootstrap, deterministic mode and environment
facts."""
