"""Format-aware prefetch planners, checked against files written by the real libraries.

Every plan must lie within the file, cover every payload byte the library stored (located through the
library itself), plan little more than the file for large-payload files, use at most two source reads, and
never raise, whatever the bytes. Here rather than in tests/unit (the pure tests, seconds): the samples are
written by torch, paddle and safetensors, whose imports alone take seconds.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import struct
import sys
import tempfile
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfs.fsio.formats import (
    DETECT_BYTES,
    HEAD_BYTES,
    MAX_READS,
    Plan,
    Reader,
    is_program,
    loader_maps,
    maps_by_name,
    normalize,
    pickle_payloads,
    plan_for,
    safetensors,
    torchzip,
)
from fastfs.fsio.formats import npy as npy_format

BIG = (300, 300)  # float32 elements: 360,000 bytes, far beyond one head
FUZZ_EXAMPLES = 150  # per property: enough to hit every parser branch, modest on a shared 2-core machine


class CountingReader:
    """A read_at over bytes that records its calls (plan_for swallows exceptions, so checks come after)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, offset: int, length: int) -> bytes:
        self.calls.append((offset, length))
        return self.data[offset : offset + length]

    def check(self) -> None:
        assert len(self.calls) <= MAX_READS, self.calls
        for offset, length in self.calls:
            assert offset >= 0 and length > 0 and offset + length <= len(self.data), (offset, length)


def plan_bytes(data: bytes) -> tuple[Plan | None, CountingReader]:
    reader = CountingReader(data)
    plan = plan_for(data[:HEAD_BYTES], len(data), reader)
    reader.check()
    return plan, reader


def assert_within(plan: Plan, size: int) -> None:
    for offset, length in plan.ranges:
        assert offset >= 0 and length > 0 and offset + length <= size, (offset, length, size)


def covered(plan: Plan, start: int, length: int) -> bool:
    """True when every byte of [start, start + length) lies in some planned range."""
    pos, end = start, start + length
    while pos < end:
        hit = [o + n for o, n in plan.ranges if o <= pos < o + n]
        if not hit:
            return False
        pos = max(hit)
    return True


def ratio(plan: Plan, size: int) -> float:
    return plan.total / size


# -- samples written by the real libraries --------------------------------------------------------


def npy_bytes(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def torch_state(n_small: int = 3) -> dict:
    import torch

    gen = torch.Generator().manual_seed(1)
    sd = {f"layer{i}.bias": torch.randn(7 + i, generator=gen) for i in range(n_small)}
    sd["big.weight"] = torch.randn(*BIG, generator=gen)
    sd["steps"] = torch.arange(1000, dtype=torch.int64)
    sd["half"] = torch.randn(64, 64, generator=gen).to(torch.float16)
    return sd


def torch_bytes(obj: object, **kwargs: object) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def paddle_bytes(obj: object) -> bytes:
    import paddle

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pdparams")
        paddle.save(obj, path)
        with open(path, "rb") as f:
            return f.read()


def paddle_state(n: int = 2) -> dict:
    import paddle

    paddle.seed(3)
    sd = {f"fc{i}.w": paddle.randn(list(BIG)) for i in range(n)}
    sd["fc.b"] = paddle.randn([17])
    return sd


def pickle_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "big": rng.standard_normal(BIG).astype(np.float32),
        "small": np.arange(12, dtype=np.int16),
        "mid": rng.standard_normal((120, 120)),
        "u8": rng.integers(0, 255, size=200_000, dtype=np.uint8),
    }


@functools.cache
def samples() -> dict[str, bytes]:
    """One real file per format and flavour, made once per test session."""
    from safetensors.numpy import save as st_save_numpy
    from safetensors.torch import save as st_save_torch

    rng = np.random.default_rng(0)
    out = {
        "npy": npy_bytes(rng.standard_normal(BIG).astype(np.float32)),
        "safetensors_numpy": st_save_numpy({"a": rng.standard_normal(BIG).astype(np.float32), "b": np.arange(9)}),
        "safetensors_torch": st_save_torch(torch_state()),
        "torch": torch_bytes(torch_state()),
        "paddle": paddle_bytes(paddle_state()),
        "pickle4": pickle.dumps(pickle_arrays(), protocol=4),
        "pickle5": pickle.dumps(pickle_arrays(), protocol=5),
    }
    return out


