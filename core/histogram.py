"""The project's one histogram setting, vectorised, and HdrHistogram-compatible.

Latencies are recorded in microseconds into HdrHistogram buckets (3 significant
figures, 1 µs to 1 hour). The job computes bucket indices for a whole batch at once
with numpy, ships sparse ``(bucket, count)`` pairs per window, and readers merge any
time range by summing counts: merge is associative and exact. ``to_hdr`` rebuilds a
real ``hdrh.histogram.HdrHistogram`` from the pairs (for encoded blobs and .hlog files),
and ``percentiles`` gives exactly what ``HdrHistogram.get_value_at_percentile`` would.
"""
from __future__ import annotations

import math

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
"""Smallest value told apart from 0, in µs."""
HIGHEST_US = 3_600_000_000
"""Largest trackable value, in µs (one hour); larger values are counted as overflow."""
SIGNIFICANT_FIGURES = 3
"""Value precision: relative error at most 1/2048 (< 0.05%)."""

_SUB_BUCKET_COUNT = 2 ** math.ceil(math.log2(2 * 10**SIGNIFICANT_FIGURES))  # 2048
_HALF_COUNT = _SUB_BUCKET_COUNT // 2
_HALF_COUNT_MAG = int(math.log2(_HALF_COUNT))
_SUB_BUCKET_MASK = _SUB_BUCKET_COUNT - 1  # unit magnitude 0 (LOWEST_US = 1)


def new_hdr() -> HdrHistogram:
    """An empty HdrHistogram with the project-wide settings."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


NUM_BUCKETS = new_hdr().counts_len
"""Length of the counts array: valid bucket indices are 0 .. NUM_BUCKETS-1."""


def bucket_index(values_us: np.ndarray) -> np.ndarray:
    """HdrHistogram counts-array index of each value (values must be 0 .. HIGHEST_US)."""
    v = np.asarray(values_us, dtype=np.int64)
    # bit length of (v | mask): frexp's exponent is exact for v < 2**53.
    _, exp = np.frexp((v | _SUB_BUCKET_MASK).astype(np.float64))
    bucket = exp.astype(np.int64) - (_HALF_COUNT_MAG + 1)
    sub_bucket = v >> bucket
    return ((bucket + 1) << _HALF_COUNT_MAG) + (sub_bucket - _HALF_COUNT)


def _bucket_bounds(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lowest and highest equivalent value of each bucket index."""
    index = np.asarray(index, dtype=np.int64)
    bucket = (index >> _HALF_COUNT_MAG) - 1
    sub_bucket = (index & (_HALF_COUNT - 1)) + _HALF_COUNT
    first = bucket < 0
    sub_bucket = np.where(first, sub_bucket - _HALF_COUNT, sub_bucket)
    bucket = np.where(first, 0, bucket)
    low = sub_bucket << bucket
    return low, low + (np.int64(1) << bucket) - 1


def bucket_low(index: np.ndarray) -> np.ndarray:
    return _bucket_bounds(index)[0]


def bucket_high(index: np.ndarray) -> np.ndarray:
    return _bucket_bounds(index)[1]


def in_range(values_us: np.ndarray) -> np.ndarray:
    v = np.asarray(values_us)
    return (v >= 0) & (v <= HIGHEST_US)


def sparse_counts(values_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Record values (all in range): sorted unique bucket indices and their counts."""
    idx, counts = np.unique(bucket_index(values_us), return_counts=True)
    return idx.astype(np.int32), counts.astype(np.int64)


def percentiles(index: np.ndarray, counts: np.ndarray, pcts: list[float]) -> list[int | None]:
    """Values at percentiles (0-100) of a sparse histogram, by nearest rank.

    The rank is ceil(p/100 * count) (numpy's ``inverted_cdf``); the value is the highest
    equivalent value of the bucket holding that rank, as HdrHistogram reports it, so the
    result is within HDR precision of the exact order statistic.

    ``index`` need not be sorted or unique (partials from many batches may be passed
    as they are). None for an empty histogram.
    """
    index = np.asarray(index, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return [None] * len(pcts)
    order = np.argsort(index, kind="stable")
    index, counts = index[order], counts[order]
    cum = np.cumsum(counts)
    out = []
    for p in pcts:
        target = max(math.ceil(min(p, 100.0) * total / 100 - 1e-9), 1)
        i = int(np.searchsorted(cum, target, side="left"))
        out.append(int(bucket_high(index[i : i + 1])[0]) if p else int(bucket_low(index[i : i + 1])[0]))
    return out


def max_value(index: np.ndarray, counts: np.ndarray) -> int | None:
    """Highest equivalent value of the largest non-empty bucket (HdrHistogram's max)."""
    index = np.asarray(index)[np.asarray(counts) > 0]
    return int(bucket_high(index.max(keepdims=True))[0]) if index.size else None


def to_hdr(index: np.ndarray, counts: np.ndarray) -> HdrHistogram:
    """A real HdrHistogram holding the given sparse counts."""
    h = new_hdr()
    index = np.asarray(index, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if index.size == 0:
        return h
    dense = np.bincount(index, weights=counts, minlength=NUM_BUCKETS).astype(np.int64)
    nonzero = np.flatnonzero(dense)
    for i in nonzero:
        h.counts[int(i)] = int(dense[i])
    h.set_internal_tacking_values(int(nonzero[0]), int(nonzero[-1]), int(dense.sum()))
    h.min_value = int(bucket_low(nonzero[:1])[0])
    return h


def encode(index: np.ndarray, counts: np.ndarray) -> str:
    """Compressed, base64 HdrHistogram blob (V2 format) as ASCII text."""
    blob = to_hdr(index, counts).encode()
    return blob.decode("ascii") if isinstance(blob, bytes) else blob
