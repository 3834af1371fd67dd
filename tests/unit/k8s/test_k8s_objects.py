"""Decoding API JSON: lists, watch events (bookmarks, 410), times and quantities."""

from __future__ import annotations

import json

import pytest

from producers.k8s.objects import (
    NODE_DECODER,
    POD_DECODER,
    Bookmark,
    Change,
    MalformedObject,
    StatusError,
    decode_event,
    decode_node_list,
    decode_pod_list,
    parse_quantity,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2025-03-04T09:12:31Z", 1741079551000),
        ("2025-03-04T09:12:31.250Z", 1741079551250),
        ("2025-03-04T09:12:31.123456Z", 1741079551123),
        ("2025-03-04T10:12:31+01:00", 1741079551000),
        (None, None),
        ("", None),
        ("0001-01-01T00:00:00Z", None),  # the API's zero time: unknown
        ("yesterday", None),
        ("2025-03-04T09:12:31", None),  # no zone: not an API time
    ],
)
def test_times_are_epoch_milliseconds_or_none(text: str | None, ms: int | None) -> None:
    assert parse_time(text) == ms


@pytest.mark.parametrize(
    ("quantity", "count"),
    [
        ("8", 8),
        ("1", 1),
        (2, 2),
        ("0", 0),
        ("1k", 1000),
        ("1Ki", 1024),
        ("500m", 1),
        ("1.5", 2),
        ("2e1", 20),
        ("1E", 10**18),
        (1.2, 2),
    ],
)
def test_quantities_are_whole_counts_rounded_up(quantity: str | int | float, count: int) -> None:
    assert parse_quantity(quantity) == count


@pytest.mark.parametrize("quantity", ["", "abc", "1Qi", "--1", True])
def test_a_bad_quantity_is_an_error(quantity: str | bool) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(quantity)


def test_a_pod_list_page_keeps_its_resource_version_and_continue_token(
    fixture: object,
) -> None:
    body = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {
            "resourceVersion": "48213400",
            "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ",
            "remainingItemCount": 3,
        },
        "items": [{"metadata": {"name": "a", "uid": "u1"}, "spec": {"containers": None}}],
    }
    page = decode_pod_list(json.dumps(body).encode())
    assert page.resource_version == "48213400"
    assert page.continue_token == "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"
    assert (page.items[0].get("metadata") or {}).get("uid") == "u1"


def test_the_last_page_has_no_continue_token_and_null_items_are_empty() -> None:
    body = b'{"kind":"NodeList","metadata":{"resourceVersion":"7","continue":""},"items":null}'
    page = decode_node_list(body)
    assert (page.items, page.resource_version, page.continue_token) == ([], "7", None)


def test_a_list_without_resource_version_is_malformed() -> None:
    with pytest.raises(MalformedObject, match="resourceVersion"):
        decode_pod_list(b'{"kind":"PodList","metadata":{},"items":[]}')
    with pytest.raises(MalformedObject):
        decode_pod_list(b"<html>502 Bad Gateway</html>")


def test_a_bookmark_is_read_without_decoding_its_skeleton_object() -> None:
    # What the API server sends: an empty pod whose containers are null.
    line = (
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":'
        b'{"resourceVersion":"48215501","creationTimestamp":null,"annotations":'
        b'{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}}'
    )
    assert decode_event(line, POD_DECODER) == Bookmark("48215501")


def test_a_410_error_event_is_a_status_error() -> None:
    line = (
        b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},'
        b'"status":"Failure","message":"too old resource version: 48213377 (48215100)",'
        b'"reason":"Expired","code":410}}'
    )
    assert decode_event(line, POD_DECODER) == StatusError(
        410, "Expired", "too old resource version: 48213377 (48215100)"
    )


def test_a_change_carries_the_typed_object(fixture: object) -> None:
    node = {
        "metadata": {"name": "n1", "resourceVersion": "9"},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }
    event = decode_event(json.dumps({"type": "MODIFIED", "object": node}).encode(), NODE_DECODER)
    assert isinstance(event, Change)
    assert event.type == "MODIFIED"
    assert event.object == node


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"ADDED","object":{"metadata":{"name":5}}}',  # a field of the wrong type
        b'{"type":"ADDED","object":{"metadata":{"na',  # cut off
        b'{"type":"SOMETHING","object":{}}',
        b'{"type":"BOOKMARK","object":{"metadata":{}}}',
    ],
)
def test_an_unusable_event_is_malformed(line: bytes) -> None:
    with pytest.raises(MalformedObject):
        decode_event(line, POD_DECODER)


def test_one_unusable_item_is_skipped_not_the_whole_list() -> None:
    body = {
        "metadata": {"resourceVersion": "12"},
        "items": [
            {
                "metadata": {"name": "bad"},
                "status": {"containerStatuses": [{"restartCount": "many"}]},
            },
            {"metadata": {"name": "good"}},
        ],
    }
    page = decode_pod_list(json.dumps(body).encode())
    assert [(item.get("metadata") or {}).get("name") for item in page.items] == ["good"]
    assert len(page.skipped) == 1
    assert "restartCount" in str(page.skipped[0])