# -- units ----------------------------------------------------------------------------------------


def joined(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Adjacent ranges joined (plans keep each record or tensor apart)."""
    out: list[tuple[int, int]] = []
    for start, length in ranges:
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((start, length))
    return out


def test_normalize_merges_overlaps_in_order_and_clips() -> None:
    assert normalize([(0, 10), (10, 5)], 100) == ((0, 10), (10, 5))  # adjacent records stay apart
    assert normalize([(10, 5), (0, 10)], 100) == ((10, 5), (0, 10))  # order kept: not a forward run
    assert normalize([(0, 10), (20, 10), (5, 20)], 100) == ((0, 30),)  # overlap merges, transitively
    assert normalize([(-5, 10), (95, 10), (50, 0), (200, 4)], 100) == ((0, 5), (95, 5))
    once = normalize([(3, 4), (1, 2), (7, 1), (0, 50), (60, 5)], 64)
    assert normalize(once, 64) == once


def test_reader_serves_head_then_reads_within_budget() -> None:
    data = bytes(range(256)) * 1000
    read_at = CountingReader(data)
    reader = Reader(data[:100], len(data), read_at)  # Reader enforces the budget itself
    assert reader.get(10, 20) == data[10:30] and not read_at.calls
    assert reader.get(5000, 10, want=4000) == data[5000:5010]
    assert reader.get(8000, 100) == data[8000:8100]  # held from the wider read: no call
    assert reader.get(100_000, 10) == data[100_000:100_010]
    assert len(read_at.calls) == 2 and reader.spent
    assert reader.get(200_000, 10) is None  # budget spent
    assert reader.get(len(data) - 5, 10) is None  # beyond the file
    assert reader.get(-1, 2) is None


def test_reader_short_read_is_none() -> None:
    reader = Reader(b"abc", 1000, lambda offset, length: b"xy")
    assert reader.get(500, 10) is None


# -- npy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000),
        np.asfortranarray(np.arange(60, dtype=np.int32).reshape(3, 4, 5)),
        np.array(3.5),
        np.zeros((0, 7), dtype=np.float32),
        np.zeros(10, dtype=[("x", "<f4"), ("y", "<i8", (3,))]),
        np.array([b"ab", b"cde"]),
    ],
    ids=["big", "fortran", "scalar", "empty", "structured", "bytes"],
)
def test_npy_plan_is_the_data_numpy_reads(arr: np.ndarray, tmp_path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, arr)
    data = path.read_bytes()
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.format == "npy" and not reader.calls
    assert_within(plan, len(data))
    mm = np.load(path, mmap_mode="r") if arr.size else None
    if arr.nbytes == 0:
        assert plan.ranges == ()
        return
    assert mm is not None
    assert plan.ranges == ((mm.offset, arr.nbytes),)
    assert data[mm.offset : mm.offset + arr.nbytes] == np.asarray(arr).tobytes(order="A")
    if arr.nbytes > HEAD_BYTES:
        assert 0.9 <= ratio(plan, len(data)) <= 1.01


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_header_versions(version: tuple[int, int]) -> None:
    arr = np.arange(50_000, dtype=np.float32)
    data = npy_bytes(arr, version)
    plan, _ = plan_bytes(data)
    assert plan is not None
    (offset, length) = plan.ranges[0]
    assert length == arr.nbytes and offset + length == len(data)
    assert data[offset:] == arr.tobytes()


def test_npy_python2_header_and_hostile_headers() -> None:
    def make(header: bytes, data: bytes = bytes(48)) -> bytes:
        header = header.ljust(117) + b"\n"  # 10 + 118: data at 128, as numpy aligns it
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data

    py2 = make(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }")
    assert np.load(io.BytesIO(py2)).shape == (2, 3)
    assert plan_bytes(py2)[0] == Plan("npy", ((128, 48),))
    for header in (
        b"{" + b"(" * 100,  # deep nesting
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, -3), }",
        b"{'descr': '<f8', 'fortran_order': 0, 'shape': (2, 3), }",
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",
        b"{'descr': 'nonsense', 'fortran_order': False, 'shape': (2, 3), }",
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3.0), }",
        b"[1, 2, 3]",
        b"__import__('os')",
    ):
        assert plan_bytes(make(header))[0] is None, header
    assert plan_bytes(make(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }"))[0] is None  # short


def test_npy_object_array_has_no_plan() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    assert plan_bytes(buf.getvalue())[0] is None


def test_npy_truncated_data_has_no_plan() -> None:
    data = samples()["npy"]
    for cut in (len(data) - 1, len(data) // 2, 200, 60, 9):
        assert plan_bytes(data[:cut])[0] is None


# -- which loaders map the file (the route on a stream source) ---------------------------------------


@pytest.mark.parametrize(
    ("name", "maps"),
    [
        ("npy", False),  # np.load reads it
        ("torch", False),  # torch.load (mmap=False) reads it
        ("paddle", False),
        ("pickle4", False),
        ("pickle5", False),
        ("safetensors_numpy", True),  # safe_open / load_file map it
        ("safetensors_torch", True),
    ],
)
def test_loader_maps_tells_mapped_formats_from_their_first_page(name: str, maps: bool) -> None:
    head = samples()[name][:DETECT_BYTES]
    assert loader_maps(head) is maps
    # the same module as the planner's: a file planned as safetensors is one whose loader maps it
    plan = plan_for(samples()[name], len(samples()[name]), lambda offset, length: b"")
    assert plan is not None and (plan.format == "safetensors") is maps


def test_programs_and_shared_libraries_are_told_by_their_first_bytes_and_get_no_plan() -> None:
    with open(os.path.realpath(sys.executable), "rb") as f:  # a real ELF program
        head = f.read(HEAD_BYTES)
    assert is_program(head)
    assert plan_for(head, len(head), lambda offset, length: b"") is None
    assert loader_maps(head) is False  # (routes on stream sources stay those of an unknown format)
    for name in sorted(samples()):
        assert not is_program(samples()[name][:DETECT_BYTES]), name
    assert not is_program(b"") and not is_program(b"\x7fEL") and not is_program(b"ELF\x7f" + head[4:])


@pytest.mark.parametrize("head", [b"", b"\x00" * 4096, os.urandom(4096), b"PK\x03", struct.pack("<Q", 1) + b"{"])
def test_loader_maps_is_false_for_what_no_mapping_loader_reads(head: bytes) -> None:
    assert loader_maps(head) is False


@pytest.mark.parametrize(
    ("path", "maps"),
    [
        ("/m/model.safetensors", True),
        ("/m/MODEL.SAFETENSORS", True),
        ("/m/arr.npy", False),
        ("/m/ckpt.pt", False),
        ("/m/ckpt.pth", False),
        ("/m/model.pdparams", False),
        ("/m/opt.pdopt", False),
        ("/m/state.pkl", False),
        ("/m/pytorch_model.bin", None),  # a torch zip or anything: the first page tells
        ("/m/shard-000017.tar", False),  # WebDataset's shards: read in order, no page read to decide
        ("/m/train.tfrecords", False),
        ("/m/tar", None),
        ("/m/npy", None),
        ("/m.safetensors/data", None),  # a directory's name says nothing of its files
    ],
)
def test_maps_by_name_is_a_hint_of_the_usual_names_only(path: str, maps: bool | None) -> None:
    assert maps_by_name(path) is maps


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.binary(max_size=64))
def test_loader_maps_never_raises(head: bytes) -> None:
    assert loader_maps(head) in (True, False)


# -- safetensors ----------------------------------------------------------------------------------


def _safetensors_layout(data: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack_from("<Q", data)
    return 8 + n, json.loads(data[8 : 8 + n])


@pytest.mark.parametrize("name", ["safetensors_numpy", "safetensors_torch"])
def test_safetensors_plan_covers_each_tensor(name: str) -> None:
    from safetensors import safe_open

    data = samples()[name]
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.format == "safetensors" and not reader.calls
    assert_within(plan, len(data))
    base, header = _safetensors_layout(data)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(data)
        f.flush()
        with safe_open(f.name, framework="numpy") as st_file:
            for key in st_file.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                arr = st_file.get_tensor(key)
                begin, end = header[key]["data_offsets"]
                assert data[base + begin : base + end] == arr.tobytes()
                assert covered(plan, base + begin, end - begin), key
    assert plan.ranges[0][0] == base
    assert 0.9 <= ratio(plan, len(data)) <= 1.01


def test_safetensors_header_longer_than_head_uses_one_read() -> None:
    from safetensors.numpy import load, save

    tensors = {f"model.layers.{i}.self_attn.q_proj.weight_with_a_long_name": np.full(4, i, np.float32)
               for i in range(1500)}  # fmt: skip
    tensors["big"] = np.ones(BIG, np.float32)
    data = save(tensors)
    base, _ = _safetensors_layout(data)
    assert base > HEAD_BYTES
    plan, reader = plan_bytes(data)
    assert plan is not None and len(reader.calls) == 1
    assert joined(plan.ranges) == [(HEAD_BYTES, len(data) - HEAD_BYTES)]  # the tensors, back to back
    assert len(plan.ranges) == len(tensors) + 1  # one range per tensor plus the header's tail
    assert load(data)["big"].tobytes() in data[HEAD_BYTES:]


def test_safetensors_invalid_headers() -> None:
    def make(header: object, data: bytes = b"\0" * 16) -> bytes:
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + data

    good = {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    assert plan_bytes(make(good))[0] is not None
    bad = [
        {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}},  # beyond the file
        {"t": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}},  # size does not match shape
        {"t": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}},  # reversed
        {"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
        {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, True]}},
        {"t": {"dtype": 5, "shape": [4], "data_offsets": [0, 16]}},
        {"t": [1, 2]},
        [1, 2, 3],
    ]
    for header in bad:
        assert plan_bytes(make(header))[0] is None, header
    huge = struct.pack("<Q", 10**12) + b"{}"
    assert plan_bytes(huge)[0] is None
    assert plan_bytes(struct.pack("<Q", 2) + b"{x")[0] is None  # not JSON
    data = samples()["safetensors_numpy"]
    assert plan_bytes(data[: len(data) - 1])[0] is None  # last tensor cut


# -- torch zip ------------------------------------------------------------------------------------


def _record_payload(zf: zipfile.ZipFile, data: bytes, info: zipfile.ZipInfo) -> tuple[int, int]:
    """Offset and length of a stored record's payload, from its local header."""
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def _range_index(plan: Plan, offset: int) -> int:
    return next(i for i, (o, n) in enumerate(plan.ranges) if o <= offset < o + n)


@pytest.mark.parametrize("protocol", [2, 4])
def test_torch_plan_directory_then_pickle_then_storages(protocol: int) -> None:
    import torch

    sd = torch_state()
    data = torch_bytes(sd, pickle_protocol=protocol)
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.format == "torchzip" and len(reader.calls) <= MAX_READS
    assert_within(plan, len(data))
    zf = zipfile.ZipFile(io.BytesIO(data))
    assert plan.ranges[0] == (zf.start_dir, len(data) - zf.start_dir)
    pkl = next(i for i in zf.infolist() if i.filename.endswith("/data.pkl"))
    assert plan.ranges[1][0] == pkl.header_offset
    assert covered(plan, *_record_payload(zf, data, pkl))
    storages = [i for i in zf.infolist() if "/data/" in i.filename]
    assert len(storages) == len(sd)
    for info in zf.infolist():
        assert covered(plan, info.header_offset, 30), info.filename
        assert covered(plan, *_record_payload(zf, data, info)), info.filename
    loaded = torch.load(io.BytesIO(data), weights_only=protocol == 2)  # the weights-only unpickler lacks FRAME
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
    big = sd["big.weight"].numpy().tobytes()
    assert covered(plan, data.find(big), len(big))
    assert 0.9 <= ratio(plan, len(data)) <= 1.01
    # heads: the local header of every storage record (torch.load reads each before its payload)
    assert sorted(plan.heads) == sorted((i.header_offset, 30 + len(i.filename.encode())) for i in storages)
    assert all(data[offset : offset + 4] == b"PK\x03\x04" for offset, _ in plan.heads)


def test_torch_storages_follow_pickle_order_not_file_order() -> None:
    import torch

    sd = {"a": torch.randn(100, 100), "b": torch.randn(50), "c": torch.arange(20000)}
    src = zipfile.ZipFile(io.BytesIO(torch_bytes(sd)))
    names = src.namelist()
    storage_names = [n for n in names if "/data/" in n]
    rest = [n for n in names if n not in storage_names]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name in rest[:-2] + storage_names[::-1] + rest[-2:]:  # storages written in reverse key order
            zf.writestr(name, src.read(name))
    data = out.getvalue()
    loaded = torch.load(io.BytesIO(data))
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
    plan, _ = plan_bytes(data)
    assert plan is not None
    zf = zipfile.ZipFile(io.BytesIO(data))
    order = [_range_index(plan, _record_payload(zf, data, zf.getinfo(n))[0]) for n in storage_names]
    assert order == sorted(order) and len(set(order)) == len(order)  # key 0 first, as torch.load reads
    assert [offset for offset, _ in plan.heads] == [zf.getinfo(n).header_offset for n in storage_names]


def test_torch_many_tensors_stays_within_two_reads() -> None:
    import torch

    sd = {f"block.{i}.weight": torch.full((8,), float(i)) for i in range(3000)}
    sd["big"] = torch.randn(*BIG)
    data = torch_bytes(sd)
    plan, reader = plan_bytes(data)
    assert plan is not None and len(reader.calls) <= MAX_READS
    zf = zipfile.ZipFile(io.BytesIO(data))
    for info in zf.infolist():
        assert covered(plan, *_record_payload(zf, data, info)), info.filename
    assert 0.9 <= ratio(plan, len(data)) <= 1.01


def test_zip64_central_directory_fields() -> None:
    name = b"archive/data/0"
    extra = struct.pack("<HH", 0x6666, 4) + b"pad!" + struct.pack("<HHQQQ", 1, 24, 6 << 30, 5 << 30, 7 << 30)
    fixed = struct.pack(
        torchzip.CENTRAL_FMT, torchzip.CENTRAL_SIG, 45, 45, 0, 0, 0, 0, 0,
        0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra), 0, 0, 0, 0, 0xFFFFFFFF,
    )  # fmt: skip
    record = fixed + name + extra
    entries = torchzip.parse_directory(record, 1)
    assert entries == [torchzip.Entry("archive/data/0", 7 << 30, 5 << 30, len(name))]
    assert torchzip.parse_directory(record[:-10], 1) is None
    assert torchzip.parse_directory(record, 2) is None


