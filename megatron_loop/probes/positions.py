"""Effective layer positions of a looped layout ``a + s x L + b`` (App. C.4 "Execution and sampling").

Repeated executions of a shared block have distinct effective positions l = 1..D,
D = a + s L + b: the prelude blocks, then loop 1's shared blocks, ..., loop L's, then the coda.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EffectivePositions:
    """Prelude depth ``prelude`` (a), shared depth ``shared`` (s), coda depth ``coda`` (b), L loops."""

    prelude: int
    shared: int
    coda: int
    num_loops: int

    @property
    def depth(self) -> int:
        """Effective depth D = a + s L + b."""
        return self.prelude + self.shared * self.num_loops + self.coda

    def segment(self, position: int) -> str:
        """``prelude`` | ``core`` | ``coda`` for the one-based effective position."""
        if not 1 <= position <= self.depth:
            raise ValueError(f"effective position {position} outside 1..{self.depth}")
        if position <= self.prelude:
            return "prelude"
        return "core" if position <= self.prelude + self.shared * self.num_loops else "coda"

    def loop_of(self, position: int) -> int | None:
        """r(l) = 1 + floor((l - a - 1) / s) for a shared-block occurrence; None otherwise."""
        if self.segment(position) != "core":
            return None
        return 1 + (position - self.prelude - 1) // self.shared

    def loops_of(self) -> list[int | None]:
        return [self.loop_of(p) for p in range(1, self.depth + 1)]

    def segments(self) -> list[str]:
        return [self.segment(p) for p in range(1, self.depth + 1)]

    def first_shared(self, t: int) -> int:
        """Effective position whose input is z^(t), the first shared block of loop t (0-based t)."""
        return self.prelude + t * self.shared + 1

    def last_shared(self, t: int) -> int:
        """Effective position whose output is y^(t), the last shared block of loop t (0-based t)."""
        return self.prelude + (t + 1) * self.shared
