"""The Helm chart, rendered offline with `helm template` and checked object by object.

Rendered with the default values, a TLS/SASL production-like file and a simulated-GPU
file (deploy/helm/gpuwatch/ci/). Every Kubernetes object validates against the
Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail); the
Prometheus Operator objects, for which no schema ships here, are checked by structure
and their rules by promtool. The environment is loaded by gpuwatch's own settings
loader, the arguments by its own parser, so a value the processes would refuse fails
here. helm comes from scripts/helm.sh (built once into the cache; minutes the first time).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import kubernetes_validate
import msgspec
import pytest
import yaml
from deploy_chart import helm_path, render, template
from support import run_command

from gpuwatch.cli import build_parser
from gpuwatch.config import load_settings
from schemas.fields import Cluster
from schemas.settings import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuwatch"
TLS_VALUES = CHART / "ci" / "tls-sasl-values.yaml"
SIM_VALUES = CHART / "ci" / "sim-values.yaml"
RBAC = ROOT / "deploy" / "rbac" / "k8s-watcher.yaml"
AGENT_RBAC = ROOT / "deploy" / "rbac" / "node-agent.yaml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml"
THRESHOLD_RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-threshold-rules.yml"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
NAMESPACE = "gpuwatch-system"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
SECRET_VARS = {"GPUWATCH_REDIS_URL", "GPUWATCH_KAFKA_SASL_PASSWORD"}
# Each long-running component and the scrape job the rules and prometheus.yml name it by.
JOBS = {
    "worker": "gpuwatch-worker",
    "sink-redis": "gpuwatch-sink",
    "sink-metrics": "gpuwatch-sink-metrics",
    "k8s-watcher": "gpuwatch-k8s-watcher",
    "node-agent": "gpuwatch-node-agent",
}
# The components that consume Kafka without pricing anything: no price table, no Redis
# but for the Redis sink.
SINKS = {"sink-redis", "sink-metrics"}
PRODUCERS = {"node-agent", "k8s-watcher"}
# The embedded Kafka and Redis run images of their own, not gpuwatch's: left out of the
# checks of gpuwatch's pods here, checked in test_deploy_helm_embedded.py.
EMBEDDED = {"kafka", "redis"}

Object = dict[str, Any]

# The first use may build helm (about 4 minutes on 2 busy cores).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


@pytest.fixture(scope="module")
def default(helm: str) -> list[Object]:
    return render(helm)


@pytest.fixture(scope="module")
def tls(helm: str) -> list[Object]:
    return render(helm, "-f", str(TLS_VALUES))


@pytest.fixture(scope="module")
def sim(helm: str) -> list[Object]:
    return render(helm, "-f", str(SIM_VALUES))


def by_kind(objects: list[Object], kind: str) -> list[Object]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Object], kind: str, component: str) -> Object:
    (found,) = [
        o
        for o in by_kind(objects, kind)
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def pod_specs(objects: list[Object]) -> Iterator[tuple[str, Object]]:
    """The pod templates of gpuwatch's components (not the embedded Kafka's and Redis's)."""
    for o in objects:
        if o["kind"] in {"Deployment", "DaemonSet", "Job", "StatefulSet"}:
            component = o["metadata"]["labels"]["app.kubernetes.io/component"]
            if component not in EMBEDDED:
                yield component, o["spec"]["template"]


def containers(objects: list[Object]) -> Iterator[tuple[str, Object, Object]]:
    """Every gpuwatch container with its component; a first container (`topics`, the topics
    created before a worker or sink starts on the embedded Kafka) as the component it runs."""
    for component, template_ in pod_specs(objects):
        for init in template_["spec"].get("initContainers", []):
            yield init["name"], template_["spec"], init
        for container in template_["spec"]["containers"]:
            yield component, template_["spec"], container


def env_of(container: Object) -> dict[str, Object]:
    return {e["name"]: e for e in container["env"]}


def prometheus_jobs() -> dict[str, int]:
    """Job name -> port of its target in the local stack's prometheus.yml."""
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    return {
        job["job_name"]: int(job["static_configs"][0]["targets"][0].rsplit(":", 1)[1])
        for job in config["scrape_configs"]
        if job["job_name"].startswith("gpuwatch-")
    }


# --- the objects are valid Kubernetes ----------------------------------------------------