def test_zip_without_data_pkl_has_no_plan() -> None:
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(10))
    assert plan_bytes(buf.getvalue())[0] is None


def test_torch_truncated_has_no_plan() -> None:
    data = samples()["torch"]
    for cut in (len(data) - 1, len(data) - 30, len(data) // 2, 100):
        assert plan_bytes(data[:cut])[0] is None, cut


# -- pickle protocol 4/5 --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pickle4", "pickle5"])
def test_pickle_plan_covers_array_payloads(name: str) -> None:
    data = samples()[name]
    assert data[:2] == bytes((0x80, int(name[-1])))
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.format == "pickle" and len(reader.calls) <= MAX_READS
    assert_within(plan, len(data))
    for key, arr in pickle_arrays().items():
        payload = arr.tobytes()
        at = data.find(payload)
        assert at >= 0 and covered(plan, at, len(payload)), key
    assert 0.9 <= ratio(plan, len(data)) <= 1.01


def test_paddle_state_dict_plan() -> None:
    import paddle

    sd = paddle_state()
    data = samples()["paddle"]
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.format == "pickle" and len(reader.calls) <= MAX_READS
    assert_within(plan, len(data))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "renamed.bin")
        with open(path, "wb") as f:
            f.write(data)
        loaded = paddle.load(path)
    for key, tensor in sd.items():
        payload = tensor.numpy().tobytes()
        assert np.array_equal(np.asarray(loaded[key]), tensor.numpy())
        at = data.find(payload)
        assert at >= 0 and covered(plan, at, len(payload)), key
    assert 0.9 <= ratio(plan, len(data)) <= 1.01


