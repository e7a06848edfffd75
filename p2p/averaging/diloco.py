"""DiLoCo / local SGD with an outer Nesterov step, averaged by gossip instead of all-reduce.

After Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105, 2023, Alg. 1 (and local SGD: Stich, ICLR 2019): H inner steps with the
trainer's own optimizer, then the pseudo-gradient Delta = theta_start - theta_local is averaged
over the workers and an outer SGD-Nesterov step (lr 0.7, momentum 0.9 in the paper) moves the
shared outer parameters:

    m <- mu m + Delta_avg;   theta_start <- theta_start - lr (Delta_avg + mu m);   theta <- theta_start

Decentralised: there is no all-reduce and no coordinator. At the outer boundary a peer runs
``gossip_rounds`` synchronous neighbour-averaging rounds (``rounds.py``, Metropolis-
Hastings weights; one round on ``full`` is the exact average, log2 n rounds on ``hypercube``
for n a power of two). Each round mixes the PAIR (theta_start, Delta): the paper's workers share
theta_start by construction; here each peer holds its own copy, and averaging it along with
Delta makes the copies agree (a late joiner, or a round that timed out, would otherwise leave
its outer parameters apart forever). The momentum buffer is a function of the averaged Delta
sequence, so peers that share that sequence share it too; copies that drifted apart have
different momenta as well, so it travels and is mixed along with theta_start (below).

H (``inner_steps``) is fixed, or with ``auto`` chosen from the link: the fewest inner steps whose
outer exchange fits inside their compute (p2p/averaging/outer_schedule.py, after Streaming
DiLoCo's hiding of the exchange behind the inner steps, arXiv:2501.18512 Sec. 2.2, and DiLoCo's
finding that accuracy falls as H grows, arXiv:2311.08105 Sec. 3). Every share carries its
sender's proposal (``inner_steps``); H is a power of two from 4 to 256 and becomes the upper
median of the proposals of the set the round averaged, so the peers whose theta_start copies
agree agree on H, and nested powers of two keep a peer that briefly disagrees on the swarm's
boundaries; a peer that took rounds at another H (cut off, or declared dead and re-admitted)
begins, at its next boundary, the round the swarm begins there (outer_schedule.py, rule 5).
The schedule is part of the state (checkpoints, joiners). Only with one gossip round per outer
step (``full``): only an exact average gives every peer the same set.

Hooks (local step k):
- ``after_step(k)``: when k is a multiple of H (the outer boundary; a joiner that adopted the
  swarm's step count and H falls on the same boundaries), take theta_local = snapshot and Delta, and
  begin the first gossip round of this outer step (OuterShare to the neighbours).
- ``may_step(k + 1)``: without ``overlap``, False from the boundary until the last gossip
  round finished (all in or ``round_timeout_s``) and the outer step was queued:
  ``add_delta(theta_start - snapshot)``. With ``overlap`` the gate is at the NEXT boundary
  instead (below).
  Between gossip rounds ``next_deadline()`` is "now", and ``tick`` begins the next round (so
  the driver computes its neighbours for the new ``topology_round()``).
- ``on_gradient`` / ``gradient_ready``: not used.

Overlap (``overlap``, ``--diloco-overlap``; off by default, see the end of this paragraph): the outer round runs beside the next H inner steps and
its outer step lands one round late, after Streaming DiLoCo's overlapping communication
(Douillard et al., arXiv:2501.18512, Sec. 2.2) and eager updates (Kale et al., arXiv:2502.12996):
at boundary k the peer ships Delta_k = theta_start - theta and keeps training from theta; when
the round's average arrives, the outer step replaces the progress it shipped by the swarm's:
``theta <- theta + Delta_k + (theta_start' - theta_start)``, i.e. theta_start' plus the inner
steps taken since the boundary (which the next Delta counts, against theta_start'). The trainer
waits only before the step that closes the next period if the round is still in flight (a round
more than one period behind), and at the end of training (``may_finish``), so the last outer
step is in the final model. A round that takes less than H steps of compute then costs the
trainer nothing. It waits there only while the round runs at its usual pace: a round held far
past it (a cut neighbour waited for until the deadline) lets the trainer go on once it waited
0.3 s, at most once in 4 outer steps (p2p/averaging/outer_gate.py; counted: ``gates_passed``).
Only with one gossip round per outer step (``full``, the slow-link configuration): several
rounds on a sparse graph mix theta_start itself, and with the peers no longer held at the same
boundary the simulator saw their rounds fall out of step (partial rounds, jumps) and the copies
drift apart, so there the trainer waits as without overlap.
Bounded overlap (``overlap_steps`` tau): the trainer waits before the (tau + 1)-th step after the
boundary instead, if the round is still in flight: Streaming DiLoCo's overlap of tau inner steps
(Sec. 2.2), between the blocking rounds (tau 0) and a whole period. The round's
latency up to tau steps costs the trainer nothing, and the outer step is never more than tau
steps late. Why: on shared cores (4 peers on 2) rounds land late from CPU and skew alone, and
steps taken beside a late round start from a model without its outer step
(bench/diloco_sweep.py, stop 41: shares 8 steps late at H 10 left the outer parameters at 0.731
at step 150, against 0.813 blocking), while blocking rounds make the trainer wait the whole
round: at 20 Mbit/s +8% to +17% per step over compute-only in the lab. Measured there (stop 42,
README): with 2% shares, tau 2 reached 0.80 before the blocking rounds in 6 of 7 1200-step runs;
with the warm-up's 10% shares (~3 steps on a 20 Mbit/s link, more than 2 hide) it did not.
Off by default because in the simulator (8 peers, 150 steps, 2 joins and 2 crashes, seeds 0-9:
``p2p.sim.avg_sim.run("diloco", "full", ..., churn=Churn(joins=2, crashes=2))``) the optimality
gap it ends with is 2.3x the blocking rounds' (mean 0.045 against 0.020 of the initial gap; two
seeds at 0.12-0.13): a one-round-late outer step weighs more in a run of ~15 outer steps. That
is Nesterov momentum's cost (it carries a late step into the next ones): with SparseLoCo's outer
step (lr 1, no momentum), the one slow links use, the same runs end at 0.21% of the initial gap
on average with overlap (at most 0.37%) against 0.12% blocking (at most 0.33%). Every
seed now ends with one copy (stop 27's final sketches, outer_finals.py; before, one seed in ten
ended with a copy apart). In the lab at 1200 steps it matches the blocking rounds at equal steps
(README, stop 28).

Finished peers: after its last step a peer stops calling the hooks but lingers until stopped.
The trainer calls ``training_done`` (after the gate that completed its last outer step); from
then on the peer answers every outer round a neighbour begins (``serve_round``), from ``tick``,
with its theta_start and the Delta of the inner steps it took since (none: zero), and takes the
outer step like everyone else. So the peers still training never wait a round timeout for it,
and its theta_start copy keeps following theta_start: the swarm ends in agreement. A zero Delta
dilutes the average pseudo-gradient by the share of finished peers (the outer step of a swarm
where only some still train is that much shorter). Finished peers never begin a round.
The copy the last round left apart is compared after training from the neighbours' final
sketches (p2p/averaging/outer_finals.py).

Compression (``compression`` = fp16, bf16, int8, int4 or sparseloco; p2p/compression), after
the compressed pseudo-gradients of Douillard et al., "Streaming DiLoCo", arXiv:2501.18512, 2025,
Sec. 2.3: Delta travels as Q(Delta) in an ``OuterShareQ``, and each peer mixes its *own decoded*
D(Q(Delta)) with the others' (as compressed AD-PSGD does), so on ``full`` every peer still
computes the same averaged pseudo-gradient and the same outer step. No error feedback for the
dense codecs: each outer step's quantisation error is a fresh ~1/254 (int8) or ~1/14 (int4) of a
block's largest entry, not a bias; Streaming DiLoCo finds 4 bits lose nothing, as
bench/diloco_sweep.py does here. ``sparseloco`` (chunked top-k at 1-3% density, 2-bit values)
drops most of each Delta, a bias that only error feedback undoes, as in SparseLoCo (Sarfi et al.,
arXiv:2508.15706, 2025, Alg. 1): each peer keeps the residual e of its own Deltas, sends
Q(Delta + e) and keeps e <- Delta + e - D(Q(Delta + e)), so what Q leaves out of one round goes
out in a later one. e is private (it never travels, a joiner starts from zero, a donor's state
carries none) and part of the peer's checkpoint. It survives a repair of theta_start: the repair
moves theta_start and the model by the same difference, so the inner progress e stands for is
still ours to send. Finished peers serve exact zero Deltas and leave e alone. Only with one
gossip round per outer step (``full``): a mix compressed again in every round of a sparse graph
has no single sender to feed back to. SparseLoCo also drops the outer momentum (a decayed e
stands in for it), and so should a run here: ``outer_lr`` 1 and ``outer_momentum`` 0 (the
paper's rule but for its decay of e by beta < 1 per round, not done here). With momentum 0.9 the
mass that e sends late is amplified: in the simulator (tests/test_avgsim_convergence.py) the
optimality gap ended at 1.7x the initial one, against 0.03-0.04x with momentum 0.

Dense first rounds (``dense_rounds``, with ``sparseloco``; off by default): the swarm's first
outer rounds send int4 instead while the link carries them (p2p/averaging/outer_dense.py).

Warm-up (``warmup_steps``, ``warmup_inner_steps``; off by default): the first steps average
every ``warmup_inner_steps`` instead of every H, as post-local SGD begins with synchronous steps
(Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", arXiv:1808.07217, Sec. 3: local
steps hurt most early, while the loss falls fast and the peers' models part fastest). Measured
in the lab (nodes.wide, 4 peers, sparseloco): H 10 is at DDP's accuracy after 20% of the run,
H 25 0.6-2.5 points under, and from 40% on both are level; H 10 all the way costs 2.5x the rounds.
The boundaries stay a function of the step alone (multiples of the warm-up's H up to the end of
the warm-up, then every H after it: outer_schedule.py), so every peer, joiner and resumed peer
puts them on the same steps and rounds stay one boundary each. With sparseloco the warm-up's
rounds may keep a larger share of each chunk (``warmup_topk_fraction``): 2% of the large, spread
early Deltas leaves the outer parameters behind, where 10% reached 0.80 on nodes.wide in ~110
steps against 2%'s ~147 and DDP's ~121 (bench/diloco_sweep.py, stop 40); after the warm-up the
rounds go back to the codec's own density, whose few bytes and CPU the long run is made of. A
peer sends the denser rounds only while the link carries them (outer_warm.py: while its waits
for them stay within half the period's compute, as a median; at 20 Mbit/s they do not).

theta_start never travels in the rounds on ``full`` (``gossip_rounds`` = 1). Every share carries
a sketch of the sender's theta_start (a few hundred entries at fixed positions). Peers that mixed
the same averaged Delta keep identical copies (up to float rounding), so the sketches agree. A
missed round, a cut link or a joiner leaves copies apart by far more than rounding: then the
peers outside the largest group of matching sketches mend theirs, by a replay of the round
they missed from the Deltas they kept when they can; else, with a codec whose rounds are small
(a few rounds of SparseLoCo's shares weigh less than half of theta_start), by a catch-up: the
rounds since they last agreed replayed from one donor's log of the compressed shares each
round averaged (outer_catchup.py); else by a pull of the swarm's (theta_start, momentum) from
one donor, in chunks, in the background, carried through the outer steps since
(p2p/averaging/outer_copies.py decides; outer_mending.py holds both sides; outer_repair.py
pulls: sized from the measured link, at most one repair in flight, a retry never larger than
the attempt before; training never waits for either). Finished peers mend theirs too: they keep serving rounds. With int4 an
outer step moves ~N/7 of a model per neighbour instead of 3N. With ``gossip_rounds`` > 1
(sparse graphs, where no round is an exact average and the copies are never equal) theta_start
and the momentum travel in every round (a left-out one is an empty tensor, which the round
mixes as "equal to mine"). Each share names whose Deltas its sender's previous round averaged
(``mixed``): replays and the check of a pull in flight rest on it.

Reduce-scatter (``reduce_scatter``, ``--diloco-reduce-scatter``; off by default): the round on
``full`` as a reduce-scatter + all-gather, 2(N-1)/N model-sizes per peer instead of N-1
(p2p/averaging/outer_scatter.py: slice ownership, failures, why not sparseloco).

Round deadlines on ``full`` follow the link (issue 16): a round waits at most ``ROUND_SLACK``
times the usual wait for all shares (an EWMA of the rounds that completed, so the bytes / the
measured rate and the neighbours' skew; doubled after each round that timed out), between
``MIN_ROUND_TIMEOUT_S`` and ``round_timeout_s``. A neighbour whose share missed a round is not
waited for until a share of its arrives again (a cut peer costs the others one short timeout,
not one per round), and the round's mix is the plain average of the shares that arrived, so the
peers that got the same shares keep the same copy (rounds.py, ``uniform``). A peer whose rounds
fell behind in time but not in number (its process stalled, or its trainer waited out rounds
alone while the others went on: same H, same steps, only later) would find their shares for its
round and the next already there at every boundary and mix another set than theirs for good;
it begins the round they are at instead (rounds.py, "Overtaken"), with a fixed H as with auto.

Robust mixing (``robust_mixing``, on by default; p2p/averaging/robust.py). On ``full`` (one
round per outer step) it must give every peer that got the same shares the same outer step, or
each clipping splits the copies (issue 16, seen in the lab): a share whose pseudo-gradient's
norm is far beyond the round's median is refused, the rest clipped to a radius from that
median, a minority that points against the sum of the others left out (a sign-flipped
pseudo-gradient has an honest norm), and the mean of the rest taken (robust.py, "One answer for
one set"). On sparse graphs (theta_start
mixed every round) each neighbour's vectors are screened around ours, after ClippedGossip. A
refused share's sketch asks for no repair.

Waits at every outer boundary for the neighbours (bounded by the timeout per round): a slow
peer delays the others once per H steps, not every step. Rounds are aligned as in ``rounds.py``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from p2p.averaging.outer_copies import CopyWatch, sketch_positions
from p2p.averaging.outer_scatter import OuterGather, OuterScatter, OuterSlice, hold
from p2p.averaging.outer_schedule import MAX_PROPOSAL, InnerSchedule
from p2p.averaging import outer_mending
from p2p.averaging.outer_mending import Mending
from p2p.averaging.outer_gate import TrainerGate
from p2p.averaging.outer_repair import propagate
from p2p.averaging.base import (AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, check_params,
                               state_array, state_int)
from p2p.averaging.outer_codec import pack, received_delta
from p2p.averaging.outer_dense import DenseRounds
from p2p.averaging.outer_finals import FinalSketches, OuterDone
from p2p.averaging.outer_warm import WarmDensity
from p2p.averaging.robust import RobustMixing
from p2p.averaging.rounds import NeighbourRounds
from p2p.bandwidth import BandwidthMonitor
from p2p.compression import compressor_from_config
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.wire import message

FEEDBACK_CODECS = ("sparseloco",)  # biased: sent with error feedback (module docstring, "Compression")
CODECS = ("none", "fp16", "bf16", "int8", "int4") + FEEDBACK_CODECS
_NO_PARAMS = np.empty(0, dtype=np.float32)
ROUND_SLACK = 3.0  # a round waits at most this many times its usual wait (module docstring)
MIN_ROUND_TIMEOUT_S = 2.0
WAIT_EWMA_ALPHA = 0.2
MAX_MIXED = 4096  # senders a share's ``mixed`` list may name


@dataclass(frozen=True)
class DiLoCoConfig:
    """DiLoCo's own settings (Douillard et al., 2023, Sec. 2: H, the outer Nesterov step)."""

    inner_steps: int | str = 50  # H: local (inner optimizer) steps between outer synchronisations, or "auto" (outer_schedule.py)
    # The outer step; None: the codec's default (``outer_defaults``): the paper's 0.7 and 0.9, or
    # SparseLoCo's 1 and 0 with ``sparseloco`` (momentum amplifies what error feedback sends late)
    outer_lr: float | None = None  # outer learning rate on the averaged pseudo-gradient
    outer_momentum: float | None = None  # outer Nesterov momentum
    gossip_rounds: int = 1  # neighbour-averaging rounds of the pseudo-gradient per outer step (1 is exact on "full")
    overlap: bool = False  # the outer round runs beside the next H inner steps (module docstring, "Overlap"; gossip_rounds 1)
    # with overlap, the trainer waits for the round in flight before this many steps past its
    # boundary are taken, not at the period's end (module docstring, "Bounded overlap"); None: H
    overlap_steps: int | None = None
    reduce_scatter: bool = False  # the outer round as reduce-scatter + all-gather (outer_scatter.py; gossip_rounds 1)
    # With sparseloco: the swarm's first outer rounds (round numbers below this) send int4,
    # dense (outer_dense.py; 4 on links of 100 Mbit/s and more)
    dense_rounds: int = 0
    # Post-local SGD's warm-up (Lin et al., arXiv:1808.07217, Sec. 3): the first ``warmup_steps``
    # steps average every ``warmup_inner_steps`` (module docstring, "Warm-up"); 0: none
    warmup_steps: int = 0
    warmup_inner_steps: int = 10
    # with sparseloco, the fraction of each chunk the warm-up's rounds keep (module docstring,
    # "Warm-up"); None: the codec's own, as every later round
    warmup_topk_fraction: float | None = None

    def __post_init__(self) -> None:
        h = self.inner_steps
        if h != "auto" and (isinstance(h, bool) or not isinstance(h, int) or h < 1):
            raise ValueError(f"inner_steps must be an integer >= 1 or 'auto', got {h!r}")
        if self.gossip_rounds < 1:
            raise ValueError("gossip_rounds must be >= 1")
        if h == "auto" and self.gossip_rounds > 1:
            raise ValueError("inner_steps 'auto' needs gossip_rounds 1 (the full graph): peers agree on H from "
                             "the set a round averaged, which only an exact one-round average gives them all")
        if self.reduce_scatter and self.gossip_rounds > 1:
            raise ValueError("reduce_scatter needs gossip_rounds 1 (the full graph): every peer owns a slice of everyone's Delta")
        if self.outer_lr is not None and not 0 < self.outer_lr < math.inf:
            raise ValueError("outer_lr must be a finite number > 0")
        if self.outer_momentum is not None and not 0 <= self.outer_momentum < 1:
            raise ValueError("outer_momentum must be in [0, 1)")
        d = self.dense_rounds
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"dense_rounds must be an integer >= 0, got {d!r}")
        for name, value, low in (("warmup_steps", self.warmup_steps, 0), ("warmup_inner_steps", self.warmup_inner_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.warmup_steps and h == "auto":
            raise ValueError("warmup_steps needs a fixed inner_steps: auto already begins at the smallest H (4) and grows")
        tau = self.overlap_steps
        if tau is not None:
            if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
                raise ValueError(f"overlap_steps must be an integer >= 1, got {tau!r}")
            if not self.overlap:
                raise ValueError("overlap_steps needs overlap (it bounds how far the trainer goes beside a round)")
        f = self.warmup_topk_fraction
        if f is not None:
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise ValueError(f"warmup_topk_fraction must be a number in (0, 1], got {f!r}")
            if not self.warmup_steps:
                raise ValueError("warmup_topk_fraction needs warmup_steps (it sets the warm-up's density)")

    def outer_defaults(self, compression: str) -> "DiLoCoConfig":
        """These settings with the outer step the codec calls for where none was given: DiLoCo's
        (Douillard et al., 2023: lr 0.7, Nesterov momentum 0.9), or SparseLoCo's for its codec
        (Sarfi et al., 2025: lr 1, no momentum; module docstring, "Compression")."""
        lr, momentum = (1.0, 0.0) if compression in FEEDBACK_CODECS else (0.7, 0.9)
        return replace(self, outer_lr=lr if self.outer_lr is None else self.outer_lr,
                       outer_momentum=momentum if self.outer_momentum is None else self.outer_momentum)


@message(28)
@dataclass(frozen=True)
class OuterShare:
    round: int  # the sender's gossip round (gossip_rounds per outer step)
    step: int  # the sender's step count at the boundary that began its outer step (a finished peer: its last)
    degree: int  # the sender's neighbour count this round
    model_key: str
    params: np.ndarray  # the sender's estimate of theta_start (outer parameters), or empty
    delta: np.ndarray  # the sender's estimate of the averaged pseudo-gradient
    sketch: np.ndarray  # the sender's theta_start at sketch_positions (module docstring)
    momentum: np.ndarray  # the sender's outer momentum when params is sent, else empty
    mixed: tuple = ()  # whose Deltas (the sender's too) its previous round averaged; () unknown
    inner_steps: int = 0  # the H its sender proposes (outer_schedule.py); 0: none


@message(66)
@dataclass(frozen=True)
class OuterShareQ(CompressedFields):
    """OuterShare carrying Q(delta) (compression range of tags)."""

    round: int
    step: int
    degree: int
    model_key: str
    params: np.ndarray  # theta_start, float32, or empty in rounds that leave it out
    sketch: np.ndarray  # theta_start at sketch_positions
    momentum: np.ndarray  # the outer momentum when params is sent, else empty
    mixed: tuple = ()  # as OuterShare.mixed
    inner_steps: int = 0  # as OuterShare.inner_steps


def _received_state(msg, port: ModelPort):
    """A peer's (theta_start, momentum), or (None, None) when it left them out (empty)."""
    if msg.params.size == 0 and msg.momentum.size == 0:
        return None, None
    check_params(msg.params, msg.model_key, port)
    check_params(msg.momentum, msg.model_key, port)
    return msg.params, msg.momentum


def _check_sketch(sketch: np.ndarray, positions: np.ndarray) -> None:
    if not isinstance(sketch, np.ndarray) or sketch.dtype != np.float32 or sketch.shape != positions.shape:
        raise RemoteProtocolError("bad_tensor", f"sketch {getattr(sketch, 'dtype', type(sketch))}"
                                                f"{list(getattr(sketch, 'shape', ()))}, want float32[{positions.size}]")


class DiLoCo(AsynchronousHooks):
    """Local SGD with gossip-averaged outer Nesterov steps (module docstring)."""

    name = "diloco"
    natural_topology = "full"
    MESSAGES = (OuterShare, OuterShareQ, OuterSlice, OuterGather, OuterDone, *outer_mending.MESSAGES)
    CODECS = CODECS
    Config = DiLoCoConfig
    default_round_timeout_s = 20.0  # its rounds move whole models once per H steps (12 MB at 20 Mbit/s: 5 s)
    wants_gradient = False

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: DiLoCoConfig | None = None) -> None:
        if config.compression not in CODECS:
            raise LocalProtocolError(f"diloco cannot compress with {config.compression!r} "
                                     f"(it supports: {', '.join(CODECS)})")
        self.config = config
        self.options = (options or DiLoCoConfig()).outer_defaults(config.compression)
        feedback = config.compression in FEEDBACK_CODECS
        if feedback and self.options.gossip_rounds > 1:
            raise LocalProtocolError(f"diloco compresses with {config.compression!r} only with one gossip round "
                                     "per outer step (its error feedback covers our own Delta, not a mix)")
        if feedback and self.options.reduce_scatter:
            raise LocalProtocolError(f"diloco reduce-scatter takes the dense codecs, not {config.compression!r} (its "
                                     "error feedback covers our own Delta, not an owner's average: outer_scatter.py)")
        self.port = port
        self._compressor = None if config.compression == "none" else compressor_from_config(config)
        self._dense = DenseRounds(self.options.dense_rounds, feedback)  # the first rounds' codec (outer_dense.py)
        self._warm = WarmDensity(config, self.options.warmup_topk_fraction)  # "Warm-up" (outer_warm.py)
        self.outer_at_step = port.step  # the inner steps the outer parameters hold (p2p.Swarm.evaluation_step)
        self.stats: dict[str, int] = {"outer_steps": 0, "params_sent": 0, "copies_apart": 0, "boundaries_skipped": 0,
                                      "rounds_realigned": 0, "dense_rounds": 0, "gates_passed": 0,
                                      "warmup_dense_rounds": 0, "warmup_dense_stopped": 0, "warmup_wait_pct": 0}
        self._scatter = None  # the reduce-scatter round (outer_scatter.py): it compresses the slices
        if self.options.reduce_scatter:
            self._scatter = OuterScatter(config.compression, config.compression_block, port.numel, port.model_key,
                                         self.stats)
            self._compressor = None
        # How far the outer parameters (the swarm's model) are apart: from the sketches, and from
        # theta_start itself in the rounds that carry it.
        self.disagreement = Disagreement()
        self.robust = RobustMixing(config.robust_mixing, self.stats)
        # Several gossip rounds per outer step (sparse graphs) leave every copy a little apart by
        # design: theta_start is mixed in every round there, as the averaging needs.
        self._params_every_round = self.options.gossip_rounds > 1
        self._overlap = self.options.overlap and not self._params_every_round
        self._rounds = NeighbourRounds(config.round_timeout_s, self.stats, disagreement=self.disagreement,
                                       robust=self.robust, channels=("params", "delta", "momentum"),
                                       uniform=not self._params_every_round, passed_within=outer_mending.PASSED_WITHIN,
                                       direction_test=not self.options.reduce_scatter)  # robust.py, robust_mean
        self._start = port.snapshot()  # theta_start: the model before the first inner step
        self._positions = sketch_positions(self._start.size)
        self._sketch = self._start[self._positions]  # ours, of the round in flight
        self._sent_params: set[str] = set()  # whom we sent theta_start in the round in flight
        # Repair (outer_repair.py): the link estimates its deadlines come from (its own chunks:
        # a round share's timing mostly measures the sender's lead), both sides of the pull.
        self.monitor = BandwidthMonitor()
        # Catch-ups (outer_catchup.py): with a codec, the last rounds' shares (donor) and our
        # base (puller), within half of theta_start's bytes (beyond, the pull is cheaper). Not with
        # reduce-scatter: no peer holds a round's whole shares there (outer_scatter.py).
        budget = (2 * self._start.size if self._compressor is not None and not self._params_every_round
                  and self._scatter is None else 0)
        self._mend = Mending(self._start.size, port.model_key, self.stats, self.monitor, self.options.outer_lr,
                             self.options.outer_momentum, self.robust, budget)  # both sides (outer_mending.py)
        self._outbox: list[Send] = []  # donor chunks due at an outer step (sent from tick)
        # Round deadlines (module docstring): the usual wait, and who is not waited for.
        self._wait_ewma: float | None = None
        self._began_at = 0.0
        self._wait_for: frozenset = frozenset()
        self._absent: set[str] = set()
        # Copies apart: who repairs and how, replay or pull (outer_copies.py).
        self._watch = CopyWatch(self.options.outer_lr, self.options.outer_momentum, self.robust, self._mend.pullers,
                                self.monitor, self.disagreement, self.stats, on_agreed=self._mend.agreed)
        self._momentum = np.zeros_like(self._start)
        self._syncing = False  # between the boundary and the outer step
        self._shipped: np.ndarray | None = None  # overlap: our own Delta of the round in flight, in full precision
        self._payload: tuple[np.ndarray, ...] = ()
        self._packed = None  # Q(Delta) of the round in flight, when compressing
        # Error feedback (module docstring, "Compression"): what Q left out of our own Deltas
        self._residual = np.zeros_like(self._start) if feedback else None
        self._continue_at = math.inf  # when tick() begins the next gossip round
        self._done = False  # the trainer finished: answer the neighbours' outer rounds
        self._serving: int | None = None  # the round a finished peer begins at its next tick
        self._finals = FinalSketches(MIN_ROUND_TIMEOUT_S)  # finished: the copy the last round left (outer_finals.py)
        self.stats["rounds_served"] = 0
        # Where the outer boundaries are, H fixed or chosen from the link (outer_schedule.py):
        # the (proposal, boundary step) of the neighbours' shares per round, and ours in the
        # round in flight: our proposal and the step of the boundary that began it.
        self._schedule = InnerSchedule(self.options.inner_steps, self._overlap, self.options.warmup_steps,
                                       self.options.warmup_inner_steps)
        self._proposals: dict[int, dict[str, tuple[int, int]]] = {}
        self._proposal = 0
        self._boundary_step = 0
        # The last round when it got no share: (round, our proposal, our step, the (proposal,
        # step) of each share that came late for it), for the schedule (outer_schedule.py rule 5)
        self._alone: tuple[int, int, int, dict[str, tuple[int, int]]] | None = None
        self._gate = TrainerGate(self._overlap)  # the trainer's wait for the round (outer_gate.py)
        self._show_schedule()

    @property
    def self_addr(self) -> str | None:
        return self._watch.self_addr

    @self_addr.setter
    def self_addr(self, addr: str) -> None:
        """Our address (the Peer sets it): it names us in the neighbours' ``mixed`` lists."""
        self._watch.self_addr = addr

    def topology_round(self) -> int:
        if self._serving is not None:
            return self._serving
        return self._rounds.next_round()

    def busy(self) -> bool:
        return self._syncing

    def state_dict(self) -> dict:
        state = {"theta_start": self._start.copy(), "momentum": self._momentum.copy(), "round": self._rounds.round,
                 **self._schedule.state_dict()}
        if self._residual is not None:
            state["residual"] = self._residual.copy()
        return state

    def state_for_joiner(self) -> tuple[dict, np.ndarray]:
        """What a joiner takes: the outer momentum and round, and as its model the outer
        parameters theta_start, not our inner model. It starts its inner steps where the swarm's
        outer step left everyone (its first Delta then counts its own steps only: with our
        inner model it would count our inner progress a second time), and a model less travels.
        It takes our step count too, so its boundaries fall with the swarm's (its first inner
        period is the rest of ours: shorter), and our schedule of H (outer_schedule.py)."""
        return {"momentum": self._momentum.copy(), "round": self._rounds.round,
                **self._schedule.state_dict()}, self._start.copy()

    def load_state_dict(self, state: dict, source: str) -> None:
        """The outer state, from our checkpoint or a donor's (the swarm's outer parameters and
        momentum: a joiner holding them agrees with the sketches at once, no repair). A donor's
        state carries no theta_start: the joiner's model, just loaded, is it."""
        if self._syncing:
            raise ValueError("load_state_dict() during an outer round")
        if source == "peer" and "theta_start" not in state:
            start = self.port.snapshot()
        else:
            start = state_array(state, "theta_start", self.port.numel)
        momentum = state_array(state, "momentum", self.port.numel)
        self._schedule.load_state_dict(state)
        self._schedule.resume_at(self.port.step)
        self.outer_at_step = self.port.step
        self._alone = None
        self._show_schedule()
        residual = None
        if self._residual is not None:
            # Ours from our checkpoint (one written without error feedback has none: zero). A
            # donor's residual is the donor's own unsent progress, never ours: start from zero.
            residual = state_array(state, "residual", self.port.numel) if source != "peer" and "residual" in state \
                else np.zeros_like(start)
        self._rounds.resume_at(state_int(state, "round"))
        self._start, self._momentum = start, momentum
        self._sketch = start[self._positions]
        if residual is not None:
            self._residual = residual

    def next_deadline(self) -> float:
        landed = self._mend.landed or self._watch.replay is not None
        if self._outbox or (landed and not self._syncing):
            return -math.inf  # chunks to send, a pulled state to apply: tick does it now
        scatter = math.inf if self._scatter is None else self._scatter.deadline
        final = self._finals.next_at if self._done and not self._syncing else math.inf
        release = self._gate.release_at(self._began_at, self._wait_ewma, self.stats["outer_steps"])
        return min(self._rounds.wake_at, self._continue_at, scatter, self._mend.next_deadline(), final, release)

    @property
    def outer_parameters(self) -> np.ndarray:
        return self._start

    def training_done(self, step: int, now: float) -> None:
        """The trainer took its last step (and its last outer step): keep taking part in the
        neighbours' outer rounds (module docstring, "Finished peers")."""
        self._done = True
        self._rounds.serving = True
        self._final_changed()
        self._serve(now)

    def _final_changed(self, new_round: bool = True) -> None:
        """Finished, our theta_start moved (or we just finished): our final sketch goes out now
        (outer_finals.py, ``FinalSketches.changed``)."""
        if self._done and not self._params_every_round:  # sparse graphs: copies never equal by design
            self._finals.changed(new_round)

    def _send_final(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        """Our final sketch to every neighbour, when it changed and again now and then."""
        if not self._done or self._syncing or not self._finals.due(now):
            return []
        msg = OuterDone(self._rounds.round, self.port.step, self.port.model_key, self._start[self._positions],
                        self._watch.mixed_last)
        return [Send(j, msg) for j in neighbours]

    def _final_in(self, src: str, msg: OuterDone, now: float, neighbours: Sequence[str]) -> None:
        if msg.model_key != self.port.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.port.model_key!r}")
        _check_sketch(msg.sketch, self._positions)
        if len(msg.mixed) > MAX_MIXED or not all(isinstance(s, str) for s in msg.mixed):
            raise RemoteProtocolError("bad_value", f"mixed: {len(msg.mixed)} entries, want at most {MAX_MIXED} addresses")
        if msg.round < 0 or msg.step < 0:
            raise RemoteProtocolError("bad_value", f"final round {msg.round}, step {msg.step}")
        self._finals.store(src, msg)
        self._compare_finals(now, neighbours)

    def _compare_finals(self, now: float, neighbours: Sequence[str]) -> None:
        """Finished, with every neighbour's final sketch: compare those of our round as a round's
        sketches, and mend our copy if it is outside the reference group (outer_finals.py)."""
        if not self._done or self._syncing or self._mend.in_flight or self._mend.landed \
                or self._watch.replay is not None:
            return
        r = self._rounds.round
        ours = self._finals.comparable(r, neighbours)
        if ours is None:
            return
        for j, (_, sketch, step, mixed) in ours.items():
            self._watch.share_received(r, j, sketch, step, mixed, (r,))
        self._watch.round_finished(r, frozenset(), self._start[self._positions], self.port.step, decide=True)
        if self._watch.pull_from is not None:
            donor, self._watch.pull_from = self._watch.pull_from, None
            self._mend.begin(donor, r, (self._start, self._momentum), now, len(neighbours) + 1, self._round_timeout())

    def _serve(self, now: float) -> None:
        """A finished peer joins the oldest round a neighbour began that it has not."""
        if not self._done or self._syncing:
            return
        served = self._rounds.serve_round()
        if served is None:
            return
        # No inner steps since the last outer step: Delta is zero (the model is theta_start, up
        # to the rounding of the last outer step: sent as an exact zero, robust.py's median
        # leaves it out).
        self._set_payload(self._start, np.zeros_like(self._start), self._momentum)
        self._syncing, self._serving, self._continue_at = True, served, now
        self.stats["rounds_served"] += 1

    def _set_payload(self, start: np.ndarray, delta: np.ndarray, momentum: np.ndarray, own: bool = False) -> None:
        """The round's (theta_start, Delta, momentum), Delta as the neighbours will decode it.
        ``own``: Delta is our own pseudo-gradient, which error feedback tops up (docstring)."""
        self._packed = None
        warm = self._warm.compressor(self._round_step <= self._schedule.warm_end)
        compressor = self._dense.choose(warm or self._compressor, self._rounds.next_round())
        self._warm.sent = warm is not None and compressor is warm
        if compressor is not None:  # the residual is updated in place (outer_codec.py)
            self._packed, delta = pack(compressor, delta, self._residual if own else None)
        self._payload = (start, delta, momentum)

    def _begin(self, now: float, neighbours: Sequence[str], round: int | None = None) -> list[Send]:
        """Begin the next round (``round``: that one, the swarm's at our boundary, outer_schedule.py rule 5)."""
        self._continue_at = math.inf
        start, delta, momentum = own = self._payload
        if self._serving is not None:
            round = self._serving
        step = self._round_step
        if not self._params_every_round:
            self._wait_for = frozenset(j for j in neighbours if j not in self._absent)
            if not self._wait_for:  # never stop waiting for everyone (we would race ahead alone)
                self._wait_for, self._absent = frozenset(neighbours), set()
            if round is None:  # the others finished our next round without us (rounds.py, "Overtaken")
                round = self._rounds.overtaken(self._wait_for)
        plan = None
        if self._scatter is not None:  # the rounds average our own slice with its contributions
            if self.self_addr is None:
                raise LocalProtocolError("diloco reduce-scatter needs the peer's address (Peer sets self_addr)")
            r = self._rounds.next_round() if round is None else round
            # the round's member set is settled now, from our view and the sets of the slices
            # that came for it already (outer_scatter.py, "Who owns what")
            plan, elsewhere = self._scatter.settle(r, self.self_addr, neighbours)
            self._rounds.discard(r, elsewhere)
            own = (start, plan.part(delta, plan.index).copy(), momentum)
        if self._params_every_round:
            r = self._rounds.begin(now, neighbours, self._payload, round=round)
        else:
            r = self._rounds.begin(now, neighbours, own, round=round, timeout_s=self._round_timeout(),
                                   wait_for=self._wait_for, patience_s=self._wait_ewma)  # rounds.py, "Passed by"
        self._began_at = now
        self._serving = None
        self._keep_delta(r, self.self_addr, delta)
        self._sketch = start[self._positions]
        self._mend.round_begins(r, self.self_addr, self._packed, start, momentum)  # catch-ups (outer_catchup.py)
        self._sent_params = set(neighbours) if self._params_every_round else set()
        self.stats["params_sent"] += len(self._sent_params)
        # the exchange as measured: the usual wait of our rounds (outer_schedule.py, "Measured")
        self._proposal = self._schedule.proposal(self._wait_ewma)
        if plan is not None:
            header = dict(round=r, step=step, degree=len(neighbours), model_key=self.port.model_key,
                          sketch=self._sketch, mixed=self._watch.mixed_last, inner_steps=self._proposal)
            sends = self._scatter.begin(r, plan, delta, header)
            self._poll(now)
            return sends
        sends = []
        for params, mom in ((_NO_PARAMS, _NO_PARAMS), (start, momentum)):
            to = [j for j in neighbours if (j in self._sent_params) == (params is start)]
            if not to:
                continue
            if self._packed is None:
                msg = OuterShare(r, step, len(neighbours), self.port.model_key, params, delta,
                                 self._sketch, mom, self._watch.mixed_last, self._proposal)
            else:
                msg = OuterShareQ(**compressed_fields(self._packed), round=r, step=step,
                                  degree=len(neighbours), model_key=self.port.model_key, params=params,
                                  sketch=self._sketch, momentum=mom, mixed=self._watch.mixed_last,
                                  inner_steps=self._proposal)
            sends += [Send(j, msg) for j in to]
        self._poll(now)
        return sends

    @property
    def _round_step(self) -> int:
        """Our step at the boundary that began this outer step (a finished peer: its last): what
        our share says, what our sketch is ranked by (outer_repair.reference_group) and what the
        neighbours' staleness is measured from (with overlap the trainer is past it by then)."""
        return self.port.step if self._done else self._boundary_step

    def _keep_delta(self, round: int, src: str | None, delta: np.ndarray) -> None:
        if not self._params_every_round and self._scatter is None:  # replays: the all-to-all rounds of ``full``
            self._watch.keep_delta(round, self._rounds.round, src, delta)

    def _agree_schedule(self, r: int, mixed, missing: set) -> None:
        """H from the proposals of the set round r averaged, and the swarm's step for it
        (outer_schedule.py, rules 2 and 5)."""
        theirs = self._proposals.pop(r, {})
        averaged = [theirs.get(j, (0, None)) for j in mixed.senders - mixed.refused]
        self._schedule.agree([p for p, _ in averaged] + [self._proposal], short=bool(missing))
        if not self._done:  # a finished peer's boundaries are over
            self._schedule.anchor(r, self._boundary_step, [s for _, s in averaged if s is not None])
        alone = not averaged and not self._done and self._schedule.auto
        self._alone = (r, self._proposal, self._boundary_step, {}) if alone else None
        self._proposals = {k: v for k, v in self._proposals.items() if k > r}
        self._show_schedule()

    def _late_for_the_schedule(self, src: str, msg) -> None:
        """A share came late for our last round, which got none: we began it ahead of the
        others (we held a smaller H) and time it out before theirs come, round after round.
        They averaged it with ours (it was there first): take H and the swarm's step from their
        proposals and steps as they did (outer_schedule.py rules 2 and 5); the copies apart are
        mended as after any missed round."""
        r, proposal, step, late = self._alone
        if msg.round != r or src in late or len(late) >= MAX_MIXED:
            return
        late[src] = (msg.inner_steps, msg.step)
        self._schedule.agree([p for p, _ in late.values()] + [proposal])
        self._schedule.anchor(r, step, [s for _, s in late.values()])
        self._show_schedule()

    def _show_schedule(self) -> None:
        self.stats["inner_steps"] = self._schedule.h  # the H of the period under way, for status
        self.stats["inner_steps_auto"] = int(self._schedule.auto)
        self.stats["warmup_until"] = self._schedule.warm_end if self._schedule.warming_up else 0  # for status

    def _round_timeout(self) -> float:
        """This round's deadline (module docstring): ``ROUND_SLACK`` x the usual wait."""
        cap = self.config.round_timeout_s
        if self._wait_ewma is None:
            return cap
        return min(cap, max(MIN_ROUND_TIMEOUT_S, ROUND_SLACK * self._wait_ewma))

    def _observe_wait(self, mixed, missing: set, now: float) -> None:
        """Learn the usual wait from a round that got every share it waited for; double it
        after one that got some but not all (so slower links never keep rounds timing out);
        whoever we waited for in vain while others came is not waited for until its shares come
        in step again. A round that got nothing (we are the one cut off) changes neither: we go
        on waiting for everyone, at the usual pace, and fall behind the swarm's rounds, which
        we catch up with by a jump (rounds.py) once the link is back."""
        if not mixed.senders:
            return
        self._absent |= missing
        cap = self.config.round_timeout_s
        if missing:
            if self._wait_ewma is not None:
                self._wait_ewma = min(cap, 2 * self._wait_ewma)
        elif self._wait_for:
            wait = now - self._began_at
            self._wait_ewma = wait if self._wait_ewma is None else (
                (1 - WAIT_EWMA_ALPHA) * self._wait_ewma + WAIT_EWMA_ALPHA * wait)

    def _poll(self, now: float) -> None:
        if self._scatter is not None and self._scatter.ready(now):
            self._gathered(now)
        if not self._rounds.ready(now):
            return
        tau = self.config.staleness_tau if self.config.staleness_aware else None
        r = self._rounds.round
        mixed = self._rounds.finish(self._round_step, tau, now)
        if not self._params_every_round:
            # Missing: a neighbour waited for whose share did not come. Not one whose share for a
            # later round is here: it moved on without this round (its rounds were realigned,
            # outer_schedule.py rule 5), in step and not cut, and its link was fast enough.
            missing = self._wait_for - mixed.senders - self._rounds.moved_on()
            self._observe_wait(mixed, missing, now)
            # The dense rounds and the warm-up's density are judged by what the trainer waited for
            # the round (with overlap, not the round's length: it ran beside the next steps)
            waited = self._gate.waited_for(now)
            if self._dense.sent and not missing:
                self._dense.round_ended(waited, self._began_at, self._boundary_step,
                                        self._schedule.step_s, self._schedule.h, self.stats)
            if self._warm.sent and not missing:  # outer_warm.py
                self._warm.round_ended(waited, self._schedule.step_s, self._schedule.h, self.stats)
            if self._scatter is None:  # else when the slices are gathered
                self._watch.note_average(r, mixed.payload[1], mixed, tau is None)
            self._agree_schedule(r, mixed, missing)
        # the step our sketch was taken at, as the neighbours' shares carry theirs: with overlap
        # the trainer is steps past it by now, and ranking our copy by that step put it first
        # in every tie (outer_repair.reference_group): each side of a 2-2 split kept its own
        self._watch.round_finished(r, mixed.refused, self._sketch, self._round_step,
                                   decide=not self._params_every_round)
        self._payload = mixed.payload
        self._packed = None
        if self._rounds.round % self.options.gossip_rounds or self._rounds.behind:
            # More gossip rounds in this outer step, or we fell behind the swarm's rounds (a
            # joiner): tick begins the next round (at the swarm's round number) right away.
            if self._scatter is not None:  # with our whole Delta again, not the slice we averaged
                self._payload = (self._payload[0], self._scatter.delta, self._payload[2])
            self._set_payload(*self._payload)
            self._continue_at = now
            return
        if self._scatter is not None:  # phase 2: our averaged slice to all (outer_scatter.py)
            included = (mixed.senders - mixed.refused) | {self.self_addr}
            # An owner that began with us may wait for a missing contributor up to the longest
            # round timeout: its averaged slice gets our usual one after that. After a round that
            # missed a slice, only the usual one (a dead owner costs that long once).
            timeout = self._round_timeout()
            wait = timeout + max(0.0, self._began_at + self.config.round_timeout_s - now) * self._scatter.complete
            self._outbox += self._scatter.gather(r, self._payload[1], included, now, wait)
            self._poll(now)
            return
        self._outer_step(now)

    def _gathered(self, now: float) -> None:
        """Phase 2 ended: the outer step with the gathered slices, a missing one held."""
        r, delta, skipped, names = self._scatter.finish()
        self._watch.note_average(r, delta, None, not self.config.staleness_aware, names)
        start, _, momentum = self._payload
        self._payload = (start, delta, momentum)
        self._outer_step(now, skipped)

    def _outer_step(self, now: float, skipped=()) -> None:
        opts = self.options
        start, delta, momentum = self._payload
        mu, lr = np.float32(opts.outer_momentum), np.float32(opts.outer_lr)
        if mu == 0:  # SparseLoCo's and local SGD's rule: the same values, 5 model-sized passes fewer
            self._momentum = delta.copy() if skipped else delta  # (nothing else writes either in place;
            # hold() below writes this, and the round's log may hold delta)
            new_start = start - delta if lr == 1 else start - lr * delta
        else:
            self._momentum = mu * momentum + delta
            new_start = start - lr * (delta + mu * self._momentum)
        if self._shipped is not None:  # overlap: keep the inner steps taken since the boundary
            move = self._shipped + (new_start - self._start)
        else:
            move = self.port.snapshot()
            np.subtract(new_start, move, out=move)  # new_start - snapshot, in the snapshot's buffer
        # a slice whose average never came: no outer step there, the model keeps its progress
        hold(skipped, (self._momentum, momentum), (new_start, start), (move, 0.0))
        self.port.add_delta(move)
        self._start, self._shipped = new_start, None
        self._syncing = False
        self._schedule.paused(self._gate.landed(now))  # the trainer's wait for it: not compute
        self._payload = ()
        self.stats["outer_steps"] += 1
        self.outer_at_step = self.port.step if self._done else self._boundary_step
        state = (self._start, self._momentum)
        self._outbox += self._mend.outer_step(self._rounds.round, state, self._watch.mixed_last, now)
        self._apply_repair()
        if self._watch.pull_from is not None:  # a catch-up or a pull (outer_mending.py)
            donor, self._watch.pull_from = self._watch.pull_from, None
            self._mend.begin(donor, self._rounds.round, state, now, len(self._wait_for) + 1, self._round_timeout())
        self._final_changed()
        self._serve(now)  # finished: a neighbour may have begun the next round already

    def _apply_repair(self) -> None:
        """A finished pull (outer_repair.py, "Replay"), catch-up (outer_catchup.py) or a replay
        repair: move our theta_start,
        momentum and model by the difference, carried through the outer steps taken since."""
        if self._syncing:
            return
        if self._watch.replay is not None:
            (round, d_start, d_momentum), self._watch.replay = self._watch.replay, None
            self._correct(round, d_start, d_momentum)
            self._mend.log.reseal(*self._watch.replayed_set)  # the round's set is now the reference's
            self._outbox += self._mend.log.serve_due()  # the catch-ups that waited for it
        for done in self._mend.take():
            self._correct(done.round, done.start - done.own_start, done.momentum - done.own_momentum)
            self._mend.log.forget_before(self._rounds.round)  # our earlier rounds were not the swarm's

    def _correct(self, round: int, d_start: np.ndarray, d_momentum: np.ndarray) -> None:
        opts = self.options
        propagate(d_start, d_momentum, self._rounds.round - round, opts.outer_lr, opts.outer_momentum)
        self._start = self._start + d_start
        self._momentum = self._momentum + d_momentum
        self.port.add_delta(d_start)  # the model keeps its inner progress on the new theta_start
        self._watch.repaired(self._rounds.round)
        self._final_changed(new_round=False)

    # -- step hooks ---------------------------------------------------------------------------
    def gate_wanted(self, step: int) -> bool:
        h = self._schedule
        if step == 2 and self._dense.active:  # the first step's end: the first period's pace (outer_dense.py)
            return True
        if self._overlap:  # the step that closes the next period (module docstring, "Overlap")
            if h.is_boundary(step) and step > h.first_boundary:
                return True
            tau = self.options.overlap_steps  # or tau steps past the boundary ("Bounded overlap")
            return tau is not None and step - 1 - tau > 0 and h.boundary_candidate(step - 1 - tau)
        # right after an outer boundary (H changes only when the round ends: then no gate is due)
        return step > 1 and h.is_boundary(step - 1)

    def after_step_wanted(self, step: int) -> bool:
        return self._schedule.boundary_candidate(step)  # the outer boundaries (after_step checks)

    def may_step(self, step: int, now: float) -> bool:
        self._dense.gate(now)
        if self._syncing and self._continue_at == math.inf:
            self._poll(now)
        if not self._syncing:
            return True
        if not self._gate.may_go(now, self._began_at, self._wait_ewma, self.stats["outer_steps"]):
            return False
        self.stats["gates_passed"] += 1  # each gate passed with the round still in flight
        return True

    def may_finish(self, now: float) -> bool:
        """The trainer's last step was taken: it waits for the round in flight (with overlap,
        the last outer step then lands in the final model, as without)."""
        self._gate.finishing = True  # no going on without the round now
        return self.may_step(0, now)

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        if not self._schedule.is_boundary(step):
            return []
        self._schedule.at_boundary(step, now)
        self._show_schedule()
        if self._syncing:
            # The previous round is still in flight (the trainer went past a gate the safety
            # net released, or it steps after training_done): skip this boundary. Nothing is
            # lost: the next boundary's Delta = theta_start - x covers these steps too.
            self.stats["boundaries_skipped"] += 1
            return []
        round = self._round_here(step)
        if round == -1:  # the swarm's round here is one we took already: skip it, as above
            return []
        self._boundary_step = step
        shipped = self.port.snapshot()
        np.subtract(self._start, shipped, out=shipped)  # theta_start - snapshot, in the snapshot's buffer
        self._set_payload(self._start, shipped, self._momentum, own=True)
        self._shipped = shipped if self._overlap else None
        self._syncing = True
        return self._begin(now, neighbours, round)

    def _round_here(self, step: int) -> int | None:
        """The round our boundary ``step`` begins: the swarm's there (outer_schedule.py, rule 5);
        None: the next, as usual; -1: none, the swarm took its round here at a step we passed."""
        round, usual = self._schedule.round_at(step), self._rounds.next_round()
        if round is None or round == usual or self._rounds.behind:  # behind: far on, rounds.py jumps
            return None
        self.stats["rounds_realigned"] += 1
        return -1 if round < usual else round

    # -- network ------------------------------------------------------------------------------
    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if isinstance(msg, outer_mending.MESSAGES):
            return self._mend.receive(src, msg, now, self._rounds.round, (self._start, self._momentum))
        if isinstance(msg, OuterDone):
            self._final_in(src, msg, now, neighbours)
            return []
        if isinstance(msg, (OuterSlice, OuterGather)) == (self._scatter is None):
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__}: this peer runs diloco "
                                                    f"{'with' if self._scatter else 'without'} --diloco-reduce-scatter")
        if isinstance(msg, OuterGather):
            relays = self._scatter.gather_in(src, msg, self.self_addr)
            if self._syncing and self._continue_at == math.inf:
                self._poll(now)
            return relays
        if isinstance(msg, OuterShare):
            check_params(msg.delta, msg.model_key, self.port)
            delta = msg.delta
        elif isinstance(msg, OuterShareQ):
            delta = received_delta(msg, self.port)
        elif isinstance(msg, OuterSlice):
            delta = self._scatter.slice_in(src, msg, self.self_addr)
            if delta is None:  # sent under another view of the membership (counted)
                return []
        else:
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a DiLoCo message")
        params, momentum = (None, None) if isinstance(msg, OuterSlice) else _received_state(msg, self.port)
        _check_sketch(msg.sketch, self._positions)
        if len(msg.mixed) > MAX_MIXED or not all(isinstance(s, str) for s in msg.mixed):
            raise RemoteProtocolError("bad_value", f"mixed: {len(msg.mixed)} entries, want at most {MAX_MIXED} addresses")
        if not 0 <= msg.inner_steps <= MAX_PROPOSAL:  # a large one is only clamped (outer_schedule.py)
            raise RemoteProtocolError("bad_value", f"inner_steps {msg.inner_steps}, want 0..{MAX_PROPOSAL}")
        if params is None and not isinstance(msg, OuterSlice):  # off the receive buffer: kept past this call
            self._keep_delta(msg.round, src, delta.copy() if isinstance(msg, OuterShare) else delta)
        if self._alone is not None and not isinstance(msg, OuterSlice):
            self._late_for_the_schedule(src, msg)
        if msg.round >= self._rounds.round - 1:
            self._absent.discard(src)  # in step with us again (a late share by one round: a straggler)
        if params is None and isinstance(msg, OuterShareQ):  # for catch-ups, late ones too (outer_catchup.py)
            self._mend.share_in(msg.round, src, msg.payload(), self._rounds.round)
        if self._rounds.offer(src, msg.round, msg.degree, msg.step, (params, delta, momentum)) and params is None:
            # keep sketches and proposals only as long as the rounds do
            self._watch.share_received(msg.round, src, msg.sketch, msg.step, msg.mixed, self._rounds.buffered())
            kept = set(self._rounds.buffered())
            self._proposals = {k: v for k, v in self._proposals.items() if k in kept}
            self._proposals.setdefault(msg.round, {})[src] = (msg.inner_steps, msg.step)
        if self._syncing and self._continue_at == math.inf:
            self._poll(now)
        self._serve(now)
        return []

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        sends, self._outbox = self._outbox, []
        self._mend.drop_if_donor_gone(neighbours)
        self._apply_repair()
        if self._syncing:
            if now >= self._continue_at:
                sends += self._begin(now, neighbours)
            else:
                self._poll(now)
        sends += self._mend.tick(now)
        sends += self._send_final(now, neighbours)
        self._compare_finals(now, neighbours)  # ours changed, or a repair ended: compare again
        return sends
