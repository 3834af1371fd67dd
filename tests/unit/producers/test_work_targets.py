"""Work targets: a pod's gpuwatch.io/work annotations read, and the node's pods listed."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from producers.base.kubeapi import ApiError
from producers.work.targets import (
    ANNOTATION,
    PATH_ANNOTATION,
    PORT_ANNOTATION,
    ApiTargets,
    BadWorkAnnotation,
    WorkTarget,
    parse_target,
)

VLLM = "steps=train_steps_total,tokens=vllm:generation_tokens_total,requests=vllm:request_success"


def target(annotations: Mapping[str, str], pod_ip: str | None = "10.1.2.3") -> WorkTarget | None:
    return parse_target("ml", "serve-0", "uid-1", "gpu-node-1", annotations, pod_ip)


def test_a_pod_that_opts_in_is_scraped_at_its_ip_port_and_path() -> None:
    found = target({ANNOTATION: VLLM, PORT_ANNOTATION: "8000", "other": "x"})
    assert found == WorkTarget(
        uid="uid-1",  # type: ignore[arg-type]
        namespace="ml",
        pod="serve-0",
        node="gpu-node-1",  # type: ignore[arg-type]
        url="http://10.1.2.3:8000/metrics",
        units={
            "steps": "train_steps_total",
            "tokens": "vllm:generation_tokens_total",
            "requests": "vllm:request_success",
        },
    )
    assert found is not None
    assert list(found.units) == ["steps", "tokens", "requests"]


def test_path_spaces_trailing_commas_and_ipv6() -> None:
    found = target(
        {ANNOTATION: " steps = s_total ,\n tokens=t ,", PORT_ANNOTATION: " 9400 ",
         PATH_ANNOTATION: "/v1/metrics?x=1"},
        pod_ip="fd00::12",
    )  # fmt: skip
    assert found is not None
    assert found.url == "http://[fd00::12]:9400/v1/metrics?x=1"
    assert dict(found.units) == {"steps": "s_total", "tokens": "t"}


def test_the_units_of_a_target_cannot_be_changed() -> None:
    found = target({ANNOTATION: "steps=s", PORT_ANNOTATION: "1"})
    assert found is not None
    with pytest.raises(TypeError):
        found.units["tokens"] = "t"  # type: ignore[index]


def test_no_annotation_or_no_ip_yet_is_no_target() -> None:
    assert target({PORT_ANNOTATION: "8000"}) is None
    assert target({ANNOTATION: "steps=s", PORT_ANNOTATION: "8000"}, pod_ip=None) is None
    assert target({ANNOTATION: "steps=s", PORT_ANNOTATION: "8000"}, pod_ip="") is None


@pytest.mark.parametrize(
    ("annotations", "says"),
    [
        ({ANNOTATION: "", PORT_ANNOTATION: "80"}, "names no unit"),
        ({ANNOTATION: " , ", PORT_ANNOTATION: "80"}, "names no unit"),
        ({ANNOTATION: "steps", PORT_ANNOTATION: "80"}, "is not name=metric"),
        ({ANNOTATION: "steps=", PORT_ANNOTATION: "80"}, "names no metric"),
        ({ANNOTATION: "=s_total", PORT_ANNOTATION: "80"}, "unit name ''"),
        ({ANNOTATION: "9steps=s", PORT_ANNOTATION: "80"}, "unit name '9steps'"),
        ({ANNOTATION: "st-eps=s", PORT_ANNOTATION: "80"}, "unit name 'st-eps'"),
        ({ANNOTATION: f"{'u' * 64}=s", PORT_ANNOTATION: "80"}, "unit name"),
        ({ANNOTATION: "steps=a,steps=b", PORT_ANNOTATION: "80"}, "named twice"),
        ({ANNOTATION: "steps=a b", PORT_ANNOTATION: "80"}, "is not a metric name"),
        ({ANNOTATION: 'steps=a{x="1"}', PORT_ANNOTATION: "80"}, "is not a metric name"),
        ({ANNOTATION: "steps=s"}, f"without {PORT_ANNOTATION}"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "http"}, "is not a port"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "0"}, "is not a port"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "65536"}, "is not a port"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "-80"}, "is not a port"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "８０"}, "is not a port"),  # noqa: RUF001
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "80", PATH_ANNOTATION: "metrics"}, "path"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "80", PATH_ANNOTATION: "/a b"}, "path"),
        ({ANNOTATION: "steps=s", PORT_ANNOTATION: "80", PATH_ANNOTATION: ""}, "path"),
    ],
)
def test_each_bad_annotation_says_what_is_wrong(annotations: dict[str, str], says: str) -> None:
    with pytest.raises(BadWorkAnnotation) as bad:
        target(annotations)
    assert says in str(bad.value)
    assert isinstance(bad.value, ValueError)
    with pytest.raises(BadWorkAnnotation):  # whether or not the pod has an IP yet
        target(annotations, pod_ip=None)


def test_the_longest_unit_name_and_metric_names_with_colons_are_good() -> None:
    name = "U" + "_" * 62
    found = target({ANNOTATION: f"{name}=job:steps:rate_total", PORT_ANNOTATION: "80"})
    assert found is not None
    assert dict(found.units) == {name: "job:steps:rate_total"}


# --- ApiTargets against a scripted API --------------------------------------------------


def pod(
    name: str,
    *,
    uid: str | None = None,
    phase: str = "Running",
    ip: str | None = "10.0.0.1",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    meta = {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": status}


OPTED = {ANNOTATION: "steps=s_total", PORT_ANNOTATION: "8000"}


class ScriptedApi:
    """Answers each list with the next page (or error) of a script; records the paths."""

    def __init__(self) -> None:
        self.answers: list[bytes | Exception] = []
        self.paths: list[str] = []

    def call(self, method: str, path: str) -> bytes:
        assert method == "GET"
        self.paths.append(path)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def page(pods: list[dict[str, Any]], token: str | None = None) -> bytes:
    meta = {"continue": token} if token else {}
    return json.dumps({"kind": "PodList", "metadata": meta, "items": pods}).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(api: ScriptedApi, clock: Clock) -> ApiTargets:
    return ApiTargets(lambda: api, "n1", refresh_s=60.0, retry_s=10.0, monotonic=clock)


def test_running_opted_in_pods_with_ips_are_the_targets_listed_by_node() -> None:
    api, clock = ScriptedApi(), Clock()
    api.answers = [
        page(
            [
                pod("a", annotations=OPTED),
                pod("pending", phase="Pending", ip=None, annotations=OPTED),
                pod("done", phase="Succeeded", annotations=OPTED),
                pod("plain"),
                pod("no-ip", ip=None, annotations=OPTED),
            ],
            token="next",
        ),
        page([pod("b", ip="10.0.0.2", annotations={**OPTED, PATH_ANNOTATION: "/m"})]),
    ]
    targets = make(api, clock)
    found = targets.targets()
    assert [(t.pod, t.url, t.node) for t in found] == [
        ("a", "http://10.0.0.1:8000/metrics", "n1"),
        ("b", "http://10.0.0.2:8000/m", "n1"),
    ]
    first, second = (parse_qs(urlsplit(p).query) for p in api.paths)
    assert urlsplit(api.paths[0]).path == "/api/v1/pods"
    assert first == {"fieldSelector": ["spec.nodeName=n1"], "limit": ["500"]}
    assert second["continue"] == ["next"]
    assert (targets.loads, targets.failures) == (1, 0)


def test_the_list_is_kept_between_refreshes_and_after_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = ScriptedApi(), Clock()
    api.answers = [page([pod("a", annotations=OPTED)])]
    targets = make(api, clock)
    assert [t.pod for t in targets.targets()] == ["a"]
    clock.now += 59.0
    assert [t.pod for t in targets.targets()] == ["a"]
    assert len(api.paths) == 1  # cached

    clock.now += 1.0  # due: the API fails, twice; the last list stays
    api.answers = [ApiError("GET pods: HTTP 403 Forbidden", 403), ApiError("no answer")]
    with caplog.at_level(logging.DEBUG, logger="producers.work.targets"):
        assert [t.pod for t in targets.targets()] == ["a"]
        clock.now += 5.0  # before retry_s: not asked
        assert [t.pod for t in targets.targets()] == ["a"]
        assert len(api.paths) == 2
        clock.now += 5.0
        assert [t.pod for t in targets.targets()] == ["a"]
    assert targets.failures == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # one per outage
    assert "403" in warnings[0].getMessage()

    clock.now += 10.0  # back, with another pod
    api.answers = [page([pod("b", annotations=OPTED)])]
    assert [t.pod for t in targets.targets()] == ["b"]
    assert (targets.loads, targets.failures) == (2, 2)


def test_an_answer_that_is_not_a_list_is_a_failure() -> None:
    api, clock = ScriptedApi(), Clock()
    api.answers = [b"not json", b'{"items": 3}']
    targets = make(api, clock)
    assert targets.targets() == ()
    clock.now += 10.0
    assert targets.targets() == ()
    assert targets.failures == 2


def test_a_connection_that_cannot_be_made_is_retried() -> None:
    clock, api, tries = Clock(), ScriptedApi(), []

    def connect() -> ScriptedApi:
        tries.append(1)
        if len(tries) == 1:
            raise ApiError("no usable Kubernetes configuration")
        return api

    targets = ApiTargets(connect, "n1", monotonic=clock)
    assert targets.targets() == ()
    clock.now += 10.0
    api.answers = [page([pod("a", annotations=OPTED)])]
    assert [t.pod for t in targets.targets()] == ["a"]
    assert (len(tries), targets.failures) == (2, 1)


def test_a_bad_annotation_is_logged_and_counted_once_per_pod_and_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = ScriptedApi(), Clock()
    bad = {ANNOTATION: "steps=s", PORT_ANNOTATION: "http"}
    other = {ANNOTATION: "9=s", PORT_ANNOTATION: "80"}
    listing = [pod("bad", annotations=bad), pod("a", annotations=OPTED)]
    api.answers = [
        page(listing),
        page(listing),
        page([pod("bad", annotations={**bad, PORT_ANNOTATION: "htp"}), *listing[1:]]),
        page([pod("bad", annotations=OPTED), pod("other", annotations=other)]),
    ]
    targets = make(api, clock)
    with caplog.at_level(logging.WARNING, logger="producers.work.targets"):
        for _ in range(4):
            found = targets.targets()
            clock.now += 60.0
    assert [t.pod for t in found] == ["bad"]  # fixed: scraped
    assert targets.bad_annotations == 3  # "http", then "htp", then the other pod
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "pod=ml/bad" in messages[0]
    assert "'http' is not a port" in messages[0]
    assert "'htp'" in messages[1]
    assert "pod=ml/other" in messages[2]
