"""The static decode step's caches (mlxcore.models.decode_step, mlxcore.models.decode_fused): masks, RoPE
positions and writes at a fixed size; the fused step's mask carried in the padded key dim. The
step against mlx-lm's generation: tests/mlxio/rl/test_decode.py."""

import mlx.core as mx
import numpy as np

from mlxcore.models import decode_fused, decode_step


def test_fused_cache_masks_by_the_padded_key_dim():
    """Left padding and unwritten slots carry MASKED in the key's dim D, written slots 0; the
    values follow the padded keys; the other padded dims are 0."""
    spec = decode_fused.Spec(2, 1, 4, decode_fused.padded_dim(4), 0.5, 1e-6, None)
    keys = mx.ones((2, 1, 8, 4))
    kv = np.array(decode_fused.decode_cache(keys, 2 * keys, mx.array([2, 0], mx.int32), mx.array([3], mx.int32), spec))
    assert kv.shape == (2, 1, 8, 128)
    flag = kv[:, 0, :, 4]
    np.testing.assert_array_equal(flag != 0, [[1, 1, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    assert (flag[flag != 0] == decode_fused.MASKED).all()
    assert (kv[..., :4] == 1).all() and (kv[..., 64:68] == 2).all()
    assert not kv[..., 5:64].any() and not kv[..., 68:].any()


def test_static_cache_mask_and_positions():
    """A left-padded row sees only its own written slots; RoPE positions start at 0 per row."""
    keys = mx.zeros((2, 1, 8, 4))
    cache = decode_step.StaticKVCache(keys, keys, mx.array([2, 0], mx.int32), mx.array([3], mx.int32))
    mask = np.array(cache.make_mask(1))[:, 0, 0]
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]])
    assert cache.offset.tolist() == [1, 3]
    k, _ = cache.update_and_fetch(mx.ones((2, 1, 1, 4)), mx.ones((2, 1, 1, 4)))
    assert np.array(k)[:, 0, :, 0].tolist() == [[0, 0, 0, 1, 0, 0, 0, 0]] * 2 and cache.idx.tolist() == [4]
