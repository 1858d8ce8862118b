"""Shape signatures: the producer's contract, pinned to literal values."""

from __future__ import annotations

import struct

import xxhash
from hypothesis import given
from hypothesis import strategies as st

from fabricctl.core.signature import component_hash, signature, signature_hex


def test_component_hash_is_xxh3_64_of_utf8() -> None:
    assert component_hash("") == 0x2D06800538D394C2
    assert component_hash("sys") == 0x7B8D50C82E88692D
    assert component_hash("héllo") == xxhash.xxh3_64_intdigest("héllo".encode())


def test_no_components_is_zero() -> None:
    assert signature([]) == 0
    assert signature(()) == 0


def test_signature_literals() -> None:
    assert signature(["sys"]) == 1019451923991535430
    assert signature(["a", "b"]) == 10626161627418588999
    assert signature(["b", "a"]) == 5440175902063259614


def test_order_matters() -> None:
    assert signature(["a", "b"]) != signature(["b", "a"])


def test_one_empty_component_is_not_zero() -> None:
    assert signature([""]) != 0


def test_signature_hex_is_fixed_width() -> None:
    assert signature_hex(0) == "0000000000000000"
    assert signature_hex(5) == "0000000000000005"
    assert signature_hex(2**64 - 1) == "ffffffffffffffff"


@given(st.lists(st.text(max_size=20), min_size=1, max_size=5))
def test_signature_is_hash_of_packed_component_hashes(parts: list[str]) -> None:
    hashes = [xxhash.xxh3_64_intdigest(p.encode("utf-8")) for p in parts]
    packed = b"".join(struct.pack("<Q", h) for h in hashes)
    assert signature(parts) == xxhash.xxh3_64_intdigest(packed)
    assert 0 <= signature(parts) < 2**64
    assert int(signature_hex(signature(parts)), 16) == signature(parts)
