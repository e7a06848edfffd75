"""Give the C heap's free memory back to the OS after a flood (glibc only).

Why: a flood (a fuzzer, an outsider hammering a node) has the node's threads allocate and free
a great many buffers: hostile messages on the network thread, and in ZeroMQ's I/O thread every
message it takes off a connection (those queued unread while the node is busy: whatever
arrives between two of the network thread's turns, p2p/net/control_port.py). glibc keeps freed memory in its heaps,
resident, fragmented by the few allocations that stay, so the node's RSS grows with the flood
though nothing is alive (bench/fuzz_node.py, an open node at load 25: +13.9% RSS, 50 MB of it
free in two threads' heaps). ``malloc_trim(0)`` returns the free pages inside every heap (not
the free top of a thread's heap: glibc gives that back by itself once past its trim threshold,
which p2p/net/bulk.py's ``_mapped`` keeps hostile senders from raising).

When: whenever the process's anonymous RSS has grown by ``grow_bytes`` since the last look
that found it lower (``Trimmer``), checked every few seconds. Not by counting messages: a
connection flood carries none, and a node starved of CPU (the same flood, or other work on the
machine) reads too few a second to look like a flood, while its heaps grow all the same. A
steady node's RSS does not grow, so it never trims (a trim costs page faults when the memory
is used again); a node whose live data grows trims once per ``grow_bytes``, for nothing.
Elsewhere (musl, macOS, no /proc) there is nothing to call and nothing is read.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Callable, Optional


def _find_trim() -> Optional[Callable[[int], int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _find_trim()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def anonymous_rss() -> Optional[int]:
    """Resident bytes not backed by files (the heaps, not the libraries' code); None without /proc."""
    try:
        with open("/proc/self/statm") as f:
            _size, resident, shared = (int(v) for v in f.read().split()[:3])
    except (OSError, ValueError):
        return None
    return (resident - shared) * _PAGE


GROW_BYTES = 8 << 20
SWING_MODELS = 8  # fp32 model copies an averaging round may allocate and free again


def grow_bytes_for(model_bytes: int) -> int:
    """The growth worth a trim for a node averaging a model of ``model_bytes`` (fp32 host
    copies): a round holds several model-sized arrays (snapshots, payloads, decoded shares) and
    frees them after, so a steady node's heap swings by that much every round; trimming it
    back at each check cost a refault per round (issue 13: 77 trims in 21 DiLoCo rounds of a
    2.2 M-parameter model at 8 MB). Only growth beyond that swing is trimmed."""
    return max(GROW_BYTES, SWING_MODELS * model_bytes)


class Trimmer:
    """Trims the C heap when the anonymous RSS has grown by ``grow_bytes`` (module docstring)."""

    def __init__(self, grow_bytes: int = GROW_BYTES, rss: Callable[[], Optional[int]] = anonymous_rss,
                 trim: Optional[Callable[[int], int]] = _TRIM) -> None:
        self.grow_bytes = grow_bytes
        self.rss, self.trim = rss, trim
        self.base = rss() if trim is not None else None  # the lowest RSS since the last trim
        self.trims = 0

    def check(self) -> bool:
        """Trim if the RSS grew enough; whether it did."""
        if self.base is None:
            return False
        now = self.rss()
        if now is None:
            return False
        if now - self.base < self.grow_bytes:
            self.base = min(self.base, now)  # (memory given back some other way: growth counts from here)
            return False
        self.trim(0)
        self.trims += 1
        self.base = self.rss() or now
        return True
