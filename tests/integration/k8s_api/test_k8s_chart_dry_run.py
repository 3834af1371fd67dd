"""Every object the Helm chart renders, with its defaults and with each ci/ values file,
passes the real kube-apiserver's server-side dry-run (`kubectl apply --server-side
--dry-run=server`): its schema, defaulting, validation and admission, with the
Prometheus Operator's CRDs installed. Nothing is stored.

Strimzi's KafkaTopic and KafkaUser are the exception: Strimzi publishes its CRDs with its
releases on GitHub only, out of reach of the registries the tests fetch from; they are
checked offline against their fields (tests/deploy/test_deploy_helm_embedded.py)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException
from support.apiservers import LiveApiServer, monitoring_crds

from schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "gpuwatch"
HELM = ROOT / "scripts" / "helm.sh"
NAMESPACE = "gpuwatch-dryrun"
NOT_SERVED = {"kafka.strimzi.io"}  # CRDs out of reach here (see above)
# Everything the chart can render that the defaults leave off.
EVERYTHING = (
    "--set=serviceMonitor.enabled=true",
    "--set=prometheusRule.enabled=true",
    "--set=grafana.dashboards.enabled=true",
)
VALUES = {
    "defaults": (),
    "everything": EVERYTHING,
    **{f.stem: ("-f", str(f), *EVERYTHING) for f in sorted((CHART / "ci").glob("*.yaml"))},
}


@pytest.fixture(scope="module")
def crds_installed(kube_stack: Settings) -> Settings:
    from support.apiservers import live

    with live(kube_stack) as server:
        for path in monitoring_crds(kube_stack):
            server.apply(yaml.safe_load(path.read_text("utf-8")))
        deadline = time.monotonic() + 60
        for path in monitoring_crds(kube_stack):
            name = yaml.safe_load(path.read_text("utf-8"))["metadata"]["name"]
            while not _established(server, name):
                assert time.monotonic() < deadline, f"CRD {name} not established"
                time.sleep(0.2)
    return kube_stack


def _established(server: LiveApiServer, name: str) -> bool:
    crd = server.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = crd.get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def rendered(*args: str) -> list[dict[str, Any]]:
    import subprocess

    done = subprocess.run(
        [str(HELM), "template", "gpuwatch", str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("values", list(VALUES), ids=list(VALUES))
def test_every_rendered_object_passes_the_servers_dry_run(
    crds_installed: Settings, values: str
) -> None:
    from support.apiservers import live

    documents = rendered(*VALUES[values])
    accepted: Counter[str] = Counter()
    refused: list[str] = []
    skipped: Counter[str] = Counter()
    with live(crds_installed) as server:
        server.apply(  # namespaced objects need their namespace to exist
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        for document in documents:
            group = document["apiVersion"].rpartition("/")[0]
            if group in NOT_SERVED:
                skipped[document["kind"]] += 1
                continue
            document.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
            try:
                server.apply(document, dry_run=True)
            except ApiException as exc:
                refused.append(f"{document['kind']}/{document['metadata']['name']}: {exc.body}")
            else:
                accepted[document["kind"]] += 1
    print(f"{values}: {sum(accepted.values())} objects accepted {dict(accepted)}", file=sys.stderr)
    assert refused == []
    assert sum(accepted.values()) == len(documents) - sum(skipped.values())
    assert set(skipped) <= {"KafkaTopic", "KafkaUser"}
    if values != "defaults":
        assert {"ServiceMonitor", "PrometheusRule"} <= set(accepted)