@pytest.mark.parametrize(
    ("values", "kube"),
    [((), "1.34.0"), ((), "1.25.0"), (("-f", str(TLS_VALUES)), "1.34.0"),
     (("-f", str(SIM_VALUES)), "1.30.0")],
    ids=["default", "default-min-kube", "tls-sasl", "sim"],
)  # fmt: skip
def test_every_object_validates_against_the_kubernetes_schemas(
    helm: str, values: tuple[str, ...], kube: str
) -> None:
    objects = render(helm, "--kube-version", kube, *values)
    checked = set()
    for o in objects:
        assert o["metadata"]["name"], o
        if o["kind"] in OPERATOR_KINDS:
            assert o["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(o, kube, strict=True)
        checked.add(o["kind"])
    assert {"Deployment", "DaemonSet", "ServiceAccount", "Service"} <= checked


def test_strict_validation_catches_a_misspelt_field(default: list[Object]) -> None:
    worker = json.loads(json.dumps(one(default, "Deployment", "worker")))
    worker["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, "1.34.0", strict=True)


def test_what_each_values_file_renders(
    default: list[Object], tls: list[Object], sim: list[Object]
) -> None:
    def kinds(objects: list[Object]) -> list[str]:
        return sorted(o["kind"] for o in objects)

    # The watcher's role and binding, and the node agent's (its node's ResourceSlices).
    gpuwatch = [
        "ClusterRole", "ClusterRoleBinding", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
        "Deployment", "Deployment", "Deployment", "Deployment", "PodDisruptionBudget",
        "PodDisruptionBudget", "PodDisruptionBudget", "Service", "Service", "Service",
        "Service", "ServiceAccount", "ServiceAccount", "ServiceAccount", "ServiceAccount",
        "ServiceAccount",
    ]  # fmt: skip
    # The embedded Kafka (a StatefulSet, its headless and client Services) and Redis (with
    # the Secret of its password).
    embedded = ["StatefulSet", "Service", "Service", "Deployment", "Service", "Secret"]
    policies = ["NetworkPolicy"] * 7  # one per component, Kafka's and Redis's among them
    assert kinds(default) == sorted([*gpuwatch, *embedded, *policies, "Pod"])
    # Six components' policies (the topics hook's among them) and the test pod's own.
    assert kinds(tls) == sorted(
        [*gpuwatch, "Job", "ConfigMap", "ConfigMap", *["NetworkPolicy"] * 7, "PodMonitor",
         "PrometheusRule", "ServiceMonitor", "ServiceMonitor", "ServiceMonitor",
         "ServiceMonitor", "Pod"]
    )  # fmt: skip
    assert kinds(sim) == sorted(  # a simulated agent reads no ResourceSlices: no role
        ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Deployment", "Deployment",
         "Deployment", "Deployment", "Service", "Service", "Service", "Service",
         "ServiceAccount", "ServiceAccount", "ServiceAccount", "ServiceAccount",
         "ServiceAccount", *embedded, "Pod"]
    )  # fmt: skip
    deployments = {c for c, _ in pod_specs(default)} - {"node-agent", "topics"}
    assert deployments == {"worker", "sink-redis", "sink-metrics", "k8s-watcher"}


# --- security -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", ["default", "tls", "sim"])
def test_every_container_is_locked_down(values: str, request: pytest.FixtureRequest) -> None:
    objects: list[Object] = request.getfixturevalue(values)
    seen = set()
    for component, pod, container in containers(objects):
        seen.add(component)
        context = container["securityContext"]
        assert context == {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, component
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert "/tmp" in mounts  # the one writable path on a read-only root
        for path, mount in mounts.items():
            if path != "/tmp":
                assert mount.get("readOnly") is True, (component, path)
        assert container["resources"]["requests"], component
        assert container["resources"]["limits"]["memory"], component
        root = component == "node-agent" and values != "sim"
        expected = (
            {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}
            if root
            else {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}
        )
        assert {k: pod["securityContext"][k] for k in expected} == expected, component
        assert pod.get("hostPID", False) is root
        assert pod.get("hostNetwork", False) is False
        assert pod.get("hostIPC", False) is False
    assert seen == {"worker", "sink-redis", "sink-metrics", "k8s-watcher", "node-agent", "topics"}


def test_the_node_agent_on_gpu_nodes_has_host_pids_and_read_only_kubelet_mounts(
    tls: list[Object],
) -> None:
    agent = one(tls, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert agent["hostPID"] is True
    assert agent["runtimeClassName"] == "nvidia"
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
    assert host_paths == {
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "pod-logs": "/var/log/pods",
    }
    (container,) = agent["containers"]
    env = env_of(container)
    assert env["GPUWATCH_KUBELET_SOCKET"]["value"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert env["GPUWATCH_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert (env["NVIDIA_VISIBLE_DEVICES"]["value"], env["NVIDIA_DRIVER_CAPABILITIES"]["value"]) == (
        "all",
        "utility",
    )
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])  # takes no GPU from pods


def test_the_simulated_node_agent_needs_nothing_from_the_host(sim: list[Object]) -> None:
    agent = one(sim, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert "hostPID" not in agent
    assert all("hostPath" not in v for v in agent["volumes"])
    assert "nodeSelector" not in agent
    (container,) = agent["containers"]
    assert container["args"][2:] == ["node-agent", "--backend", "sim", "--sim-gpus", "4"]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container)


def test_only_the_watcher_and_the_dra_reading_agent_get_an_api_token(
    helm: str, default: list[Object], sim: list[Object]
) -> None:
    tokens = {c: pod["spec"]["automountServiceAccountToken"] for c, pod in pod_specs(default)}
    assert tokens == {
        "worker": False, "sink-redis": False, "sink-metrics": False, "k8s-watcher": True,
        "node-agent": True,
    }  # fmt: skip
    no_dra = render(
        helm, "--set", "nodeAgent.dra.enabled=false", "--set", "nodeAgent.work.enabled=false"
    )
    agent = one(no_dra, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert agent["automountServiceAccountToken"] is False
    assert env_of(agent["containers"][0])["GPUWATCH_WORK_ENABLED"]["value"] == "false"
    # Either needs the token: units of work alone too.
    work_only = render(helm, "--set", "nodeAgent.dra.enabled=false")
    spec = one(work_only, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    assert env_of(agent["containers"][0])["GPUWATCH_DRA_DRIVERS"]["value"] == ""
    assert [r["metadata"]["labels"]["app.kubernetes.io/component"]
            for r in by_kind(no_dra, "ClusterRole")] == ["k8s-watcher"]  # fmt: skip
    simulated = one(sim, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert simulated["automountServiceAccountToken"] is False  # no kubelet, no slices
    accounts = {a["metadata"]["name"]: a for a in by_kind(default, "ServiceAccount")}
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())
    for component, pod in pod_specs(default):
        if component != "topics":  # a pre-install hook: it runs before the accounts exist
            account = accounts[pod["spec"]["serviceAccountName"]]
            assert account["metadata"]["labels"]["app.kubernetes.io/component"] == component
    assert len(accounts) == 5  # one per long-running component


def test_secrets_come_from_secrets_and_redis_only_to_the_sink(tls: list[Object]) -> None:
    for component, _, container in containers(tls):
        env = env_of(container)
        for name in SECRET_VARS & set(env):
            assert "value" not in env[name], (component, name)
            assert "secretKeyRef" in env[name]["valueFrom"]
        assert ("GPUWATCH_REDIS_URL" in env) is (component == "sink-redis"), component
        assert env["GPUWATCH_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "gpuwatch-kafka-user",
            "key": "password",
        }
    sink = one(tls, "Deployment", "sink-redis")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(sink)["GPUWATCH_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "gpuwatch-redis",
        "key": "url",
    }


@pytest.mark.parametrize("values", ["default", "tls", "sim"])
def test_only_the_sink_talks_to_redis(values: str, request: pytest.FixtureRequest) -> None:
    objects: list[Object] = request.getfixturevalue(values)
    given_url, given_ca = set(), set()
    for component, pod, container in containers(objects):
        if "GPUWATCH_REDIS_URL" in env_of(container):
            given_url.add(component)
        if any(v["name"] == "redis-ca" for v in pod["volumes"]):
            given_ca.add(component)
    assert given_url == {"sink-redis"}
    assert given_ca == ({"sink-redis"} if values == "tls" else set())
    if values == "default":
        sink = one(objects, "Deployment", "sink-redis")["spec"]["template"]["spec"]
        (container,) = sink["containers"]
        # The embedded Redis's Service, with the password of its Secret.
        url = env_of(container)["GPUWATCH_REDIS_URL"]["value"]
        assert url == "redis://:$(REDIS_PASSWORD)@gw-gpuwatch-redis:6379/0"


def test_the_redis_ca_is_mounted_on_the_sink_from_its_secret(tls: list[Object]) -> None:
    sink = one(tls, "Deployment", "sink-redis")["spec"]["template"]["spec"]
    (container,) = sink["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "redis-ca"]
    assert mount == {"name": "redis-ca", "mountPath": "/etc/gpuwatch/redis-ca", "readOnly": True}
    (volume,) = [v for v in sink["volumes"] if v["name"] == "redis-ca"]
    assert volume["secret"] == {
        "secretName": "redis-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }


def test_without_the_sink_nothing_is_given_redis(helm: str) -> None:
    objects = render(helm, "-f", str(TLS_VALUES), "--set", "sinkRedis.enabled=false")
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}
    assert "sink-redis" not in components
    assert {"worker", "k8s-watcher", "node-agent"} <= components
    for component, pod, container in containers(objects):
        assert "GPUWATCH_REDIS_URL" not in env_of(container), component
        assert all(v["name"] != "redis-ca" for v in pod["volumes"]), component
    monitors = by_kind(objects, "ServiceMonitor")
    assert {m["spec"]["endpoints"][0]["relabelings"][0]["replacement"] for m in monitors} == {
        "gpuwatch-worker",
        "gpuwatch-sink-metrics",
        "gpuwatch-k8s-watcher",
    }


def test_without_the_metrics_sink_nothing_of_it_is_rendered(helm: str) -> None:
    objects = render(helm, "-f", str(TLS_VALUES), "--set", "sinkMetrics.enabled=false")
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}
    assert "sink-metrics" not in components
    assert {"worker", "sink-redis", "k8s-watcher", "node-agent"} <= components
    monitors = by_kind(objects, "ServiceMonitor")
    assert {m["spec"]["endpoints"][0]["relabelings"][0]["replacement"] for m in monitors} == {
        "gpuwatch-worker",
        "gpuwatch-sink",
        "gpuwatch-k8s-watcher",
    }
    # Its replicas are not held against the partitions while it is off.
    assert template(helm, "--set", "sinkMetrics.enabled=false", "--set",
                    "sinkMetrics.replicas=13").returncode == 0  # fmt: skip


def test_the_metrics_sink_needs_kafka_alone(tls: list[Object]) -> None:
    """No Redis, no prices, no API token: its pod has Kafka's settings and CA, and /tmp."""
    deployment = one(tls, "Deployment", "sink-metrics")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][2:] == ["sink", "metrics"]
    env = env_of(container)
    assert not {"GPUWATCH_REDIS_URL", "GPUWATCH_PRICES"} & set(env)
    assert env["GPUWATCH_KAFKA_BOOTSTRAP"]["value"].startswith("kafka-0.kafka.svc:9093")
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "kafka-ca"}
    assert pod["automountServiceAccountToken"] is False
    assert "annotations" not in deployment["spec"]["template"]["metadata"]  # no price checksum


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (["--set", "redis.url=redis://:hunter2@redis:6379/0"], "redis.url holds credentials"),
        (["--set", "settings.GPUWATCH_REDIS_URL=redis://r:6379/0"], "is a secret"),
        (["--set", "settings.GPUWATCH_KAFKA_SASL_PASSWORD=x"], "is a secret"),
        (["--set", "settings.GPUWATCH_KAFKA_BOOTSTRAP=k:9092"], "is set by the chart"),
        (["--set", "settings.OTHER=1"], "only GPUWATCH_* settings"),
        (["--set", "kafka.sasl.enabled=true"], "needs kafka.sasl.passwordSecret.name"),
        (["--set", "worker.replicas=13"], "worker.replicas (13) exceeds kafka.partitions (12)"),
        (["--set", "sinkRedis.replicas=13"],
         "sinkRedis.replicas (13) exceeds kafka.partitions (12)"),
        (["--set", "settings.GPUWATCH_SINK_METRICS_PORT=1"], "is set by the chart"),
        (["--set", "sinkMetrics.replicas=13"],
         "sinkMetrics.replicas (13) exceeds kafka.partitions (12)"),
        (["--set", "settings.GPUWATCH_SINK_EXPORTER_PORT=1"], "is set by the chart"),
        # values.schema.json refuses these first (test_deploy_helm_schema.py); the templates'
        # own checks stand where it is skipped.
        (["--skip-schema-validation", "--set", "nodeAgent.backend=dcgm"],
         "nodeAgent.backend: nvml or sim"),
        (["--skip-schema-validation", "--set", "prometheusRule.enabled=true",
          "--set", "prometheusRule.alertsFrom=metrics"],
         "prometheusRule.alertsFrom: stream or thresholds"),
        (["--skip-schema-validation", "--set", "cluster.name=eu west"],
         'cluster.name "eu west": 1 to 63 letters'),
        (["--skip-schema-validation", "--set", "cluster.name=" + "x" * 64],
         "at most 63 characters"),
        (["--set", "settings.GPUWATCH_CLUSTER=eu-west"], "is set by the chart"),
    ],
    ids=["redis-password", "redis-setting", "sasl-setting", "managed", "not-gpuwatch",
         "sasl-no-secret", "replicas", "sink-replicas", "sink-port", "metrics-sink-replicas",
         "metrics-sink-port", "backend", "alerts-from", "cluster-name", "cluster-length",
         "cluster-setting"],
)  # fmt: skip
def test_unsafe_or_broken_values_are_refused(helm: str, setting: list[str], message: str) -> None:
    done = template(helm, *setting)
    assert done.returncode == 1
    assert message in done.stderr
    assert "hunter2" not in done.stderr