def test_pickle_walk_is_exact_when_budget_suffices() -> None:
    data = pickle.dumps([np.ones(100_000, np.float32)], protocol=5)
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.ranges == ((0, len(data)),) and len(reader.calls) <= 1
    for tail in (b"not a pickle at all" * 100, b"N" * 50 + bytes(100), pickle.dumps(list(range(9)), protocol=4)):
        plan, _ = plan_bytes(data + tail)
        assert plan is not None and plan.ranges == ((0, len(data)),), tail[:10]  # pickle.load stops at STOP
        assert pickle.loads(data + tail)[0].nbytes == 400_000
    small = pickle.dumps(None, protocol=4)  # too small to be framed
    assert plan_bytes(small)[0] == Plan("pickle", ((0, len(small)),))


def test_pickle_many_payloads_fall_back_to_whole_file() -> None:
    arrays = [np.full(40_000, i, np.float32) for i in range(12)]
    data = pickle.dumps(arrays, protocol=4)
    plan, reader = plan_bytes(data)
    assert plan is not None and plan.ranges == ((0, len(data)),) and len(reader.calls) == MAX_READS


def test_pickle_truncated_or_corrupt_has_no_plan() -> None:
    data = samples()["pickle4"]
    for cut in (len(data) - 1, len(data) // 3, 100, 12):
        assert plan_bytes(data[:cut])[0] is None, cut
    assert plan_bytes(b"\x80\x04\xff" + bytes(100))[0] is None  # unknown opcode
    assert plan_bytes(b"\x80\x04\x95" + struct.pack("<Q", 10**9) + bytes(100))[0] is None  # frame past EOF
    assert plan_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 10**9))[0] is None  # payload past EOF
    assert plan_bytes(b"\x80\x04" + b"N" * 100_000 + b".")[0] is None  # no stdlib pickler writes this


