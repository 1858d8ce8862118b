"""The endpoint table (`fabricctl.core.endpoints`): every entry is read, simulated, named."""

from __future__ import annotations

from fabricctl.core.endpoints import (
    BY_SOURCE,
    ENDPOINTS,
    POOLING_URLS,
    URL_SOURCES,
    Kind,
    Source,
)
from fabricctl.core.mix import ENDPOINT_NAMES, ENDPOINT_ORDER
from fabricctl.engines.request import POOLING_PATHS
from fabricctl.engines.simendpoints import ASKS, SIMULATED
from fabricctl.formats.endpoints import READERS
from fabricctl.formats.native import ENDPOINTS as NATIVE_ENDPOINTS


def test_every_entry_beyond_completions_and_chat_has_a_reader_and_a_simulated_answer() -> None:
    others = {spec.source for spec in ENDPOINTS if spec.kind is not Kind.GENERATION}
    assert set(READERS) == others
    assert set(ASKS) == others
    assert {spec.url for spec in ENDPOINTS} == SIMULATED


def test_every_source_but_native_has_one_entry_and_one_name() -> None:
    assert set(BY_SOURCE) == set(Source) - {Source.NATIVE}
    names = [spec.name for spec in ENDPOINTS]
    assert len(set(names)) == len(names)
    assert [*names, "unknown"] == ENDPOINT_ORDER
    assert set(NATIVE_ENDPOINTS) == set(names) - {"completions", "chat"}


def test_the_derived_tables_are_the_ones_the_wire_had() -> None:
    assert list(URL_SOURCES) == [
        "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/score",
        "/v1/rerank", "/v1/responses", "/v1/audio/transcriptions", "/score", "/rerank",
        "/v2/rerank"]
    assert URL_SOURCES["/v2/rerank"] is Source.RERANK
    assert ENDPOINT_NAMES[0] == "unknown"
    assert ENDPOINT_NAMES[Source.RERANK] == "rerank"
    assert POOLING_PATHS == POOLING_URLS == {"/v1/embeddings", "/v1/score", "/v1/rerank"}
    assert Source.SCORE.url == "/v1/score"
    assert Source.NATIVE.url is None
