"""Checked-in gRPC code equals proto/generate.py output; the protos keep our hygiene rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from snapstream.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)

REPO = Path(__file__).resolve().parent.parent
CHECKED_IN = REPO / "snapstream" / "v1"
FILE_DESCRIPTORS = [common_pb2.DESCRIPTOR, generation_pb2.DESCRIPTOR, prefill_pb2.DESCRIPTOR,
                    decode_pb2.DESCRIPTOR]


def _package_files(root: Path) -> dict[str, bytes]:
    files = (path for path in sorted(root.rglob("*")) if path.is_file())
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in files if "__pycache__" not in path.parts}


def test_checked_in_code_matches_generator(tmp_path: Path) -> None:
    out = tmp_path / "v1"
    subprocess.run([sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(out)],
                   check=True, capture_output=True)
    expected, actual = _package_files(out), _package_files(CHECKED_IN)
    assert sorted(actual) == sorted(expected), "run: python proto/generate.py"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"{stale} differ from the generator's output; run: python proto/generate.py"


def test_every_proto_is_generated() -> None:
    sources = sorted(path.stem for path in (REPO / "proto" / "snapstream" / "v1").glob("*.proto"))
    assert sorted(fd.name.rsplit("/", 1)[1].removesuffix(".proto") for fd in FILE_DESCRIPTORS) \
        == sources


@pytest.mark.parametrize("file_descriptor", FILE_DESCRIPTORS, ids=lambda fd: fd.name)
def test_enums_start_with_prefixed_unspecified(file_descriptor) -> None:
    for enum in file_descriptor.enum_types_by_name.values():
        prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_")
        assert enum.values_by_number[0].name == f"{prefix}_UNSPECIFIED", enum.full_name
        assert all(value.name.startswith(f"{prefix}_") for value in enum.values), enum.full_name


@pytest.mark.parametrize("file_descriptor", FILE_DESCRIPTORS, ids=lambda fd: fd.name)
def test_every_rpc_has_its_own_request_and_response(file_descriptor) -> None:
    for service in file_descriptor.services_by_name.values():
        for method in service.methods:
            assert method.input_type.name == f"{method.name}Request", method.full_name
            assert method.output_type.name == f"{method.name}Response", method.full_name


def test_optional_fields_tell_unset_from_zero() -> None:
    sampling = common_pb2.SamplingParams(temperature=0.0)
    assert sampling.HasField("temperature") and not sampling.HasField("top_p")
    policy = common_pb2.CachePolicy(n_sink=0)
    assert policy.HasField("n_sink") and not policy.HasField("n_recent")
    assert not generation_pb2.GenerateRequest(prompt="hi").HasField("max_new_tokens")


def test_stream_messages_are_chunk_or_complete() -> None:
    chunk = generation_pb2.GenerateResponse(chunk=generation_pb2.GenerateChunk(token_ids=[1, 2]))
    assert chunk.WhichOneof("kind") == "chunk"
    done = decode_pb2.DecodeResponse(complete=decode_pb2.DecodeComplete(
        finish_reason=common_pb2.FINISH_REASON_LENGTH, completion_tokens=2))
    assert decode_pb2.DecodeResponse.FromString(done.SerializeToString()) == done


def test_services_have_stubs_and_servicers() -> None:
    for module, name in [(generation_pb2_grpc, "Generation"), (prefill_pb2_grpc, "Prefill"),
                         (decode_pb2_grpc, "Decode")]:
        assert hasattr(module, f"{name}Stub") and hasattr(module, f"{name}Servicer")
        assert hasattr(module, f"add_{name}Servicer_to_server")
