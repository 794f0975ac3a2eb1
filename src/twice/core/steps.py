"""Where a training step ends: a step is one round of optimizer updates (pure: ids in, decisions
out).

With one optimizer a round is one `step()` call. With several (a GAN's discriminator and
generator) the first round's end is only known when an optimizer that already stepped in it steps
again; from then on a round is that many calls.

    >>> clock = RoundClock()
    >>> clock.closes(1), clock.add(1), clock.closes(2), clock.add(2), clock.closes(1)
    (False, False, False, False, True)
    >>> clock.size
    2
"""

from __future__ import annotations

__all__ = ["RoundClock"]


class RoundClock:
    """The optimizers that have stepped in the open round, and the round's size once it is known."""

    __slots__ = ("members", "size")

    def __init__(self) -> None:
        self.members: list[int] = []
        self.size: int | None = None

    def closes(self, key: int) -> bool:
        """Optimizer `key` is about to step: does that close the open round (it stepped in it
        already)?"""
        if key in self.members:
            if self.size is None:
                self.size = len(self.members)
            return True
        return False

    def add(self, key: int) -> bool:
        """Optimizer `key` has stepped: is the round now complete (its size known and reached)?"""
        self.members.append(key)
        return self.size is not None and len(self.members) >= self.size

    def reset(self) -> None:
        """Start the next round (the size, once learned, stays)."""
        self.members = []
