"""DiLoCo's dense first rounds (``--diloco-dense-rounds``, ``DiLoCoConfig.dense_rounds``, with
``sparseloco``; off by default, 4 for links of 100 Mbit/s and more): the swarm's first outer
rounds send Q(Delta + e) with int4 instead, dense, error feedback unchanged; sparseloco after them
(p2p/averaging/diloco.py, "Compression"). Early in a run the Deltas are large and spread over most
entries, and 2% of them leaves the outer parameters far behind the inner runs: on ``nodes.wide``
(bench/diloco_sweep.py, H 25, 4 peers, seed 0) sparseloco's outer parameters scored 0.458 at step
50 (compute-only 0.604, DDP 0.678) and reached 0.80 at step 200, DDP at 125. With 4 int4 rounds
first they scored 0.661 at 50 and reached 0.80 at 125, as DDP, and stayed ahead of sparseloco
alone (0.836 against 0.828 at 300); 2 rounds reached it at 150, 3 at 150 (0.797 at 125). The price
is int4's bytes for those rounds: ~3.4 MB a peer a round there, against ~0.27 MB for sparseloco.
So they are sent only while the link carries them: a peer stops after a dense round that it waited
for longer than the period's compute (H x the measured seconds per inner step; in the first round,
the pace since the first step). Each dense round saved about 19 steps of the 75 above, less than a
period, so one that costs more than a period loses time. Measured in the lab (bench/slow_links.py,
stop 29, time to 0.80, one run each): with every dense round sent, 16.5 s against 17.7 s without
at 100 Mbit/s but 23.3 s against 19.3 s at 20 Mbit/s (an int4 round ~1.4 s there, against ~0.85 s
of compute); with the rule, 17.2 against 14.4 s at 100 Mbit/s (two dense rounds, the second ~1.3
s: CPU and skew besides the link) and 16.4 against 16.5 s at 20 Mbit/s (one); unshaped, 12.8
against 14.6 s, and 13.2 against 14.5 s at 1 Gbit/s (all four). Off by default because of 20
Mbit/s: in four runs with the rule the one dense round sent before the link is measured put the
run 0-4 s behind at 0.80 (16.4/16.5, 16.3/15.1, 18.5/15.9, 17.8/13.7 s) and 3-6 s behind at 0.84,
while at 100 Mbit/s it was ~2 s ahead in three runs of five.

Receivers decode each share by its own codec, so peers that stop at different rounds, or count
rounds differently (a joiner), mix the two kinds without harm (p2p/compression/sparse.py, "Mixed
with dense vectors").
"""

from __future__ import annotations

from typing import Any, Optional

from p2p.compression import Compressor, make_compressor

DENSE_CODEC = "int4"


class DenseRounds:
    """Which compressor the round being packed uses, and when to stop sending dense ones."""

    def __init__(self, rounds: int, feedback: bool) -> None:
        self.rounds = rounds  # the swarm's rounds below this number go dense
        self._compressor = make_compressor(DENSE_CODEC) if feedback and rounds else None  # None: no more
        self.sent = False  # the round in flight carries our Delta dense
        self._first_gate_at: Optional[float] = None  # the first step's end: the first round's pace from there

    @property
    def active(self) -> bool:
        return self._compressor is not None

    def choose(self, usual: Optional[Compressor], next_round: int) -> Optional[Compressor]:
        """The compressor for the round numbered ``next_round``: ours, or ``usual``."""
        dense = self._compressor is not None and next_round < self.rounds
        self.sent = dense
        return self._compressor if dense else usual

    def gate(self, now: float) -> None:
        """The trainer is at a gate: the first one comes after step 1 (DiLoCo asks for it)."""
        if self._first_gate_at is None:
            self._first_gate_at = now

    def round_ended(self, wait: float, began_at: float, boundary_step: int, step_s: Optional[float], h: int,
                    stats: dict[str, Any]) -> None:
        """A dense round begun at ``began_at`` (boundary ``boundary_step``) ended, the trainer
        having waited ``wait`` for it at a gate: none after it if that is longer than the
        period's compute, H x ``step_s`` (the measured seconds per inner step), or in the first
        round the pace since the first step's end. The wait, not the round's length: with
        overlap a round runs beside the next period, and one that ends within it cost nothing
        (stop 34, 4 peers sharing 2 cores: rounds of H 10 outlasted their 0.3 s period from
        skew alone, and the length stopped the dense rounds after the first)."""
        stats["dense_rounds"] += 1
        if step_s is not None:
            compute = step_s * h
        elif self._first_gate_at is not None and self._first_gate_at < began_at and boundary_step > 1:
            compute = (began_at - self._first_gate_at) / (boundary_step - 1) * h
        else:  # a joiner's first round (its first step was not step 1), or H 1
            return
        if wait > compute:
            self._compressor = None