# -- detection by content -------------------------------------------------------------------------


def _plan_file(path: str) -> Plan | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        calls = []

        def read_at(offset: int, length: int) -> bytes:
            calls.append(offset)
            return os.pread(fd, length, offset)

        plan = plan_for(os.pread(fd, HEAD_BYTES, 0), size, read_at)
        assert len(calls) <= MAX_READS
        return plan
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", sorted(["npy", "safetensors_torch", "torch", "paddle", "pickle5"]))
def test_detection_ignores_file_names(name: str, tmp_path) -> None:
    data = samples()[name]
    expected = plan_bytes(data)[0]
    assert expected is not None
    for fname in ("weights.bin", "x.npy", "noext"):
        path = tmp_path / fname
        path.write_bytes(data)
        assert _plan_file(str(path)) == expected


def test_text_and_empty_files_have_no_plan(tmp_path) -> None:
    for fname, content in (("x.npy", b"just some text\n" * 100), ("m.safetensors", b"{}"), ("m.pt", b"PK")):
        path = tmp_path / fname
        path.write_bytes(content)
        assert _plan_file(str(path)) is None
    reader = CountingReader(b"")
    assert plan_for(b"", 0, reader) is None
    assert plan_for(samples()["npy"][:HEAD_BYTES], 0, reader) is None
    assert not reader.calls


