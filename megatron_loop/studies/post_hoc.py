"""Post hoc readings of the registered studies: chosen after their data were seen, so they decide nothing.
They are not part of any plan (a plan's text is pinned) and each report prints them last, under a heading
that says so, with intervals and no verdict column. Empty until a study's data suggest a question worth a
look; every entry says when and why it was added.
"""

from __future__ import annotations

from megatron_loop.studies.plan import Change, Spread

# study -> ((label, reading, why and when it was added), ...)
POST_HOC: dict[str, tuple[tuple[str, Change | Spread, str], ...]] = {}
