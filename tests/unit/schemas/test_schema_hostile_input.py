"""Hostile input at the codec: deep nesting is a bad message, and dead letters fit in Kafka."""

from __future__ import annotations

import base64
import json

import pytest

from gpuwatch.harness.examples import example
from schemas import DEADLETTER, K8S_PODS, NVML_SAMPLES, DeadLetter, MalformedJSON, SchemaError
from schemas.deadletter import ERROR_CHARS, KEY_CHARS

DEEP = 5_000  # past any reader's recursion limit (msgspec recurses once per level)


def pod_with(field: str, text: str) -> bytes:
    """The example pod event with one field's JSON replaced by `text`."""
    message = example("gpuwatch.k8s.pod/v1")
    message[field] = "@here@"
    return json.dumps(message).replace('"@here@"', text).encode()


def test_deep_nesting_in_an_unknown_field_is_malformed_json_not_a_crash() -> None:
    raw = pod_with("extension", "[" * DEEP + "]" * DEEP)
    with pytest.raises(MalformedJSON, match="nested too deeply") as err:
        K8S_PODS.decode(raw)
    assert err.value.field == "$"


def test_deep_nesting_after_a_wrong_field_reports_that_field() -> None:
    """The field error is found first; looking for the schema then meets the deep part."""
    message = example("gpuwatch.k8s.pod/v1") | {"ts": "soon", "extension": "@here@"}
    raw = json.dumps(message).replace('"@here@"', '{"a":' * DEEP + "1" + "}" * DEEP).encode()
    with pytest.raises(SchemaError) as err:
        K8S_PODS.decode(raw)
    assert err.value.field == "$.ts"
    assert not isinstance(err.value, MalformedJSON)


def test_deep_nesting_of_a_known_field_is_a_type_error_there() -> None:
    with pytest.raises(SchemaError) as err:
        NVML_SAMPLES.decode(
            json.dumps(example("gpuwatch.nvml.sample/v1") | {"gpus": "@"})
            .replace('"@"', "{" + '"a":{' * DEEP + "}" * DEEP + "}")
            .encode()
        )
    assert err.value.field == "$.gpus"


def letter(raw: bytes, key: str = "node-a", error: str = "bad") -> DeadLetter:
    return DeadLetter.from_bytes(
        source_topic="gpuwatch.nvml.samples",
        ts=1764412345120,
        error=error,
        raw=raw,
        key=key,
        partition=2,
        offset=7,
    )


def test_a_letter_that_fits_is_kept_whole() -> None:
    small = letter(b'{"schema": 5}')
    assert small.fitted(1_000) is small


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [
        (b'{"x": "' + b"\x01" * 300_000 + b'"}', "utf-8"),  # each byte escapes to \u0001
        (b'"' * 400_000, "utf-8"),  # each escapes to \"
        ("\u00e9\U0001f680".encode() * 90_000, "utf-8"),  # multi-byte characters
        (bytes(range(256)) * 2_000, "base64"),
    ],
)
def test_a_large_letter_is_cut_to_fit_and_keeps_the_start_of_raw(raw: bytes, encoding: str) -> None:
    whole = letter(raw)
    assert len(DEADLETTER.encode(whole)) > 500_000
    cut = whole.fitted(500_000)
    encoded = DEADLETTER.encode(cut)
    assert 490_000 < len(encoded) <= 500_000  # cut to fit, not far below
    again = DEADLETTER.decode(encoded)
    assert again.raw_encoding == encoding
    kept = again.raw_bytes()
    assert raw.startswith(kept)
    assert 0 < len(kept) < len(raw)
    assert again.error == f"bad (raw cut to the first {len(kept)} of {len(raw)} bytes)"
    assert (again.partition, again.offset, again.key) == (2, 7, "node-a")
    if encoding == "base64":
        assert base64.b64decode(again.raw) == kept


def test_a_huge_key_and_error_are_cut_too() -> None:
    reasons = "; ".join(f"gpu G: pid {pid} mem_bytes 10 > mem_total_bytes" for pid in range(20_000))
    cut = letter(b"{}" * 100, key="k" * 300_000, error=reasons).fitted(100_000)
    encoded = DEADLETTER.encode(cut)
    assert len(encoded) <= 100_000
    assert cut.key == "k" * KEY_CHARS
    assert cut.error.startswith(reasons[:ERROR_CHARS] + f"... ({len(reasons) - ERROR_CHARS} more")
    assert cut.raw_bytes() == b"{}" * 100  # the value itself fits once key and error are cut
    assert cut.error.endswith(" more characters)")


def test_a_limit_without_room_for_the_letter_is_an_error() -> None:
    with pytest.raises(ValueError, match="needs more than 100 bytes"):
        letter(b"x" * 1_000).fitted(100)


@pytest.mark.parametrize("where", ["unknown", "optional"])
def test_bytes_that_are_not_utf8_are_not_json_even_in_a_skipped_field_name(where: str) -> None:
    message = example("gpuwatch.nvml.sample/v1")
    message["gpus"][0]["pcie_replays"] = 0
    raw = json.dumps(message).encode()
    name = b'"extension_x"' if where == "unknown" else b'"pcie_replays"'
    if where == "unknown":
        raw = raw.replace(b'"pcie_replays"', name)
    broken = raw.replace(name, name[:-2] + b"\x89" + name[-1:])
    assert NVML_SAMPLES.decode(raw).gpus[0].pcie_replays in (0, None)
    with pytest.raises(MalformedJSON, match="not UTF-8 at byte") as err:
        NVML_SAMPLES.decode(broken)
    assert err.value.field == "$"
    # UTF-8 beyond ASCII is JSON as ever.
    assert NVML_SAMPLES.decode(raw.replace(b'"gpu-node-17"', '"gpu-nöde"'.encode())).node == (
        "gpu-nöde"
    )