def test_the_chart_checks_cluster_names_by_the_messages_rule() -> None:
    (meta,) = [m for m in get_args(Cluster)[1:] if isinstance(m, msgspec.Meta)]
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    assert f'regexMatch "{meta.pattern}" (toString .Values.cluster.name)' in helpers
    assert f"gt (len (toString .Values.cluster.name)) {meta.max_length}" in helpers


# --- the processes accept what the chart gives them --------------------------------------


@pytest.mark.parametrize("values", ["default", "tls", "sim"])
def test_env_names_are_settings_and_the_settings_load(
    values: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    objects: list[Object] = request.getfixturevalue(values)
    prices = [o for o in by_kind(objects, "ConfigMap") if "prices.yaml" in o.get("data", {})]
    for component, _, container in containers(objects):
        env = env_of(container)
        names = {n for n in env if n.startswith("GPUWATCH_")}
        assert names <= set(ENV_VARS), (component, names - set(ENV_VARS))
        plain = {n: e["value"] for n, e in env.items() if n in names and "value" in e}
        plain |= {n: "x" for n, e in env.items() if n in names and "valueFrom" in e}
        if "GPUWATCH_REDIS_URL" in env and "valueFrom" in env["GPUWATCH_REDIS_URL"]:
            plain["GPUWATCH_REDIS_URL"] = "rediss://:secret@redis:6380/0"
        if "GPUWATCH_PRICES" in plain:  # the mounted ConfigMap, read back here
            (table,) = prices
            path = tmp_path / "prices.yaml"
            path.write_text(table["data"]["prices.yaml"], encoding="utf-8")
            plain["GPUWATCH_PRICES"] = str(path)
        settings = load_settings(env={"HOME": str(tmp_path)} | plain)
        assert settings.metrics.bind == "0.0.0.0"
        if component in PRODUCERS:  # cluster.name of the values
            assert settings.cluster.name == ("eu-west-1.prod" if values == "tls" else "default")
        else:
            assert "GPUWATCH_CLUSTER" not in env
        if values == "tls":
            kafka = settings.kafka
            assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
            assert str(kafka.ssl_cafile) == "/etc/gpuwatch/kafka-ca/ca.crt"
            assert settings.windows.window_s == 30
            assert settings.watcher.namespaces == ("ml", "research")
            if component in SINKS:  # the worker prices the records
                assert "GPUWATCH_PRICES" not in env
            elif component != "topics":
                assert settings.cost.prices.models == {"H100": 3.2}
        else:
            assert settings.kafka.security_protocol == "PLAINTEXT"


def test_the_kafka_ca_is_mounted_where_the_setting_points(tls: list[Object]) -> None:
    for component, pod, container in containers(tls):
        path = env_of(container)["GPUWATCH_KAFKA_SSL_CAFILE"]["value"]
        mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "kafka-cluster-ca", component
        assert path.rsplit("/", 1)[1] in {i["path"] for i in volume["secret"]["items"]}


@pytest.mark.parametrize("values", ["default", "tls", "sim"])
def test_container_args_parse_with_the_gpuwatch_command_line(
    values: str, request: pytest.FixtureRequest
) -> None:
    objects: list[Object] = request.getfixturevalue(values)
    handlers = {}
    for component, _, container in containers(objects):
        args = build_parser().parse_args(container["args"])
        handlers[component] = (args.verb, args.handler.__name__)
        assert args.log_level == "INFO"
    assert handlers == {
        "worker": ("worker", "_worker"),
        "k8s-watcher": ("k8s-watcher", "_k8s_watcher"),
        "node-agent": ("node-agent", "_node_agent"),
        "topics": ("topics", "_topics_create"),
        "sink-redis": ("sink", "_redis"),
        "sink-metrics": ("sink", "_metrics"),
    }


def test_the_topics_job_runs_before_install_and_upgrade(tls: list[Object]) -> None:
    """With an external Kafka; the embedded one's topics: test_deploy_helm_embedded.py."""
    (job,) = by_kind(tls, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][2:] == ["topics", "create"]
    env = env_of(container)
    assert env["GPUWATCH_KAFKA_PARTITIONS"]["value"] == "24"
    assert env["GPUWATCH_KAFKA_REPLICATION_FACTOR"]["value"] == "3"


# --- workers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("component", "replicas"), [("worker", 6), ("sink-redis", 3), ("sink-metrics", 4)]
)
def test_workers_and_sinks_stop_gracefully_and_are_disrupted_one_at_a_time(
    tls: list[Object], component: str, replicas: int
) -> None:
    deployment = one(tls, "Deployment", component)
    assert deployment["spec"]["replicas"] == replicas
    pod = deployment["spec"]["template"]["spec"]
    # The worker forces its exit at 25 s; the sink exits within seconds.
    assert pod["terminationGracePeriodSeconds"] == 30
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == component
    pdb = one(tls, "PodDisruptionBudget", component)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    # Replicas spread over nodes, each component apart from the other.
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector


