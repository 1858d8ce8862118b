"""The 512-bin length histogram and the batches-per-shape histogram."""

from __future__ import annotations

from fabricctl.core.stats import (
    BATCH_BUCKETS,
    BIN_EDGES,
    NUM_BINS,
    BatchesHistogram,
    LengthHistogram,
    bin_of,
    thrash_reason,
)


def test_512_bins() -> None:
    assert NUM_BINS == 512
    assert len(BIN_EDGES) == 513
    assert LengthHistogram().counts == [0] * 512


def test_piecewise_edges() -> None:
    assert BIN_EDGES[0] == 0
    assert BIN_EDGES[1] == 8
    assert BIN_EDGES[128] == 1024
    assert BIN_EDGES[129] == 1056
    assert BIN_EDGES[352] == 8192
    assert BIN_EDGES[448] == 32768
    assert BIN_EDGES[496] == 131072
    assert BIN_EDGES[512] == 393216
    assert sorted(set(BIN_EDGES)) == BIN_EDGES


def test_bin_of() -> None:
    assert bin_of(0) == 0
    assert bin_of(7) == 0
    assert bin_of(8) == 1
    assert bin_of(1023) == 127
    assert bin_of(1024) == 128
    assert bin_of(393215) == 511
    assert bin_of(10**9) == 511  # the last bin absorbs overflow


def test_empty_histogram() -> None:
    h = LengthHistogram()
    assert h.percentile(50) == 0.0
    assert h.percentiles() == {"p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_single_value() -> None:
    h = LengthHistogram()
    for _ in range(10):
        h.add(100)
    assert h.count == 10
    assert h.min == 100
    assert h.max == 100
    assert h.percentiles() == {"p50": 100.0, "p90": 100.0, "p99": 100.0}


def test_one_item_per_bin_interpolates() -> None:
    h = LengthHistogram()
    for k in range(100):
        h.add(8 * k + 4)  # one item in each of the first 100 bins
    assert h.min == 4
    assert h.max == 796
    assert h.percentile(0) == 4.0  # clamped to the minimum
    assert h.percentile(50) == 400.0
    assert h.percentile(90) == 720.0
    assert h.percentile(99) == 792.0
    assert h.percentile(99.5) == 796.0  # 796 = 792 + 8 x 0.5, the maximum
    assert h.percentile(100) == 796.0  # 800 clamped to the maximum
    assert h.percentiles((25, 75)) == {"p25": 200.0, "p75": 600.0}


def test_two_values() -> None:
    h = LengthHistogram()
    for _ in range(50):
        h.add(100)
        h.add(2000)
    assert h.percentile(25) == 100.0  # 96 + 8 x 0.5
    assert h.percentile(50) == 104.0  # the top of 100's bin
    assert h.percentile(75) == 2000.0  # 1984 + 32 x 0.5
    assert h.percentile(90) == 2000.0  # clamped to the maximum


def test_copy_is_independent() -> None:
    h = LengthHistogram()
    h.add(10)
    c = h.copy()
    h.add(5000)
    h.add(3)
    assert c.count == 1
    assert c.min == 10
    assert c.max == 10
    assert sum(c.counts) == 1
    assert h.count == 3
    assert h.min == 3
    assert h.max == 5000
    c.add(20)
    assert h.count == 3


def test_batches_buckets() -> None:
    assert BATCH_BUCKETS == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)
    h = BatchesHistogram()
    assert len(h.counts) == 14
    for b in (0, 1, 1, 4, 5, 99, 100, 150, 10_000, 50_000):
        h.add(b, thrashed=b in (4, 99))
    # counts[i] holds BATCH_BUCKETS[i-1] <= batches < BATCH_BUCKETS[i]
    assert h.counts == [1, 2, 1, 1, 0, 0, 1, 2, 0, 0, 0, 0, 0, 2]
    assert h.total == 10
    assert h.thrashed == 2  # the verdicts handed in, not every shape under the line
    assert h.samples == [0, 1, 1, 4, 5, 99, 100, 150, 10_000, 50_000]


def test_thrash_line_is_a_bucket_boundary() -> None:
    h = BatchesHistogram(thrash_line=100)
    for b in range(0, 300):
        h.add(b)
    line = BATCH_BUCKETS.index(100)
    assert sum(h.counts[: line + 1]) == 100
    assert h.thrashed == 0  # short shapes with nothing staged again are not thrashing


def test_thrash_line_follows_config() -> None:
    assert thrash_reason(4, 5, 1) and not thrash_reason(5, 5, 1) and not thrash_reason(6, 5, 1)
    assert BatchesHistogram(thrash_line=5).thrash_line == 5


def test_a_short_shape_thrashes_only_when_its_prefix_was_staged_again() -> None:
    # served every item of its prefix in one run: short, however few its batches
    assert thrash_reason(batches=1, line=100, waiting=0) == ""
    assert thrash_reason(batches=99, line=100, waiting=0) == ""
    # at or above the line: amortised, whatever waits
    assert thrash_reason(batches=100, line=100, waiting=500) == ""
    # under the line with items of its prefix staged again: its prefix is prefilled again
    why = thrash_reason(batches=8, line=100, waiting=3)
    assert why == ("finished after 8 batches (< 100) with 3 items of its prefix staged "
                   "again; to gather more per run, raise [broker] activate_multiple or "
                   "stage_timeout_s")
    assert thrash_reason(batches=99, line=100, waiting=1).startswith("finished after 99 ")


def test_samples_are_bounded() -> None:
    h = BatchesHistogram()
    for b in range(1001):
        h.add(b)
    assert h.total == 1001
    assert len(h.samples) == 501
    assert h.samples[0] == 500
    assert h.samples[-1] == 1000
