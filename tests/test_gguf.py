"""Reading a GGUF file's metadata and tensor table (:mod:`specsample.adapter.gguf`).

A small file written with the ``gguf`` package, holding a value of every metadata type, an
alignment of its own and tensors of several types, reads back as written: the values, and
each tensor's shape and type, and its data where the package's own reader finds it. A file
cut anywhere in its header is refused with a message naming it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from specsample.adapter.gguf import read_gguf, read_gguf_header

gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package")

VALUES = {
    "test.u8": (255, "add_uint8"),
    "test.i8": (-5, "add_int8"),
    "test.u16": (65535, "add_uint16"),
    "test.i16": (-300, "add_int16"),
    "test.u32": (7, "add_uint32"),
    "test.i32": (-70000, "add_int32"),
    "test.f32": (0.5, "add_float32"),
    "test.bool": (True, "add_bool"),
    "test.u64": (1 << 40, "add_uint64"),
    "test.i64": (-(1 << 40), "add_int64"),
    "test.f64": (0.1, "add_float64"),
    "test.string": ("naïve 東京", "add_string"),
    "test.ints": ([1, 2, 3], "add_array"),
    "test.strings": (["a", "", "ü"], "add_array"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    for key, (value, method) in VALUES.items():
        getattr(writer, method)(key, value)
    rng = np.random.default_rng(0)
    writer.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("b", rng.standard_normal((2, 64)).astype(np.float16))
    q8 = gguf.quants.quantize(
        rng.standard_normal((4, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("c", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_metadata_and_tensors_read_back_as_written(written: Path) -> None:
    file = read_gguf(written)
    assert file.version == 3 and file.architecture == "llama"
    assert file.file_bytes == written.stat().st_size and file.metadata["general.alignment"] == 64
    for key, (value, _) in VALUES.items():
        assert file.metadata[key] == pytest.approx(value) if key == "test.f64" else value, key
    assert [(t.name, t.shape, t.kind) for t in file.tensors] == [
        ("a", (3, 5), "F32"),
        ("b", (2, 64), "F16"),
        ("c", (4, 32), "Q8_0"),
    ]
    theirs = gguf.GGUFReader(written)
    assert [t.offset for t in file.tensors] == [t.data_offset for t in theirs.tensors]
    assert all(t.offset % 64 == 0 for t in file.tensors)
    header = read_gguf_header(written)
    assert header.tensor_types == {"F32": 1, "F16": 1, "Q8_0": 1} and header.quantized


def test_a_file_cut_in_its_header_is_refused(written: Path, tmp_path: Path) -> None:
    data = written.read_bytes()
    table_end = read_gguf(written).tensors[0].offset - 64
    for size in (0, 3, 10, 30, 200, 600, table_end):
        path = tmp_path / f"cut{size}.gguf"
        path.write_bytes(data[:size])
        with pytest.raises(ValueError, match=r"GGUF file ends inside its header: .*cut"):
            read_gguf(path)


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (b"GGML" + struct.pack("<I", 3), "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 1), "unsupported version 1"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k" + struct.pack("<I", 99), "type 99"),
    ],
)
def test_other_files_are_refused(tmp_path: Path, start: bytes, message: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(start + bytes(16))
    with pytest.raises(ValueError, match=message):
        read_gguf(path)