def test_failing_source_never_raises() -> None:
    def broken(offset: int, length: int) -> bytes:
        raise OSError(5, "I/O error")

    for name, data in samples().items():
        plan = plan_for(data[:HEAD_BYTES], len(data), broken)
        if plan is not None:  # formats that need no extra read still plan
            assert name in ("npy", "safetensors_numpy", "safetensors_torch")
            assert_within(plan, len(data))


def test_detect_functions() -> None:
    s = samples()
    assert npy_format.detect(s["npy"]) and not npy_format.detect(s["torch"])
    assert safetensors.detect(s["safetensors_numpy"]) and not safetensors.detect(s["npy"])
    assert torchzip.detect(s["torch"]) and not torchzip.detect(s["paddle"])
    assert pickle_payloads.detect(s["paddle"]) and not pickle_payloads.detect(pickle.dumps(1, protocol=2))


# -- fuzz -----------------------------------------------------------------------------------------


def _check_never_raises(data: bytes) -> None:
    plan, _ = plan_bytes(data)  # checks the read budget and the bounds of every read
    if plan is not None:
        assert_within(plan, len(data))
        assert normalize(plan.ranges, len(data)) == plan.ranges
    for module in (npy_format, safetensors, torchzip, pickle_payloads):  # parsers themselves, without the net
        if data and module.detect(data[:HEAD_BYTES]):
            reader = CountingReader(data)
            module.plan(data[:HEAD_BYTES], len(data), reader)
            reader.check()