def test_one_watcher_that_never_overlaps_a_second(default: list[Object]) -> None:
    watcher = one(default, "Deployment", "k8s-watcher")
    assert watcher["spec"]["replicas"] == 1
    assert watcher["spec"]["strategy"] == {"type": "Recreate"}


# --- RBAC ---------------------------------------------------------------------------------


def grants(rules: list[Object]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_watcher_role_equals_deploy_rbac(default: list[Object]) -> None:
    plain = {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text(encoding="utf-8"))}
    role = one(default, "ClusterRole", "k8s-watcher")
    assert role["rules"] == plain["ClusterRole"]["rules"]
    assert grants(role["rules"]) == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
        ("apps", "replicasets", "get"), ("batch", "jobs", "get"),
        ("kueue.x-k8s.io", "workloads", "get"), ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "workloads", "watch"), ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaimtemplates", "get"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
    }  # fmt: skip
    binding = one(default, "ClusterRoleBinding", "k8s-watcher")
    watcher = one(default, "Deployment", "k8s-watcher")["spec"]["template"]["spec"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": watcher["serviceAccountName"], "namespace": NAMESPACE}
    ]


def test_the_node_agent_role_equals_deploy_rbac_and_reads_slices_and_lists_pods_only(
    default: list[Object],
) -> None:
    plain = {d["kind"]: d for d in yaml.safe_load_all(AGENT_RBAC.read_text(encoding="utf-8"))}
    role = one(default, "ClusterRole", "node-agent")
    assert role["rules"] == plain["ClusterRole"]["rules"]
    assert grants(role["rules"]) == {
        *(("resource.k8s.io", "resourceslices", verb) for verb in ("get", "list", "watch")),
        ("", "pods", "list"),  # its node's, for their gpuwatch.io/work annotations
    }
    binding = one(default, "ClusterRoleBinding", "node-agent")
    agent = one(default, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": agent["serviceAccountName"], "namespace": NAMESPACE}
    ]
    assert env_of(agent["containers"][0])["GPUWATCH_DRA_DRIVERS"]["value"] == "gpu.nvidia.com"


