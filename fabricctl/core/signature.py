"""Shape signatures: the 64-bit id a producer computes from a prompt's cacheable components.

Contract: component hash = xxh3_64 of the component's UTF-8 bytes; the signature is xxh3_64
of those hashes packed as little-endian u64 in order; no components gives 0. Length is never
part of a signature, and the same components in another order are another shape.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash


def component_hash(component: str) -> int:
    """The xxh3_64 of one component's UTF-8 bytes."""
    return xxhash.xxh3_64_intdigest(component.encode("utf-8"))


def signature(components: Sequence[str]) -> int:
    """The shape signature of an ordered list of cacheable prompt components."""
    if not components:
        return 0
    hashes = [component_hash(c) for c in components]
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(hashes)}Q", *hashes))


def signature_hex(sig: int) -> str:
    """The fixed-width hex form shown to operators and accepted by `shapes inspect`."""
    return f"{sig:016x}"
