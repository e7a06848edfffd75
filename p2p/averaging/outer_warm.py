"""DiLoCo's denser warm-up rounds (``warmup_topk_fraction``, diloco.py "Warm-up"), sent while
the link carries them.

With sparseloco the warm-up's rounds may keep a larger share of each chunk than the codec's 2%:
the early Deltas are large and spread, and on ``nodes.wide`` 10% reached 0.80 in ~110 steps
against 2%'s ~147 (bench/diloco_sweep.py, stop 40), about 3 steps saved in each 10-step warm-up
period before 0.80. The price is the bytes: a 10% round is about 0.65 MB a peer there, 5x a 2%
one. In the lab (bench/slow_links.py, 4 peers, blocking rounds, H 10 for 300 steps, stop 42) the
10% warm-up brought 0.80 within 1.16 / 1.07x the ideal bound at 100 Mbit/s, against 1.41 / 1.38x
at 2%; at 20 Mbit/s it cost +17-20% per step, against -6 to -3% at 2%, for no time saved.

So a peer sends the denser rounds while the median of its waits for them stays within ``SHARE``
of the period's compute (H x the measured seconds per inner step), judged once ``JUDGED`` waits
are measured (the first round's is not: no period was measured yet). After that it sends the
codec's own density for the rest of the warm-up, for good: a wait that grew with the bytes will
not shrink by itself. Not the last round alone, nor a mean:
with blocking rounds a peer also waits for the slowest neighbour's step, and that neighbour's
evaluation or a share of a core taken by another peer makes single waits of 1.4-1.5x the
period's compute at either rate. The nodes' own figures (stop 43, 4 peers, ``nodes.wide``; the
first 5 judged rounds, each wait x the period's compute):

- 100 Mbit/s: 0.23 / 0.36 / 0.41 / 0.33 / 0.43, 0.72 / 0.46 / 0.14 / 0.30 / 1.50, 0.79 / 0.94 /
  0.09 / 0.47 / 0.00, 0.26 / 0.00 / 0.43 / 0.22 / 1.38: medians 0.26-0.47;
- 20 Mbit/s: 1.01 / 0.96 / 0.32 / 0.94 / 0.44, 0.52 / 0.51 / 0.58 / 0.00 / 0.85, 0.56 / 0.55 /
  0.66 / 0.86 / 0.76, 0.94 / 0.55 / 0.61 / 1.51 / 0.47: medians 0.52-0.94.

Two first rules stopped 10% rounds at 100 Mbit/s: the median of the last three above a third
(the four peers after 4, 10, 14 and 27 of their 30 rounds) and the mean above 0.4 from the fifth
(six of eight peers in two runs, after 6-7 rounds). A resumed peer judges afresh (the judgement
is not part of its state).

Each peer judges its own rounds; receivers decode each share by the k it carries
(p2p/compression/sparse.py), so peers that stopped at different rounds mix without harm.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median
from typing import Any, Optional

from p2p.compression import Compressor, compressor_from_config
from p2p.protocol import LocalProtocolError

SHARE = 0.5  # the most of the period's compute denser rounds may keep the trainer waiting (median)
JUDGED = 6  # the waits measured before the first judgement


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
        self._shares: list[float] = []  # the waits measured, x the period's compute (one per warm-up round)

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
        self._shares.append(wait / (step_s * h))
        share = median(self._shares)
        stats["warmup_wait_pct"] = round(100 * share)
        if len(self._shares) >= JUDGED and share > SHARE:
            self._compressor = None
            stats["warmup_dense_stopped"] = 1
