"""DiLoCo's denser warm-up rounds (``warmup_topk_fraction``, diloco.py "Warm-up"), sent while
the link carries them.

With sparseloco the warm-up's rounds may keep a larger share of each chunk than the codec's 2%:
the early Deltas are large and spread, and on ``nodes.wide`` 10% reached 0.80 in ~110 steps
against 2%'s ~147 (bench/diloco_sweep.py, stop 40), about 3 steps saved in each 10-step warm-up
period before 0.80. The price is the bytes: a 10% round is about 0.65 MB a peer there, 5x a 2%
one. Measured in the lab (bench/slow_links.py, 4 peers, blocking rounds, H 10 for 300 steps,
stops 41-42), the trainer's wait for each warm-up round, as a share of the period's compute:

- 2% rounds: 0.15-0.22 at 100 Mbit/s and at 20 Mbit/s (mostly the peers' skew, not the link);
- 10% rounds: 0.20-0.25 at 100 Mbit/s, 0.45-0.61 at 20 Mbit/s.

At 100 Mbit/s the 10% warm-up brought 0.80 within 1.16 / 1.07x the ideal bound, against 1.41 /
1.38x at 2%; at 20 Mbit/s it cost +17-20% per step, against -6 to -3% at 2%, for no time saved.
So a peer sends the denser rounds while the mean of its waits for them stays within ``SHARE``
of the period's compute (H x the measured seconds per inner step), judged from the ``JUDGED``-th
round on: 0.4, between the two links' figures above. After that it sends the codec's own
density for the rest of the warm-up, for good: a wait that grew with the bytes will not shrink
by itself. The mean of all its rounds, not the last few: with blocking rounds a peer waits for
the slowest neighbour's step as well as for the link, and one round's wait there ranged from 0
to ~0.9 s at 100 Mbit/s on cores the peers share. A first rule, the median of the last three
above a third, stopped the four peers' 10% rounds at 100 Mbit/s after 4, 10, 14 and 27 of their
30 warm-up rounds (stop 43, one run), where the mean of each peer's waits was 0.20-0.26 of its
compute. A resumed peer judges afresh (the judgement is not part of its state).

Each peer judges its own rounds; receivers decode each share by the k it carries
(p2p/compression/sparse.py), so peers that stopped at different rounds mix without harm.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from p2p.compression import Compressor, compressor_from_config
from p2p.protocol import LocalProtocolError

SHARE = 0.4  # the most of the period's compute denser rounds may keep the trainer waiting, on average
JUDGED = 5  # the waits measured before the first judgement


def warm_up_compressor(config: Any, fraction: Optional[float]) -> Optional[Compressor]:
    """Sparseloco keeping ``fraction`` of each chunk, else as ``config``; None without a fraction."""
    if fraction is None:
        return None
    if config.compression != "sparseloco":
        raise LocalProtocolError(f"diloco's warmup_topk_fraction is sparseloco's density in the warm-up; "
                                 f"compression is {config.compression!r}")
    return compressor_from_config(replace(config, compression_topk_fraction=fraction))


class WarmDensity:
    """The warm-up rounds' compressor, and when the link stops carrying it."""

    def __init__(self, config: Any, fraction: Optional[float]) -> None:
        self._compressor = warm_up_compressor(config, fraction)  # None: none, or no more
        self.sent = False  # the round in flight carries our Delta at the warm-up's density
        self._judged, self._share_sum = 0, 0.0  # the waits measured, and their sum x the period's compute

    def compressor(self, warming_up: bool) -> Optional[Compressor]:
        """The warm-up's compressor for a round whose boundary is in the warm-up, else None."""
        return self._compressor if warming_up else None

    def round_ended(self, wait: float, step_s: Optional[float], h: int, stats: dict[str, Any]) -> None:
        """A round sent at the warm-up's density ended, the trainer having waited ``wait`` at a
        gate for it; ``step_s``: the measured compute per inner step (None before the first
        period was measured: not judged)."""
        stats["warmup_dense_rounds"] += 1
        if step_s is None or step_s <= 0:
            return
        self._judged += 1
        self._share_sum += wait / (step_s * h)
        if self._judged >= JUDGED and self._share_sum / self._judged > SHARE:
            self._compressor = None
            stats["warmup_dense_stopped"] = 1
