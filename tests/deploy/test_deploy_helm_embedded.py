"""The chart's own Kafka and Redis, a Kafka of the Strimzi operator with mutual TLS, and the
per-component network policies, rendered offline with `helm template`.

`helm install` with the defaults alone is a working install: a single-node KRaft Kafka and
a Redis come with it, and gpuwatch finds them by their Services. The KafkaTopics of the
Strimzi values are checked against the topics the code creates (imported, not copied), and
the network policies by what their selectors really pick in the rendered pods.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import test_deploy_helm as chart
import yaml
from support import run_command
from test_deploy_helm import (
    CHART,
    NAMESPACE,
    OPERATOR_KINDS,
    ROOT,
    SIM_VALUES,
    TLS_VALUES,
    by_kind,
    containers,
    env_of,
    one,
    pod_specs,
    policies_of,
    render,
    template,
)

from gpuwatch.config import load_settings
from gpuwatch.kafka import topic_configs
from gpuwatch.run.worker import FLEET_RETENTION_MS, TICK_RETENTION_MS
from schemas.settings import KafkaSettings, Settings, StackSettings
from schemas.topics import ALL_TOPICS
from sinks.prometheus.feed import metrics_group
from sinks.redis.writer import redis_group
from streams.faust.app import changelog_topic_names
from streams.faust.tick_timer import fleet_topic_name, tick_topic_name

Object = dict[str, Any]

STRIMZI_VALUES = CHART / "ci" / "strimzi-mtls-values.yaml"
COMPOSE = ROOT / "docker-compose.yml"
README = ROOT / "deploy" / "README.md"
STRIMZI_KINDS = {"KafkaTopic", "KafkaUser"}
# The release "gw" of test_deploy_helm's `template`, in its namespace.
KAFKA_POD = f"gw-gpuwatch-kafka-0.gw-gpuwatch-kafka-headless.{NAMESPACE}.svc"
# gpuwatch's own pods (the Kafka clients); the embedded Kafka and Redis are apart.
GPUWATCH = {"worker", "sink-redis", "sink-metrics", "k8s-watcher", "node-agent", "topics"}
API_SERVER = '[{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}]'

pytestmark = pytest.mark.timeout(900)

# The fixtures of test_deploy_helm: the helm binary, the default and TLS/SASL renderings.
helm = chart.helm
default = chart.default
tls = chart.tls


@pytest.fixture(scope="module")
def strimzi(helm: str) -> list[Object]:
    return render(helm, "-f", str(STRIMZI_VALUES))


@pytest.fixture(scope="module")
def restricted(helm: str) -> list[Object]:
    """The defaults with egress restricted (the embedded Kafka and Redis)."""
    return render(
        helm, "--set", "networkPolicy.restrictEgress=true",
        "--set-json", f"networkPolicy.apiServer={API_SERVER}",
    )  # fmt: skip


def spec_of(objects: list[Object], kind: str, component: str) -> Object:
    pod: Object = one(objects, kind, component)["spec"]["template"]["spec"]
    return pod


def compose_image(service: str) -> str:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    image: str = compose["services"][service]["image"]
    return image


def selects(selector: Object, labels: dict[str, str]) -> bool:
    return labels.items() >= selector["matchLabels"].items()


def labels_of(objects: list[Object], kind: str, component: str) -> dict[str, str]:
    labels: dict[str, str] = one(objects, kind, component)["spec"]["template"]["metadata"]["labels"]
    return labels


# --- the embedded Kafka -------------------------------------------------------------------


def test_the_embedded_kafka_is_one_kraft_node_at_its_stable_name(default: list[Object]) -> None:
    (statefulset,) = by_kind(default, "StatefulSet")
    assert statefulset["metadata"]["name"] == "gw-gpuwatch-kafka"
    assert statefulset["spec"]["replicas"] == 1
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(default, "Service")}
    headless = services[statefulset["spec"]["serviceName"]]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True  # its controller, before it is ready
    pod = statefulset["spec"]["template"]
    assert pod["metadata"]["labels"].items() >= headless["selector"].items()
    (container,) = pod["spec"]["containers"]
    env = {name: e["value"] for name, e in env_of(container).items()}
    # The stable name: "<statefulset>-0.<headless service>.<namespace>.svc".
    name, headless_name = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    assert f"{name}-0.{headless_name}.{NAMESPACE}.svc" == KAFKA_POD
    assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{KAFKA_POD}:9092"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"1@{KAFKA_POD}:9093"
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_LISTENERS"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for name in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                 "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                 "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):  # fmt: skip
        assert env[name] == "1", name
    assert env["KAFKA_LOG_RETENTION_HOURS"] == "168"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"kafka": 9092, "controller": 9093}
    # The log directory lies on the claim's volume, below its root (lost+found).
    (mount,) = container["volumeMounts"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert mount["name"] == claim["metadata"]["name"]
    assert env["KAFKA_LOG_DIRS"].startswith(mount["mountPath"] + "/")
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster's default


def test_gpuwatch_bootstraps_from_the_embedded_kafkas_service(default: list[Object]) -> None:
    service = next(s for s in by_kind(default, "Service")
                   if s["metadata"]["name"] == "gw-gpuwatch-kafka")  # fmt: skip
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (9092, "kafka")
    assert labels_of(default, "StatefulSet", "kafka").items() >= service["spec"]["selector"].items()
    seen = set()
    for component, _, container in containers(default):
        seen.add(component)
        env = env_of(container)
        assert env["GPUWATCH_KAFKA_BOOTSTRAP"]["value"] == "gw-gpuwatch-kafka:9092"
        # One broker holds one replica of each topic, whatever kafka.replicationFactor says.
        assert env["GPUWATCH_KAFKA_REPLICATION_FACTOR"]["value"] == "1"
        assert env["GPUWATCH_KAFKA_SECURITY_PROTOCOL"]["value"] == "PLAINTEXT"
    assert seen == GPUWATCH


def test_the_embedded_kafka_size_class_and_retention_come_from_the_values(helm: str) -> None:
    objects = render(
        helm, "--set", "kafka.embedded.persistence.size=50Gi",
        "--set", "kafka.embedded.persistence.storageClass=fast-ssd",
        "--set", "kafka.embedded.retentionHours=72", "--set", "kafka.embedded.image.tag=4.0.1",
    )  # fmt: skip
    (statefulset,) = by_kind(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["KAFKA_LOG_RETENTION_HOURS"]["value"] == "72"
    assert container["image"] == "apache/kafka:4.0.1"


def test_the_embedded_images_are_those_of_the_local_stack_and_compose(
    default: list[Object],
) -> None:
    kafka = spec_of(default, "StatefulSet", "kafka")["containers"][0]["image"]
    redis = spec_of(default, "Deployment", "redis")["containers"][0]["image"]
    assert kafka == compose_image("kafka") == f"apache/kafka:{StackSettings().kafka_version}"
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka)
    assert redis == compose_image("redis")
    assert re.fullmatch(r"redis:7\.\d+\.\d+(-alpine)?", redis)


# --- the embedded Redis -------------------------------------------------------------------


def test_the_redis_sink_writes_the_embedded_redis(default: list[Object]) -> None:
    service = one(default, "Service", "redis")
    (port,) = service["spec"]["ports"]
    redis = spec_of(default, "Deployment", "redis")
    (container,) = redis["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"redis": 6379}
    assert (port["port"], port["targetPort"]) == (6379, "redis")
    assert labels_of(default, "Deployment", "redis").items() >= service["spec"]["selector"].items()
    sink = spec_of(default, "Deployment", "sink-redis")["containers"][0]
    url = env_of(sink)["GPUWATCH_REDIS_URL"]["value"]
    assert url == f"redis://:$(REDIS_PASSWORD)@{service['metadata']['name']}:6379/0"
    assert one(default, "Deployment", "redis")["spec"]["strategy"] == {"type": "Recreate"}
    assert container["args"][:3] == ["redis-server", "--dir", "/data"]
    assert container["args"][-2:] == ["--appendonly", "no"]
    assert redis["volumes"] == [{"name": "data", "emptyDir": {}}]


def test_the_embedded_redis_persists_on_a_claim_when_asked(helm: str) -> None:
    objects = render(
        helm, "--set", "redis.embedded.persistence.enabled=true",
        "--set", "redis.embedded.persistence.size=8Gi", "--set", "redis.embedded.appendonly=true",
    )  # fmt: skip
    (claim,) = by_kind(objects, "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    redis = spec_of(objects, "Deployment", "redis")
    assert redis["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    ]
    assert redis["containers"][0]["args"][-2:] == ["--appendonly", "yes"]


def test_without_the_redis_sink_no_redis_is_rendered(helm: str) -> None:
    objects = render(helm, "--set", "sinkRedis.enabled=false")
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}
    assert not {"redis", "sink-redis"} & components
    assert "kafka" in components


# --- their security -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("component", "uid", "gid", "read_only"),
    [("kafka", 1000, 1000, False), ("redis", 999, 1000, True)],
)
def test_the_embedded_pods_run_as_their_images_users_locked_down(
    default: list[Object], component: str, uid: int, gid: int, read_only: bool
) -> None:
    kind = "StatefulSet" if component == "kafka" else "Deployment"
    pod = spec_of(default, kind, component)
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid, "fsGroup": gid,
        "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False  # no KAFKA_* variables from Service links
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        # Kafka: the image's start script writes its configuration inside the image.
        "readOnlyRootFilesystem": read_only,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert container["readinessProbe"]
    assert container["livenessProbe"]
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        assert key not in pod


# --- who creates the topics ---------------------------------------------------------------


def test_on_the_embedded_kafka_the_worker_and_sinks_create_the_topics(
    default: list[Object], tmp_path: Path
) -> None:
    """No pre-install hook: it would run before the embedded Kafka exists."""
    assert by_kind(default, "Job") == []
    inits = {}
    for component, pod in pod_specs(default):
        inits[component] = [c["name"] for c in pod["spec"].get("initContainers", [])]
        for init in pod["spec"].get("initContainers", []):
            assert init["args"][2:] == ["topics", "create"]
            plain = {n: e["value"] for n, e in env_of(init).items()}
            settings = load_settings(env={"HOME": str(tmp_path)} | plain)
            assert (settings.kafka.partitions, settings.kafka.replication_factor) == (12, 1)
            assert init["resources"] == {
                "requests": {"cpu": "50m", "memory": "128Mi"},
                "limits": {"memory": "256Mi"},
            }
    assert inits == {
        "worker": ["topics"], "sink-redis": ["topics"], "sink-metrics": ["topics"],
        "k8s-watcher": [], "node-agent": [],
    }  # fmt: skip


def test_on_an_external_kafka_the_hook_creates_the_topics(tls: list[Object]) -> None:
    (job,) = by_kind(tls, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert all("initContainers" not in pod["spec"] for _, pod in pod_specs(tls))
    assert not by_kind(tls, "StatefulSet")
    assert not {"kafka", "redis"} & {
        o["metadata"]["labels"]["app.kubernetes.io/component"] for o in tls
    }


def test_without_topics_create_nothing_creates_them(helm: str) -> None:
    objects = render(helm, "--set", "topics.create=false")
    assert by_kind(objects, "Job") == []
    assert all("initContainers" not in pod["spec"] for _, pod in pod_specs(objects))


# --- values refused -----------------------------------------------------------------------


EXTERNAL = ["--set", "kafka.embedded.enabled=false", "--set", "kafka.bootstrap=k:9092"]
STRIMZI = [*EXTERNAL, "--set", "kafka.strimzi.enabled=true", "--set", "kafka.strimzi.cluster=c"]
RESTRICTED = ["--set", "networkPolicy.restrictEgress=true",
              "--set-json", f"networkPolicy.apiServer={API_SERVER}"]  # fmt: skip
SCRAM = ["--set", "kafka.strimzi.user.authentication=scram-sha-512", "--set",
         "kafka.sasl.enabled=true", "--set", "kafka.sasl.passwordSecret.name=p"]  # fmt: skip
EXTERNAL_REDIS = ["--set", "redis.embedded.enabled=false", "--set", "redis.url=redis://r:6379/0"]
REFUSED = {
    "no-bootstrap": (
        ["--set", "kafka.embedded.enabled=false"],
        "kafka.bootstrap is required with kafka.embedded.enabled=false",
    ),
    "bootstrap-with-embedded": (
        ["--set", "kafka.bootstrap=kafka:9092"],
        'kafka.bootstrap "kafka:9092" is for an external Kafka',
    ),
    "tls-with-embedded": (
        ["--set", "kafka.tls.enabled=true"],
        "kafka.tls and kafka.sasl are for an external Kafka",
    ),
    "cluster-id": (
        ["--set", "kafka.embedded.clusterId=short"],
        'kafka.embedded.clusterId "short": 22 characters',
    ),
    "strimzi-with-embedded": (
        ["--set", "kafka.strimzi.enabled=true"],
        "kafka.strimzi.enabled is for a Kafka of the Strimzi operator",
    ),
    "client-cert-without-tls": (
        [*EXTERNAL, "--set", "kafka.tls.clientCertSecret.name=c"],
        "kafka.tls.clientCertSecret needs kafka.tls.enabled",
    ),
    "no-redis": (
        ["--set", "redis.embedded.enabled=false"],
        "redis.url or redis.existingSecret.name is required",
    ),
    "redis-url-with-embedded": (
        ["--set", "redis.url=redis://r:6379/0"],
        "redis.url, redis.existingSecret and redis.tls are for a Redis of your own",
    ),
    "redis-secret-with-embedded": (
        ["--set", "redis.existingSecret.name=s"],
        "are for a Redis of your own",
    ),
    "strimzi-cluster": (
        [*EXTERNAL, "--set", "kafka.strimzi.enabled=true"],
        "kafka.strimzi.cluster is required",
    ),
    "strimzi-tls": (
        STRIMZI,
        "authentication=tls needs kafka.tls.enabled and kafka.tls.clientCertSecret: "
        "name gw-gpuwatch",
    ),
    "strimzi-scram": (
        [*STRIMZI, *SCRAM],
        "needs kafka.sasl.enabled with mechanism SCRAM-SHA-512, username gw-gpuwatch",
    ),
    "strimzi-auth": (
        [*STRIMZI, "--set", "kafka.strimzi.user.authentication=plain"],
        'authentication "plain": tls or scram-sha-512',
    ),
    "old-egress": (
        ["--set-json", 'networkPolicy.egress=[{"ports": [{"port": 53}]}]'],
        "networkPolicy.egress and networkPolicy.redisEgress are gone",
    ),
    "no-api-server": (
        ["--set", "networkPolicy.restrictEgress=true"],
        "networkPolicy.restrictEgress needs networkPolicy.apiServer",
    ),
    "no-kafka-to": (
        [*EXTERNAL, *RESTRICTED],
        "networkPolicy.restrictEgress with an external Kafka needs networkPolicy.kafkaTo",
    ),
    "no-redis-to": (
        [*EXTERNAL_REDIS, *RESTRICTED],
        "with an external Redis needs networkPolicy.redisTo",
    ),
    "cert-setting": (
        ["--set", "settings.GPUWATCH_KAFKA_SSL_CERTFILE=/c"],
        "is set by the chart",
    ),
}


@pytest.mark.parametrize(("setting", "message"), list(REFUSED.values()), ids=list(REFUSED))
def test_values_that_cannot_work_are_refused(helm: str, setting: list[str], message: str) -> None:
    done = template(helm, *setting)
    assert done.returncode == 1, done.stdout[:500]
    assert message in done.stderr


def test_an_external_redis_url_reaches_the_sink(helm: str) -> None:
    objects = render(helm, "--set", "redis.embedded.enabled=false",
                     "--set", "redis.url=rediss://cache.example:6380/2")  # fmt: skip
    assert not by_kind(objects, "PersistentVolumeClaim")
    sink = spec_of(objects, "Deployment", "sink-redis")["containers"][0]
    assert env_of(sink)["GPUWATCH_REDIS_URL"]["value"] == "rediss://cache.example:6380/2"
    assert "redis" not in {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}


# --- Strimzi and mutual TLS ---------------------------------------------------------------


def code_topics(prefix: str, app_id: str) -> dict[str, dict[str, str]]:
    """Every topic the code creates or declares, with its configs: `topics create` (the
    public ones), the worker's tick and fleet topics and its tables' changelogs."""
    settings = Settings(kafka=KafkaSettings(topic_prefix=prefix, app_id=app_id))
    topics = {spec.full_name(prefix): topic_configs(spec) for spec in ALL_TOPICS}
    topics[tick_topic_name(settings)] = {
        "cleanup.policy": "delete", "retention.ms": str(TICK_RETENTION_MS)
    }  # fmt: skip
    topics[fleet_topic_name(settings)] = {
        "cleanup.policy": "delete", "retention.ms": str(FLEET_RETENTION_MS)
    }  # fmt: skip
    for changelog in changelog_topic_names(settings):
        # streams/faust/app.py declares them compacting, not deleting.
        topics[changelog] = {"cleanup.policy": "compact"}
    return topics


@pytest.mark.parametrize(
    ("prefix", "app_id"), [("gpuwatch.", "gpuwatch"), ("Team_A.gw.", "gw-prod")]
)
def test_the_kafka_topics_are_every_topic_the_code_creates(
    helm: str, prefix: str, app_id: str
) -> None:
    objects = render(
        helm, "-f", str(STRIMZI_VALUES), "--set", f"kafka.topicPrefix={prefix}",
        "--set", f"kafka.appId={app_id}",
    )  # fmt: skip
    kafka_topics = by_kind(objects, "KafkaTopic")
    rendered = {t["spec"]["topicName"]: t["spec"]["config"] for t in kafka_topics}
    assert rendered == code_topics(prefix, app_id)
    assert len(kafka_topics) == len(rendered) == len(ALL_TOPICS) + 4
    for topic in kafka_topics:
        assert topic["apiVersion"] == "kafka.strimzi.io/v1beta2"
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "platform-kafka"
        # Deleting a KafkaTopic deletes the topic: an uninstall leaves them.
        assert topic["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert (topic["spec"]["partitions"], topic["spec"]["replicas"]) == (12, 3)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", topic["metadata"]["name"])
    # The KafkaTopics create them: no topics hook, no first containers.
    assert by_kind(objects, "Job") == []
    assert all("initContainers" not in pod["spec"] for _, pod in pod_specs(objects))


def test_the_kafka_user_may_do_what_gpuwatch_does_and_no_more(strimzi: list[Object]) -> None:
    (user,) = by_kind(strimzi, "KafkaUser")
    assert user["metadata"]["name"] == "gpuwatch"
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "platform-kafka"
    assert user["spec"]["authentication"] == {"type": "tls"}
    authorization = user["spec"]["authorization"]
    assert authorization["type"] == "simple"
    by_type: dict[str, list[Object]] = {}
    for acl in authorization["acls"]:
        by_type.setdefault(acl["resource"]["type"], []).append(acl)
    assert set(by_type) == {"topic", "group"}  # no cluster operation, no transactions
    (topics,) = by_type["topic"]
    assert topics["resource"] == {"type": "topic", "name": "gpuwatch.", "patternType": "prefix"}
    assert sorted(topics["operations"]) == ["Create", "Describe", "Read", "Write"]
    for name in [t["spec"]["topicName"] for t in by_kind(strimzi, "KafkaTopic")]:
        assert name.startswith(topics["resource"]["name"])
    settings = Settings()
    groups = {acl["resource"]["name"]: acl for acl in by_type["group"]}
    assert set(groups) == {settings.kafka.app_id, redis_group(settings), metrics_group(settings)}
    for acl in groups.values():
        assert (acl["resource"]["patternType"], acl["operations"]) == ("literal", ["Read"])


def test_without_a_topic_prefix_the_user_gets_each_topic_by_name(helm: str) -> None:
    objects = render(helm, "-f", str(STRIMZI_VALUES), "--set", "kafka.topicPrefix=")
    (user,) = by_kind(objects, "KafkaUser")
    topics = [acl["resource"] for acl in user["spec"]["authorization"]["acls"]
              if acl["resource"]["type"] == "topic"]  # fmt: skip
    assert {t["name"] for t in topics} == set(code_topics("", "gpuwatch"))
    assert {t["patternType"] for t in topics} == {"literal"}


def test_scram_users_and_the_operators_namespace(helm: str) -> None:
    objects = render(
        helm, "-f", str(STRIMZI_VALUES), "--set", "kafka.tls.clientCertSecret.name=",
        "--set", "kafka.strimzi.user.authentication=scram-sha-512",
        "--set", "kafka.strimzi.namespace=kafka", "--set", "kafka.sasl.enabled=true",
        "--set", "kafka.sasl.username=gpuwatch", "--set", "kafka.sasl.passwordSecret.name=gpuwatch",
    )  # fmt: skip
    (user,) = by_kind(objects, "KafkaUser")
    assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] in STRIMZI_KINDS} == {
        "kafka"
    }
    worker = spec_of(objects, "Deployment", "worker")["containers"][0]
    assert env_of(worker)["GPUWATCH_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert "GPUWATCH_KAFKA_SSL_CERTFILE" not in env_of(worker)


def test_every_kafka_client_presents_the_users_certificate(
    strimzi: list[Object], tmp_path: Path
) -> None:
    seen = set()
    for component, pod, container in containers(strimzi):
        seen.add(component)
        env = env_of(container)
        plain = {
            n: e["value"] for n, e in env.items() if "value" in e and n.startswith("GPUWATCH_")
        }
        for name, key in (("GPUWATCH_KAFKA_SSL_CERTFILE", "user.crt"),
                          ("GPUWATCH_KAFKA_SSL_KEYFILE", "user.key")):  # fmt: skip
            path = plain[name]
            mount = next(m for m in container["volumeMounts"]
                         if path.startswith(m["mountPath"] + "/"))  # fmt: skip
            assert mount["readOnly"] is True
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert volume["secret"]["secretName"] == "gpuwatch", component
            items = {i["key"]: i["path"] for i in volume["secret"]["items"]}
            assert items[key] == path.rsplit("/", 1)[1] == key
        settings = load_settings(env={"HOME": str(tmp_path)} | plain)
        kafka = settings.kafka
        assert kafka.security_protocol == "SSL"
        assert (str(kafka.ssl_certfile), str(kafka.ssl_keyfile)) == (
            "/etc/gpuwatch/kafka-client/user.crt",
            "/etc/gpuwatch/kafka-client/user.key",
        )
        assert str(kafka.ssl_cafile) == "/etc/gpuwatch/kafka-ca/ca.crt"
    assert seen == GPUWATCH - {"topics"}  # the KafkaTopics create the topics


def test_the_strimzi_values_validate_but_for_the_operators_kinds(helm: str) -> None:
    for kube in ("1.25.0", "1.34.0"):
        objects = render(helm, "--kube-version", kube, "-f", str(STRIMZI_VALUES))
        kinds = set()
        for o in objects:
            kinds.add(o["kind"])
            if o["kind"] in STRIMZI_KINDS | OPERATOR_KINDS:
                continue
            kubernetes_validate.validate(o, kube, strict=True)
        assert {"KafkaTopic", "KafkaUser", "Deployment", "NetworkPolicy"} <= kinds


# --- network policies ---------------------------------------------------------------------


def egress_ports(objects: list[Object], pod: Object) -> set[int | str]:
    """The ports the pod may reach; "any" for a rule that names none."""
    rules = [rule for p in policies_of(objects, pod) for rule in p["spec"].get("egress", [])]
    return {port["port"] for rule in rules for port in rule.get("ports", [{"port": "any"}])}


def test_each_component_reaches_dns_kafka_and_only_what_it_talks_to(
    restricted: list[Object],
) -> None:
    ports = {c: egress_ports(restricted, pod) for c, pod in pod_specs(restricted)}
    common = {53, 9092}  # DNS, the embedded Kafka
    # The node agent: the API server (ResourceSlices, its node's pods) and the pods whose
    # units of work it scrapes, at the ports their annotations name.
    assert ports == {
        "worker": common, "sink-redis": common | {6379}, "sink-metrics": common,
        "k8s-watcher": common | {6443}, "node-agent": common | {6443, "any"},
    }  # fmt: skip
    kafka_pod = labels_of(restricted, "StatefulSet", "kafka")
    redis_pod = labels_of(restricted, "Deployment", "redis")
    for component, pod in pod_specs(restricted):
        rules = [r for p in policies_of(restricted, pod) for r in p["spec"]["egress"]]
        to_kafka = [r for r in rules if any(p["port"] == 9092 for p in r.get("ports", []))]
        (rule,) = to_kafka
        assert all(selects(peer["podSelector"], kafka_pod) for peer in rule["to"]), component
        to_redis = [r for r in rules if any(p["port"] == 6379 for p in r.get("ports", []))]
        if component == "sink-redis":
            (rule,) = to_redis
            assert all(selects(peer["podSelector"], redis_pod) for peer in rule["to"])
        else:
            assert to_redis == []
    dns = next(r for r in rules if {"port": 53, "protocol": "UDP"} in r["ports"])
    assert {"port": 53, "protocol": "TCP"} in dns["ports"]
    assert dns["to"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }]  # fmt: skip


def test_the_embedded_kafka_admits_the_releases_pods_and_its_own_controller(
    restricted: list[Object],
) -> None:
    kafka = one(restricted, "StatefulSet", "kafka")["spec"]["template"]
    (policy,) = policies_of(restricted, kafka)
    clients, controller = policy["spec"]["ingress"]
    assert clients["ports"] == [{"port": 9092, "protocol": "TCP"}]
    assert controller["ports"] == [{"port": 9093, "protocol": "TCP"}]
    for component, pod in pod_specs(restricted):
        assert any(selects(p["podSelector"], pod["metadata"]["labels"]) for p in clients["from"]), (
            component
        )
    (peer,) = controller["from"]
    assert selects(peer["podSelector"], kafka["metadata"]["labels"])
    assert not selects(peer["podSelector"], labels_of(restricted, "Deployment", "worker"))
    # It reaches DNS and itself, nothing else.
    assert egress_ports(restricted, kafka) == {53, 9092, 9093}


def test_the_embedded_redis_admits_the_sink_and_the_test_pod_alone(
    restricted: list[Object],
) -> None:
    redis = one(restricted, "Deployment", "redis")["spec"]["template"]
    (policy,) = policies_of(restricted, redis)
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": 6379, "protocol": "TCP"}]
    admitted = set()
    for component, pod in pod_specs(restricted):
        if any(selects(p["podSelector"], pod["metadata"]["labels"]) for p in ingress["from"]):
            admitted.add(component)
    assert admitted == {"sink-redis"}
    (test_pod,) = by_kind(restricted, "Pod")  # `helm test`
    assert any(selects(p["podSelector"], test_pod["metadata"]["labels"]) for p in ingress["from"])
    assert policy["spec"]["egress"] == []  # it reaches nothing


def test_ingress_is_restricted_by_default_and_egress_is_not(default: list[Object]) -> None:
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"]
                for p in by_kind(default, "NetworkPolicy")}  # fmt: skip
    assert set(policies) == (GPUWATCH - {"topics"}) | {"kafka", "redis"}
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress"]
        assert "egress" not in spec


def test_the_strimzi_values_reach_the_brokers_by_kafka_to(strimzi: list[Object]) -> None:
    values = yaml.safe_load(STRIMZI_VALUES.read_text(encoding="utf-8"))
    for component, pod in pod_specs(strimzi):
        rules = [r for p in policies_of(strimzi, pod) for r in p["spec"]["egress"]]
        for rule in values["networkPolicy"]["kafkaTo"]:
            assert rule in rules, component
        talks_to_api = component in ("k8s-watcher", "node-agent")  # the agent: ResourceSlices
        assert (values["networkPolicy"]["apiServer"][0] in rules) is talks_to_api, component


# --- the chart as a package, the docs -----------------------------------------------------


@pytest.mark.parametrize("values", [STRIMZI_VALUES, SIM_VALUES, TLS_VALUES])
def test_helm_lint_strict_passes_for_every_ci_values_file(helm: str, values: Path) -> None:
    done = run_command([helm, "lint", "--strict", str(CHART), "-f", str(values)], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_sim_values_run_on_the_embedded_kafka(helm: str) -> None:
    objects = render(helm, "-f", str(SIM_VALUES))
    (statefulset,) = by_kind(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    worker = spec_of(objects, "Deployment", "worker")["containers"][0]
    assert env_of(worker)["GPUWATCH_KAFKA_BOOTSTRAP"]["value"] == "gw-gpuwatch-kafka:9092"


def test_the_readme_lists_every_topic_and_group_of_a_locked_down_kafka() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Topics and ACLs for a locked-down Kafka", 1)[1].split("\n#", 1)[0]
    table = {line.split("|")[1].strip().strip("`") for line in section.splitlines()
             if line.startswith("| `")}  # fmt: skip
    settings = Settings()
    assert set(code_topics("gpuwatch.", "gpuwatch")) <= table
    assert {settings.kafka.app_id, redis_group(settings), metrics_group(settings)} <= table