MAGICS = [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00", b"PK\x03\x04", b"\x80\x04", b"\x80\x05\x95",
          struct.pack("<Q", 40) + b"{"]  # fmt: skip


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.sampled_from(MAGICS), st.binary(max_size=2000))
def test_fuzz_random_bytes(magic: bytes, body: bytes) -> None:
    _check_never_raises(magic + body)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(["npy", "safetensors_numpy", "safetensors_torch", "torch", "paddle", "pickle4", "pickle5"])),
    st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=8),
    st.one_of(st.none(), st.floats(0, 1)),
    st.booleans(),
)
def test_fuzz_mutated_real_files(name: str, flips: list, cut: float | None, near_ends: bool) -> None:
    data = bytearray(samples()[name])
    for where, value in flips:
        if near_ends:  # headers, directories and frame chains live near the ends: hit them often
            index = int(where * 2048) if value % 2 else len(data) - 1 - int(where * 2048)
        else:
            index = int(where * len(data))
        data[max(0, min(index, len(data) - 1))] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    _check_never_raises(bytes(data))


def test_the_engine_preloads_what_the_first_probe_would_import(tmp_path) -> None:
    """The engine's preload, started once the mount is live, imports the parsers on a thread of its
    own, so a fresh daemon's first probe does not; numpy stays out (the .npy planner sizes plain dtypes
    itself)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        from fastfs.config import load_config
        from fastfs.fsio.engine import Engine

        def engine(**overrides):
            config = load_config(overrides={{"readahead.learn": "false", **overrides}}, use_default_path=False)
            return Engine({str(tmp_path)!r}, config)

        on, off = engine(), engine(**{{"readahead.formats": "false"}})
        assert "numpy.lib.format" not in sys.modules and "fastfs.fsio.formats.npy" not in sys.modules
        on.preload().join(60)
        assert "fastfs.fsio.formats.npy" in sys.modules and "fastfs.fsio.formats.safetensors" in sys.modules
        assert "numpy" not in sys.modules
        assert off.preload() is None
        on.close()
        off.close()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "descr",
    ["<f4", ">f8", "<f2", "<f16", "|b1", "<i2", ">u8", "|i1", "<c8", "<c16", "|S5", "|V16", "<U7", "|u1"],
)
def test_npy_plain_dtypes_are_sized_as_numpy_sizes_them(descr: str) -> None:
    """The planner sizes plain dtype strings itself (no numpy import in the daemon for them), as numpy."""
    assert npy_format.itemsize(descr) == np.dtype(descr).itemsize


@pytest.mark.parametrize("descr", ["|O", "<M8[ns]", "<m8[D]", "<i3", "<f12", "<U0", "<i0", "[('a', '<f4')]", 5, None])
def test_npy_other_dtypes_are_left_to_numpy(descr: object) -> None:
    assert npy_format.itemsize(descr) is None


def test_an_npy_of_a_plain_dtype_is_planned_without_numpy(tmp_path) -> None:
    """The daemon does not import numpy (12 MiB, 40-100 ms) to plan a .npy of a plain dtype."""
    import subprocess
    import sys

    arr = np.arange(1000, dtype="<f4").reshape(10, 100)
    np.save(tmp_path / "a.npy", arr)
    data = (tmp_path / "a.npy").read_bytes()
    script = (
        "import sys\n"
        "from fastfs.fsio.formats import npy\n"
        f"assert npy.parse({data[:4096]!r}) == ({len(data) - arr.nbytes}, {arr.nbytes})\n"
        "assert 'numpy' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