# --- Prometheus ---------------------------------------------------------------------------


def test_metrics_ports_are_the_settings_defaults_and_prometheus_yml(
    default: list[Object],
) -> None:
    port_env = {
        "worker": "GPUWATCH_METRICS_PORT",
        "node-agent": "GPUWATCH_AGENT_METRICS_PORT",
        "k8s-watcher": "GPUWATCH_WATCHER_METRICS_PORT",
        "sink-redis": "GPUWATCH_SINK_METRICS_PORT",
        "sink-metrics": "GPUWATCH_SINK_EXPORTER_PORT",
    }
    defaults = load_settings(env={"HOME": "/tmp"})
    setting = {
        component: getattr(getattr(defaults, ENV_VARS[var][0]), ENV_VARS[var][1])
        for component, var in port_env.items()
    }
    assert setting["worker"] == defaults.metrics.port
    jobs = prometheus_jobs()
    for component, _, container in containers(default):
        if component == "topics":
            assert "ports" not in container
            continue
        (port,) = container["ports"]
        assert port["name"] == "metrics"
        assert port["containerPort"] == setting[component] == jobs[JOBS[component]]
        assert env_of(container)[port_env[component]]["value"] == str(port["containerPort"])
    services = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]: s["spec"]["ports"]
        for s in by_kind(default, "Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] not in EMBEDDED
    }
    assert services == {
        "worker": [{"name": "metrics", "port": 9480, "targetPort": "metrics", "protocol": "TCP"}],
        "k8s-watcher": [
            {"name": "metrics", "port": 9482, "targetPort": "metrics", "protocol": "TCP"}
        ],
        "sink-redis": [
            {"name": "metrics", "port": 9483, "targetPort": "metrics", "protocol": "TCP"}
        ],
        "sink-metrics": [
            {"name": "metrics", "port": 9484, "targetPort": "metrics", "protocol": "TCP"}
        ],
    }


