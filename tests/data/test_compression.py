"""LZ4 column compression: bit-exact round trips, the CompressedColumn type, guards."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from flowrl.data import CompressedColumn, MultiAgentBatch, SampleBatch, concat_samples
from flowrl.data.compression import compress_array, decompress_array

pytestmark = pytest.mark.unit


def atari_frames(n: int = 8, seed: int = 0) -> np.ndarray:
    """uint8 frames [n, 84, 84, 4] with a noisy band on large constant regions (like Atari screens)."""
    rng = np.random.default_rng(seed)
    frames = np.zeros((n, 84, 84, 4), np.uint8)
    frames[:, :20] = 87  # constant sky
    frames[:, 60:] = 144  # constant ground
    frames[:, 30:40, 10:30] = rng.integers(0, 256, size=(n, 10, 20, 4), dtype=np.uint8)
    return frames


def special_floats() -> np.ndarray:
    bits = np.array(
        [
            0x7FC00000,  # quiet NaN
            0x7FC00001,  # NaN with payload
            0xFFC00000,  # negative NaN
            0x7F800001,  # signalling NaN
            0x7F800000,  # +inf
            0xFF800000,  # -inf
            0x80000000,  # -0.0
            0x00000000,  # +0.0
            0x00000001,  # smallest subnormal
            0x7F7FFFFF,  # max float
        ],
        dtype=np.uint32,
    )
    return bits.view(np.float32)


# -- round trips ------------------------------------------------------------------------


def test_uint8_frames_round_trip_bit_exact() -> None:
    frames = atari_frames()
    col = compress_array(frames)
    assert isinstance(col, CompressedColumn)
    out = decompress_array(col)
    assert out.dtype == np.uint8
    assert out.shape == (8, 84, 84, 4)
    assert out.tobytes() == frames.tobytes()


def test_float32_round_trip_preserves_nan_inf_and_negative_zero_bits() -> None:
    rng = np.random.default_rng(1)
    arr = np.concatenate([special_floats(), rng.standard_normal(54).astype(np.float32)]).reshape(16, 4)
    out = decompress_array(compress_array(arr))
    assert out.dtype == np.float32 and out.shape == (16, 4)
    np.testing.assert_array_equal(out.view(np.uint32), arr.view(np.uint32))
    assert np.signbit(out.reshape(-1)[6]) and out.reshape(-1)[6] == 0.0


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int16, np.bool_, np.dtype(">f4"), np.dtype("S5")])
def test_round_trip_other_dtypes(dtype: np.dtype) -> None:
    rng = np.random.default_rng(2)
    if np.dtype(dtype).kind == "S":
        arr = np.array([b"ab", b"hello", b"", b"\x00\xff"], dtype=dtype)
    else:
        arr = (rng.standard_normal((6, 3)) * 100).astype(dtype)
    out = decompress_array(compress_array(arr))
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()


def test_non_contiguous_input_round_trips() -> None:
    base = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    arr = base.transpose(1, 0, 2)[:, :, ::2]
    assert not arr.flags.c_contiguous
    out = decompress_array(compress_array(arr))
    np.testing.assert_array_equal(out, arr)


def test_empty_column_round_trips() -> None:
    arr = np.zeros((0, 84, 84, 4), np.uint8)
    col = compress_array(arr)
    assert len(col) == 0
    out = decompress_array(col)
    assert out.shape == (0, 84, 84, 4) and out.dtype == np.uint8


def test_decompressed_array_is_writable_and_owns_no_shared_buffer() -> None:
    frames = atari_frames(2)
    col = compress_array(frames)
    out = decompress_array(col)
    assert out.flags.writeable
    out[0, 0, 0, 0] = 1
    # A second decompression is unaffected by writes to the first.
    assert decompress_array(col)[0, 0, 0, 0] == 87


def test_compressed_column_metadata() -> None:
    frames = atari_frames(5)
    col = compress_array(frames)
    assert len(col) == 5
    assert col.shape == (5, 84, 84, 4)
    assert col.raw_nbytes == frames.nbytes
    assert col.nbytes == len(col.data)
    assert isinstance(col.data, bytes)
    col2 = pickle.loads(pickle.dumps(col))
    assert col2 == col
    np.testing.assert_array_equal(decompress_array(col2), frames)


def test_compressing_object_dtype_raises() -> None:
    arr = np.array([b"abc", b"de", None], dtype=object)
    with pytest.raises(ValueError, match="object"):
        compress_array(arr)


# -- SampleBatch integration ------------------------------------------------------------


def frame_batch(n: int = 16) -> SampleBatch:
    frames = atari_frames(n + 1)
    return SampleBatch(obs=frames[:-1], new_obs=frames[1:], actions=np.arange(n), rewards=np.ones(n, np.float32))


def test_batch_compress_only_obs_columns_by_default_and_round_trip() -> None:
    b = frame_batch()
    ref = b.copy()
    assert not b.is_compressed()
    assert b.compress() is b
    assert b.is_compressed()
    assert type(b["obs"]) is CompressedColumn
    assert type(b["new_obs"]) is CompressedColumn
    assert not isinstance(b["obs"], bytes)
    assert isinstance(b["actions"], np.ndarray)
    assert b.count == 16 == len(b)
    assert b.decompress_if_needed() is b
    assert not b.is_compressed()
    for k in ref:
        assert isinstance(b[k], np.ndarray)
        assert b[k].dtype == ref[k].dtype
        assert b[k].tobytes() == ref[k].tobytes()
    assert b["obs"].flags.writeable


def test_batch_compress_named_columns_and_missing_columns_are_ignored() -> None:
    b = frame_batch(4)
    b.compress(["rewards", "not_there"])
    assert isinstance(b["rewards"], CompressedColumn)
    assert isinstance(b["obs"], np.ndarray)
    assert "not_there" not in b


def test_compress_twice_is_harmless() -> None:
    b = frame_batch(4)
    ref = b["obs"].copy()
    b.compress().compress()
    b.decompress_if_needed()
    np.testing.assert_array_equal(b["obs"], ref)


def test_size_bytes_shrinks_for_redundant_frames() -> None:
    b = frame_batch(32)
    raw = b.size_bytes()
    b.compress()
    compressed = b.size_bytes()
    assert compressed < raw
    obs_raw = 32 * 84 * 84 * 4
    assert obs_raw / b["obs"].nbytes > 5
    assert raw / compressed > 5


@pytest.mark.parametrize("dtype", [object, "S"])
def test_raw_bytes_observations_are_not_mistaken_for_compressed(dtype: object) -> None:
    payloads = [b"\x04\x00\x00\x00abcd", b"\x00" * 9, b"raw-bytes", b"x"]
    obs = np.array(payloads, dtype=dtype)
    b = SampleBatch(obs=obs, actions=[0, 1, 2, 3])
    assert not b.is_compressed()
    assert b.decompress_if_needed() is b
    assert b["obs"] is obs
    assert b["obs"].tolist() == (payloads if dtype is object else [p.rstrip(b"\x00") for p in payloads])
    # Operations that refuse compressed batches work on it.
    assert b[1:3].count == 2


def test_batch_with_object_obs_column_refuses_compression() -> None:
    b = SampleBatch(obs=np.array([b"a", b"bc"], dtype=object), actions=[0, 1])
    with pytest.raises(ValueError, match="object"):
        b.compress()


def test_bytes_dtype_obs_column_compresses_and_round_trips() -> None:
    obs = np.array([b"a\x00b", b"", b"zzzz"], dtype="S4")
    b = SampleBatch(obs=obs, actions=[0, 1, 2])
    b.compress()
    assert isinstance(b["obs"], CompressedColumn)
    b.decompress_if_needed()
    assert b["obs"].dtype == obs.dtype
    assert b["obs"].tobytes() == obs.tobytes()


@pytest.mark.parametrize(
    "op",
    [
        lambda b: b[2:5],
        lambda b: b.slice(0, 3),
        lambda b: b.shuffle(0),
        lambda b: list(b.rows()),
        lambda b: b.timeslices(4),
        lambda b: SampleBatch(b, eps_id=np.zeros(b.count)).split_by_episode(),
    ],
    ids=["getitem", "slice", "shuffle", "rows", "timeslices", "split_by_episode"],
)
def test_row_operations_on_compressed_batch_raise_clear_error(op) -> None:
    b = frame_batch(8).compress()
    with pytest.raises(ValueError, match="decompress_if_needed"):
        op(b)


def test_concat_samples_decompresses_compressed_inputs() -> None:
    a, b = frame_batch(4), frame_batch(6)
    ref = np.concatenate([a["obs"], b["obs"]])
    out = concat_samples([a.compress(), b.compress()])
    assert not out.is_compressed()
    np.testing.assert_array_equal(out["obs"], ref)


def test_copy_of_compressed_batch_round_trips_independently() -> None:
    b = frame_batch(4)
    ref = b["obs"].copy()
    b.compress()
    c = b.copy()
    c.decompress_if_needed()
    assert b.is_compressed()
    np.testing.assert_array_equal(c["obs"], ref)


def test_compressed_batch_pickles() -> None:
    b = frame_batch(4)
    ref = b["obs"].copy()
    b.compress()
    b2 = pickle.loads(pickle.dumps(b))
    assert isinstance(b2, SampleBatch)
    assert b2.is_compressed()
    np.testing.assert_array_equal(b2.decompress_if_needed()["obs"], ref)


def test_multi_agent_compress_and_decompress() -> None:
    ma = MultiAgentBatch({"p0": frame_batch(4), "p1": frame_batch(3)}, env_steps=4)
    refs = {pid: sb["obs"].copy() for pid, sb in ma.policy_batches.items()}
    raw = ma.size_bytes()
    assert ma.compress() is ma
    assert all(sb.is_compressed() for sb in ma.policy_batches.values())
    assert ma.size_bytes() < raw
    assert ma.decompress_if_needed() is ma
    for pid, sb in ma.policy_batches.items():
        assert not sb.is_compressed()
        np.testing.assert_array_equal(sb["obs"], refs[pid])
