"""Shape bucketing (mlxcore.train.buckets): every length maps to one of a few values that holds it."""

from mlxcore.train.buckets import (
    PREFILL_CHUNK,
    bucket_width,
    cache_length,
    decode_buckets,
    padded_length,
    prefill_chunks,
)


def test_decode_buckets():
    assert decode_buckets(1) == [1]
    assert decode_buckets(2) == [1, 2]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(12) == [1, 2, 4, 8, 12]
    assert decode_buckets(128) == [1, 2, 4, 8, 16, 32, 64, 128]


def test_bucket_width_buckets():
    widths = {bucket_width(n) for n in range(1, 4097)}
    assert sorted(widths) == [32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    for n in range(1, 4097):
        w = bucket_width(n)
        assert w % 32 == 0 and n <= w and (w <= 128 or w < 2 * n), (n, w)
        assert all(v < n for v in widths if v < w)  # the smallest bucket that holds n


def test_prefill_chunks():
    assert prefill_chunks(300, False) == [300] and prefill_chunks(300, True) == [256, 32, 8, 4]
    assert prefill_chunks(PREFILL_CHUNK + 5, True) == [PREFILL_CHUNK, 4, 1]
    assert prefill_chunks(PREFILL_CHUNK + 5, False) == [PREFILL_CHUNK, 5]
    sizes = set()
    for n in range(1, 3 * PREFILL_CHUNK):
        chunks = prefill_chunks(n, True)
        assert sum(chunks) == n and chunks == sorted(chunks, reverse=True)
        sizes.update(chunks)
    assert sizes == {1 << k for k in range(PREFILL_CHUNK.bit_length())}


def test_cache_length():
    assert cache_length(100, 156) == 256 and cache_length(100, 157) == 512


def test_padded_length():
    assert padded_length(0, 32) == 32 and padded_length(32, 32) == 32 and padded_length(33, 32) == 64