def test_monitors_keep_the_pod_labels_and_name_the_jobs_the_rules_use(tls: list[Object]) -> None:
    jobs = {}
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in tls
                if s["kind"] == "Service"}  # fmt: skip
    for monitor in by_kind(tls, "ServiceMonitor") + by_kind(tls, "PodMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        (endpoint,) = endpoints
        assert endpoint["port"] == "metrics"
        # Our series carry the GPU pod's namespace and pod: the target's must not win.
        assert endpoint["honorLabels"] is True
        (relabel,) = endpoint["relabelings"]
        assert (relabel["action"], relabel["targetLabel"]) == ("replace", "job")
        component = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        jobs[relabel["replacement"]] = component
        if monitor["kind"] == "ServiceMonitor":
            selector = monitor["spec"]["selector"]["matchLabels"]
            assert services[component]["metadata"]["labels"].items() >= selector.items()
    assert jobs == {
        "gpuwatch-worker": "worker",
        "gpuwatch-sink": "sink-redis",
        "gpuwatch-sink-metrics": "sink-metrics",
        "gpuwatch-k8s-watcher": "k8s-watcher",
        "gpuwatch-node-agent": "node-agent",
    }
    assert jobs == {job: component for component, job in JOBS.items()}
    assert set(jobs) == set(prometheus_jobs())


def test_the_prometheus_rule_is_the_rules_file_and_promtool_accepts_it(
    tls: list[Object], tmp_path: Path
) -> None:
    (rule,) = by_kind(tls, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    done = run_command(["promtool", "check", "rules", str(path)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert {"GpuIdleAllocated", "PodStalled", "PodQueuedTooLong", "GpuUnallocatedAccess",
            "NodeTelemetryMissing"} <= set(alerts)  # fmt: skip


def test_the_prometheus_rule_can_carry_the_threshold_rules_instead(helm: str) -> None:
    """The file's rules, with the idle threshold of the release's settings (3 %): the rest
    of what the values change is test_deploy_helm_rules.py's."""
    objects = render(helm, "-f", str(TLS_VALUES), "--set", "prometheusRule.alertsFrom=thresholds")
    (rule,) = by_kind(objects, "PrometheusRule")
    shipped = THRESHOLD_RULES.read_text(encoding="utf-8")
    idle_3 = shipped.replace("ratio < 0.05", "ratio < 0.03").replace("under 5 %", "under 3 %")
    assert rule["spec"] == yaml.safe_load(idle_3)


def test_the_dashboards_config_map_holds_every_dashboard(tls: list[Object]) -> None:
    (board_map,) = [o for o in by_kind(tls, "ConfigMap") if "prices.yaml" not in o["data"]]
    assert board_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board_map["metadata"]["annotations"]["grafana_folder"] == "gpuwatch"
    files = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARDS.glob("*.json")}
    assert {name: json.loads(text) for name, text in board_map["data"].items()} == files
    assert len(files) == 5


def policies_of(objects: list[Object], pod: Object) -> list[Object]:
    """The network policies whose pod selector picks this pod template (not those of
    `helm test`, a hook, which add its own pod)."""
    labels = pod["metadata"]["labels"]
    return [
        p
        for p in by_kind(objects, "NetworkPolicy")
        if labels.items() >= p["spec"]["podSelector"]["matchLabels"].items()
        and "helm.sh/hook" not in p["metadata"].get("annotations", {})
    ]


def test_network_policy_admits_only_the_metrics_ports(tls: list[Object]) -> None:
    monitoring = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    for component, pod in pod_specs(tls):
        (policy,) = policies_of(tls, pod)  # each component's own alone
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
            component
        )
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        if component == "topics":  # listens on nothing: nothing gets in
            assert policy["spec"]["ingress"] == []
        else:
            assert policy["spec"]["ingress"] == [
                {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": monitoring}
            ]
        for container in pod["spec"]["containers"]:
            assert [p["name"] for p in container.get("ports", [])] in ([], ["metrics"])


def test_network_policy_lets_the_sink_alone_reach_redis(tls: list[Object]) -> None:
    ports = {}
    for component, pod in pod_specs(tls):
        rules = [rule for p in policies_of(tls, pod) for rule in p["spec"].get("egress", [])]
        ports[component] = {
            port["port"] for rule in rules for port in rule.get("ports", [{"port": "any"}])
        }
    common = {53, 9093}  # DNS, Kafka (networkPolicy.kafkaTo)
    # The node agent reaches the API server for its node's ResourceSlices and pods, and the
    # pods whose units of work it scrapes, at any port (their annotations name it).
    assert ports == {
        "worker": common, "sink-redis": common | {6380}, "sink-metrics": common,
        "k8s-watcher": common | {6443}, "node-agent": common | {6443, "any"},
        "topics": common,
    }  # fmt: skip
    sink = one(tls, "Deployment", "sink-redis")["spec"]["selector"]["matchLabels"]
    redis_policy = one(tls, "NetworkPolicy", "sink-redis")
    assert redis_policy["spec"]["podSelector"]["matchLabels"] == sink


def test_egress_is_restricted_only_with_restrict_egress(helm: str, tls: list[Object]) -> None:
    unrestricted = render(
        helm, "-f", str(TLS_VALUES), "--set", "networkPolicy.restrictEgress=false"
    )
    mine = [p for p in by_kind(unrestricted, "NetworkPolicy") if "helm.sh/hook" not in
            p["metadata"].get("annotations", {})]  # fmt: skip
    assert len(mine) == 6
    for policy in mine:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert "egress" not in policy["spec"]
    restricted = [p for p in by_kind(tls, "NetworkPolicy") if "egress" in p["spec"]]
    assert len(restricted) == 6


# --- the chart as a package ---------------------------------------------------------------


@pytest.mark.parametrize("values", [(), ("-f", str(TLS_VALUES)), ("-f", str(SIM_VALUES))])
def test_helm_lint_strict_passes(helm: str, values: tuple[str, ...]) -> None:
    done = run_command([helm, "lint", "--strict", str(CHART), *values], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_packaged_chart_carries_the_linked_rules_and_dashboards(
    helm: str, tls: list[Object], tmp_path: Path
) -> None:
    """files/ and dashboards/ link outside the chart: `helm package` must resolve them."""
    done = run_command([helm, "package", str(CHART), "-d", str(tmp_path)], timeout_s=120)
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("gpuwatch-0.1.0.tgz")
    rendered = run_command(
        [helm, "template", "gw", str(archive), "--namespace", NAMESPACE, "-f", str(TLS_VALUES)],
        timeout_s=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert [d for d in yaml.safe_load_all(rendered.stdout) if d] == tls


def test_existing_service_accounts_are_named_and_bound(helm: str) -> None:
    objects = render(
        helm, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-sa"
    )
    assert by_kind(objects, "ServiceAccount") == []
    # The topics job, a pre-install hook, runs as the namespace's default account anyway.
    accounts = {c: p["spec"]["serviceAccountName"] for c, p in pod_specs(objects) if c != "topics"}
    assert set(accounts) == {"worker", "sink-redis", "sink-metrics", "k8s-watcher", "node-agent"}
    assert set(accounts.values()) == {"platform-sa"}
    bindings = by_kind(objects, "ClusterRoleBinding")
    assert len(bindings) == 2  # the watcher's and the node agent's
    assert all([s["name"] for s in b["subjects"]] == ["platform-sa"] for b in bindings)
    unnamed = render(helm, "--set", "serviceAccount.create=false")
    assert {p["spec"]["serviceAccountName"] for c, p in pod_specs(unnamed) if c != "topics"} == {
        "default"
    }


def test_the_node_agent_runs_as_the_gpu_operators_node_components_do(
    default: list[Object], sim: list[Object], helm: str
) -> None:
    agent = one(default, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert (agent["runtimeClassName"], agent["priorityClassName"]) == (
        "nvidia",
        "system-node-critical",
    )
    simulated = one(sim, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in simulated  # no NVML to reach
    plain = render(
        helm, "--set", "nodeAgent.runtimeClassName=", "--set", "nodeAgent.priorityClassName="
    )
    spec = one(plain, "DaemonSet", "node-agent")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec
    assert "priorityClassName" not in spec
