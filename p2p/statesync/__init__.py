"""State sync: a joining (or restarted) member downloads the swarm's training state from a
live member before its first step, so it neither starts from the random initial model nor
pulls the swarm back towards it. Sans-I/O, like the rest of the protocol core:

- ``messages``: the wire records (control tags 44..47);
- ``joiner``: ``StateJoiner``, the downloading side (find an up-to-date donor, pull the state in
  chunks, fall back to another donor when one goes silent);
- ``donor``: ``StateDonor``, the serving side every member runs (capture once, serve chunks,
  bounded concurrency, optional pacing so a joiner cannot starve the donor's own training).

What the bytes mean (a safetensors blob of model, optimizer and algorithm state) is the training
side's business (p2p/training/state.py): here they are opaque, sized and checked for framing.
"""

from p2p.statesync.donor import StateDonor
from p2p.statesync.joiner import StateJoiner, SyncOutcome
from p2p.statesync.messages import SYNC_MESSAGES, SyncChunk, SyncChunkRequest, SyncConfig, SyncOffer, SyncQuery

__all__ = ["SYNC_MESSAGES", "StateDonor", "StateJoiner", "SyncChunk", "SyncChunkRequest", "SyncConfig",
           "SyncOffer", "SyncOutcome", "SyncQuery"]
