"""The watcher's RBAC as the deployment grants it, and owner objects for the test API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RBAC = Path(__file__).parents[2] / "deploy" / "rbac" / "k8s-watcher.yaml"


def rules() -> list[dict[str, Any]]:
    """The ClusterRole's rules, checked to be bound to the watcher's ServiceAccount."""
    documents = list(yaml.safe_load_all(RBAC.read_text(encoding="utf-8")))
    by_kind = {d["kind"]: d for d in documents}
    account, role, binding = (
        by_kind["ServiceAccount"],
        by_kind["ClusterRole"],
        by_kind["ClusterRoleBinding"],
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    found: list[dict[str, Any]] = role["rules"]
    return found


def granted() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of everything the ClusterRole grants."""
    return {
        (g, r, v)
        for rule in rules()
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def controlled(name: str, owner: tuple[str, str, str], uid: str) -> dict[str, Any]:
    """An object of namespace `ml` named `name` whose controller is `owner`
    (apiVersion, kind, name) with `uid`, as the watcher looks owners up."""
    api_version, kind, owner_name = owner
    reference = {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner_name,
        "uid": uid,
        "controller": True,
    }
    return {"metadata": {"name": name, "namespace": "ml", "ownerReferences": [reference]}}
