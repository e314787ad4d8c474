"""The histogram facade agrees with hdrh bucket for bucket and with numpy within HDR precision."""
import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from core import histogram as H


@pytest.fixture(scope="module")
def values():
    rng = np.random.default_rng(3)
    edges = np.array([0, 1, 2047, 2048, 2049, 4095, 4096, 10**6, H.HIGHEST_US], dtype=np.int64)
    return np.concatenate([edges, rng.integers(0, 5000, 5000), rng.lognormal(8, 2.5, 20000).astype(np.int64).clip(0, H.HIGHEST_US)])


def test_bucket_index_matches_hdrh(values):
    ref = H.new_hdr()
    assert [ref.get_counts_array_index(int(v)) for v in values[:3000]] == H.bucket_index(values[:3000]).tolist()


def test_bucket_bounds_match_hdrh(values):
    ref = H.new_hdr()
    idx = H.bucket_index(values[:2000])
    assert H.bucket_low(idx).tolist() == [ref.get_lowest_equivalent_value(int(v)) for v in values[:2000]]
    assert H.bucket_high(idx).tolist() == [ref.get_highest_equivalent_value(int(v)) for v in values[:2000]]


@pytest.mark.parametrize("p", [1, 50, 90, 99, 99.9])
def test_percentiles_within_hdr_precision_of_numpy(values, p):
    idx, cnt = H.sparse_counts(values)
    got = H.percentiles(idx, cnt, [p])[0]
    exact = np.percentile(values, p, method="inverted_cdf")
    assert exact <= got <= exact * (1 + 1 / 1024) + 1


def test_merge_of_parts_equals_whole(values):
    # partials summed in any order give the same percentiles as recording everything at once
    parts = np.array_split(values, 7)
    idx = np.concatenate([H.sparse_counts(p)[0] for p in parts])
    cnt = np.concatenate([H.sparse_counts(p)[1] for p in parts])
    whole = H.sparse_counts(values)
    ps = [50, 90, 99, 100]
    assert H.percentiles(idx, cnt, ps) == H.percentiles(*whole, ps)
    assert H.max_value(idx, cnt) == H.max_value(*whole)


def test_encoded_blob_round_trips_through_hdrh(values):
    idx, cnt = H.sparse_counts(values)
    ref = H.new_hdr()
    for v in values:
        ref.record_value(int(v))
    decoded = HdrHistogram.decode(H.encode(idx, cnt))
    assert decoded.get_total_count() == len(values)
    for p in (50, 90, 99, 100):
        assert decoded.get_value_at_percentile(p) == ref.get_value_at_percentile(p)


def test_empty_histogram():
    assert H.percentiles([], [], [50, 99]) == [None, None]
    assert H.max_value([], []) is None
