"""Portable mode: every operation whose bits depend on the machine computed by an implementation
whose bits depend only on its inputs."""
