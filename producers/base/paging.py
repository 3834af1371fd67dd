"""Every page of a node's objects from the API server (field selector `spec.nodeName`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from producers.base.kubeapi import ApiCaller

__all__ = ["PAGE", "node_items"]

PAGE = 500


def node_items(api: ApiCaller, path: str, node: str, what: str) -> list[Mapping[str, Any]]:
    """Every page of the objects of collection `path` on `node` (fieldSelector
    spec.nodeName). ValueError for an answer that is not a list of `what`."""
    items: list[Mapping[str, Any]] = []
    token: str | None = None
    while True:
        query = {"fieldSelector": f"spec.nodeName={node}", "limit": str(PAGE)}
        if token:
            query["continue"] = token
        body = json.loads(api.call("GET", f"{path}?{urlencode(query)}"))
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise ValueError(f"the {what} list is not a list")
        items.extend(i for i in body["items"] if isinstance(i, dict))
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items
