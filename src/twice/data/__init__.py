"""Deterministic, resumable data loading, and data-parallel training that does not depend on world
size.

loader = twice.data.loader(dataset, batch_size=64, shuffle=True, num_workers=4)
"""

from twice.data.loading import ResumableLoader, loader

__all__ = ["loader", "ResumableLoader"]
