"""The run folder on disk: its layout, atomic writes, and the validated readers of every file in
it."""
