"""Give the C heap's free memory back to the OS after a flood of messages (glibc only).

Why: a flood of small messages (a fuzzer, an outsider hammering a node) has the network thread
allocate and free hundreds of thousands of buffers; glibc keeps the freed memory in its heaps,
fragmented by the few allocations that stay, so the node's RSS grows with the flood though
nothing is alive (bench/fuzz_node.py, an open node after 100,000 hostile messages: +9% RSS,
with under 2 MB of live Python objects; ``malloc_trim(0)`` brought it back to the start).
``malloc_trim`` returns those free pages; elsewhere (musl, macOS) there is nothing to call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Optional


def _find_trim() -> Optional[Callable[[int], int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _find_trim()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS; False where there is no way to."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
