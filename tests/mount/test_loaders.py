"""Real ML loaders read identical tensors through a fastfs mount and from the source.

Each test writes a file with the framework's own saver into SRC, loads it once from SRC and once
through the mount (plain reads and, where the loader offers it, mmap), and compares every tensor:
same keys, dtypes, shapes and values. These are the readers fastfs's format-aware prefetch is
written for (.npy, torch zip, paddle pickle, safetensors), so both the prefetch plans and the plain
read path are exercised with the access patterns the libraries really produce.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import evict_page_cache, mounted

# Elements of the large tensors: 6M float32 = 24 MiB, several 4 MiB cache blocks and FUSE requests.
BIG_ELEMENTS = 6 * 1024 * 1024
SEED = 1234
# paddle warns about a missing compiler cache on import; irrelevant to loading tensors.
pytestmark = pytest.mark.filterwarnings("ignore:No ccache found:UserWarning")


@pytest.fixture(scope="module")
def ml_tree(tmp_path_factory: pytest.TempPathFactory):
    """Source directory filled by the tests below, and one mount of it for the whole module."""
    base = tmp_path_factory.mktemp("loaders")
    src, mnt = base / "src", base / "mnt"
    src.mkdir()
    mnt.mkdir()
    _write_all(src)
    evict_page_cache(src)
    with mounted(src, mnt) as m:
        yield m


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {
        "big_f32": rng.standard_normal(BIG_ELEMENTS, dtype=np.float32).reshape(2048, -1),
        "weight": rng.standard_normal((512, 256), dtype=np.float32),
        "bias": rng.standard_normal(512, dtype=np.float32),
        "ids": rng.integers(0, 2**40, size=100_003, dtype=np.int64),
        "half": rng.standard_normal((333, 77)).astype(np.float16),
        "scalar": np.array(3.5, dtype=np.float64),
    }


def _write_all(src: Path) -> None:
    import paddle
    import torch
    from safetensors.numpy import save_file

    arrays = _arrays()
    np.save(src / "big.npy", arrays["big_f32"])
    np.save(src / "fortran.npy", np.asfortranarray(arrays["weight"]))
    np.save(src / "ids.npy", arrays["ids"])

    torch_sd = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    torch_sd["bf16"] = torch.from_numpy(arrays["weight"].copy()).to(torch.bfloat16)
    torch.save(torch_sd, src / "model.pt")

    paddle_sd = {k: paddle.to_tensor(v) for k, v in arrays.items() if k != "scalar"}
    paddle.save(paddle_sd, str(src / "model.pdparams"))

    save_file({k: v for k, v in arrays.items() if v.ndim > 0}, str(src / "model.safetensors"))


def _assert_np_equal(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.dtype == b.dtype, what
    assert a.shape == b.shape, what
    assert np.array_equal(a, b), what
    assert a.tobytes() == b.tobytes(), what  # bitwise, NaN-safe


@pytest.mark.parametrize("name", ["big.npy", "fortran.npy", "ids.npy"])
def test_np_load(ml_tree, name: str) -> None:
    m = ml_tree
    ref = np.load(m.src / name)
    got = np.load(m.mnt / name)
    _assert_np_equal(got, ref, name)
    assert got.flags.f_contiguous == ref.flags.f_contiguous


@pytest.mark.parametrize("name", ["big.npy", "fortran.npy", "ids.npy"])
def test_np_load_mmap(ml_tree, name: str) -> None:
    m = ml_tree
    ref = np.load(m.src / name)
    got = np.load(m.mnt / name, mmap_mode="r")
    try:
        assert isinstance(got, np.memmap)
        _assert_np_equal(np.asarray(got), ref, name)
        # random element access through page faults, not just one sequential pass
        rng = np.random.default_rng(7)
        flat_ref, flat_got = ref.reshape(-1, order="A"), np.asarray(got).reshape(-1, order="A")
        idx = rng.integers(0, flat_ref.size, size=1000)
        assert np.array_equal(flat_got[idx], flat_ref[idx])
    finally:
        del got


def _torch_equal(got: dict, ref: dict) -> None:
    import torch

    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype, k
        assert got[k].shape == ref[k].shape, k
        assert torch.equal(got[k], ref[k]), k


def test_torch_load(ml_tree) -> None:
    import torch

    m = ml_tree
    ref = torch.load(m.src / "model.pt", weights_only=True)
    got = torch.load(m.mnt / "model.pt", weights_only=True)
    _torch_equal(got, ref)
    assert got["big_f32"].numel() == BIG_ELEMENTS


def test_torch_load_mmap(ml_tree) -> None:
    import torch

    m = ml_tree
    evict_page_cache(m.src / "model.pt")
    ref = torch.load(m.src / "model.pt", weights_only=True)
    got = torch.load(m.mnt / "model.pt", weights_only=True, mmap=True)
    _torch_equal(got, ref)


def test_torch_load_from_open_file(ml_tree) -> None:
    import torch

    m = ml_tree
    ref = torch.load(m.src / "model.pt", weights_only=True)
    with open(m.mnt / "model.pt", "rb") as f:
        got = torch.load(f, weights_only=True)
    _torch_equal(got, ref)


def test_paddle_load(ml_tree) -> None:
    import paddle

    m = ml_tree
    ref = paddle.load(str(m.src / "model.pdparams"))
    got = paddle.load(str(m.mnt / "model.pdparams"))
    assert set(got) == set(ref) == set(_arrays()) - {"scalar"}
    for k in ref:
        _assert_np_equal(got[k].numpy(), ref[k].numpy(), k)
    _assert_np_equal(got["big_f32"].numpy(), _arrays()["big_f32"], "big_f32 vs original")


def test_safetensors_load_file(ml_tree) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    m = ml_tree
    ref = load_file(str(m.src / "model.safetensors"))
    got = load_file(str(m.mnt / "model.safetensors"))
    assert set(got) == set(ref)
    for k in ref:
        _assert_np_equal(got[k], ref[k], k)
    # lazy, partial access as used by sharded checkpoints
    with safe_open(str(m.mnt / "model.safetensors"), framework="np") as f:
        assert set(f.keys()) == set(ref)
        part = f.get_slice("big_f32")[100:200]
        _assert_np_equal(part, ref["big_f32"][100:200], "slice")


def test_safetensors_torch(ml_tree) -> None:
    from safetensors.torch import load_file

    m = ml_tree
    ref = load_file(str(m.src / "model.safetensors"))
    got = load_file(str(m.mnt / "model.safetensors"))
    _torch_equal(got, ref)


def test_loaders_left_source_unchanged(ml_tree) -> None:
    m = ml_tree
    names = sorted(os.listdir(m.src))
    assert sorted(n for n in os.listdir(m.mnt) if n != ".fastfs") == names
    for n in names:
        assert (m.mnt / n).read_bytes() == (m.src / n).read_bytes(), n
