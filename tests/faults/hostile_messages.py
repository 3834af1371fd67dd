"""Seeded malformed and hostile messages for the worker's input topics, each with its verdict.

Two sets come out of here:

- `invalid_messages`: messages no worker may process (fuzzed bytes, truncated JSON, wrong
  types, huge arrays, deep nesting, bad Unicode, values that cannot be true, other schemas,
  tombstones). Each carries a piece of the reason its dead letter must give. Whether a
  fuzzed message is invalid is decided here, without the worker's code: by Python's strict
  `json` module and the committed JSON Schemas (a mutation both accept is thrown away).
- `hostile_valid`: messages valid per the schemas whose names are built to break the
  Prometheus exposition and Redis keys (quotes, backslashes, newlines, NUL, emoji,
  right-to-left marks, 10 kB strings) or whose numbers are extreme; the worker must process
  them like any other message, on their own nodes and pods.

Every message stays under the broker's default 1 MB message size.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from jsonschema import Draft202012Validator

from schemas.export import JSON_DIR
from schemas.topics import K8S_NODES, K8S_PODS, NVML_SAMPLES

SAMPLES: Final = NVML_SAMPLES.name
PODS: Final = K8S_PODS.name
NODES: Final = K8S_NODES.name
MAX_BYTES: Final = 1_040_000  # under the producer's max_request_size (1 MiB) with overhead
LIMIT: Final = 512 * 1024  # the worker refuses larger values unread (streams/core/sanity.py)
S: Final = 1000

# How many of each kind (10,000 in all).
COUNTS: Final[dict[str, int]] = {
    "random_bytes": 1500,
    "mutated": 2000,
    "truncated": 1500,
    "wrong_type": 2000,
    "huge_array": 20,
    "deep_nesting": 300,
    "bad_unicode": 810,
    "impossible": 1200,
    "other_schema": 600,
    "tombstone": 70,
}
TOTAL: Final = sum(COUNTS.values())


@dataclass(frozen=True)
class Hostile:
    """One message to produce: unprefixed topic, key, value, kind and what its reason says."""

    topic: str
    key: bytes | None
    value: bytes | None
    kind: str
    expect: str
    """A piece of the dead letter's reason ("" for any non-empty reason)."""


@dataclass(frozen=True)
class Bases:
    """The valid traffic the hostile messages are made from: its dicts and keys."""

    t0: int
    node: str
    samples: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    node_event: dict[str, Any]


# Name -> (the raw string, what a Prometheus label shows of it). The label drops what is not
# printable (control and format characters, line separators) and cuts beyond 253 characters.
NAMES: Final[dict[str, tuple[str, str | None]]] = {
    "quote": ('q"uo"te', 'q"uo"te'),
    "backslash": ("back\\slash\\", "back\\slash\\"),
    "newline": ("new\nline", "newline"),
    "crlf": ("cr\r\nlf", "crlf"),
    "nul": ("nul\x00byte", "nulbyte"),
    "emoji": ("emoji-\U0001f680\U0001f525", "emoji-\U0001f680\U0001f525"),
    "rtl": ("rtl-\u202eevil\u200f", "rtl-evil"),
    "injection": (
        'inj"} 1\n# TYPE gpuwatch_pod_state counter\ngpuwatch_evil{a="b',
        'inj"} 1# TYPE gpuwatch_pod_state countergpuwatch_evil{a="b',
    ),
    "escapes": ('esc\\"\\n\\', 'esc\\"\\n\\'),
    "glob": ("glob-*?[a]{b}:c", "glob-*?[a]{b}:c"),
    "unicode": ("\u540d\u524d-\u00fcn\u00ef-\u0394", "\u540d\u524d-\u00fcn\u00ef-\u0394"),
    "separators": ("sep\u2028ara\u2029tor\ttab", "separatortab"),
    "long": ("long-" + "L" * 10_000, None),
}


def hostile_strings() -> list[tuple[str, str, str | None]]:
    """(name, raw string, label shown) of every hostile string."""
    return [(name, raw, shown) for name, (raw, shown) in NAMES.items()]


class Oracle:
    """Whether bytes are a valid message of a topic, by the committed JSON Schemas alone."""

    def __init__(self) -> None:
        self._validators: dict[str, Draft202012Validator] = {}
        self._fields: dict[tuple[str, str], Draft202012Validator] = {}
        for spec in (NVML_SAMPLES, K8S_PODS, K8S_NODES):
            path = JSON_DIR / spec.json_schema_file
            document = json.loads(path.read_text(encoding="utf-8"))
            self._validators[spec.name] = Draft202012Validator(document)
            defs = document.get("$defs", {})
            for name, field in document["properties"].items():
                self._fields[spec.name, name] = Draft202012Validator({**field, "$defs": defs})

    def is_json(self, raw: bytes) -> bool:
        """Strict JSON text in UTF-8 (no BOM, no NaN, no raw control characters)."""
        try:
            json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
        except (ValueError, RecursionError):
            return False
        return True

    def valid(self, topic: str, raw: bytes) -> bool:
        """Strict JSON and valid per the topic's JSON Schema."""
        if not self.is_json(raw):
            return False
        return self._validators[topic].is_valid(json.loads(raw))

    def field_valid(self, topic: str, message: dict[str, Any], field: str) -> bool:
        """Whether one top-level field is present and valid (the rest known to be valid)."""
        if field not in message:
            return False
        return self._fields[topic, field].is_valid(message[field])


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Maker:
    """Builds the invalid messages of each kind from the valid traffic, with one seeded RNG."""

    def __init__(self, rng: random.Random, bases: Bases, oracle: Oracle) -> None:
        self.rng = rng
        self.b = bases
        self.oracle = oracle
        self.node_key = bases.node.encode()
        self._raw = {
            SAMPLES: [_dump(s) for s in bases.samples],
            PODS: [_dump(p) for p in bases.pods],
            NODES: [_dump(bases.node_event)],
        }
        self.pod_keys = [p["uid"].encode() for p in bases.pods]

    # -- helpers --------------------------------------------------------------------------
    def topic(self) -> str:
        """Samples most, as in a cluster; pods and nodes too."""
        return self.rng.choices((SAMPLES, PODS, NODES), weights=(5, 3, 2))[0]

    def key(self, topic: str) -> bytes | None:
        """Mostly the valid traffic's keys (same partitions), sometimes garbage or none."""
        r = self.rng.random()
        if r < 0.05:
            return None
        if r < 0.12:
            return self.rng.randbytes(self.rng.randint(1, 40))
        if topic == PODS:
            return self.rng.choice(self.pod_keys)
        return self.node_key

    def base(self, topic: str) -> dict[str, Any]:
        """A fresh copy of a valid message of the topic."""
        value: dict[str, Any] = json.loads(self.rng.choice(self._raw[topic]))
        return value

    def message(self, topic: str, value: bytes | None, kind: str, expect: str) -> Hostile:
        assert value is None or len(value) < MAX_BYTES, (kind, len(value))
        if value is not None and len(value) > LIMIT:
            expect = "over the limit"
        key = self.key(topic)
        if value is None and key is None:  # Kafka takes no message without both
            key = self.node_key
        return Hostile(topic, key, value, kind, expect)

    # -- kinds ----------------------------------------------------------------------------
    def random_bytes(self) -> Hostile:
        topic = self.topic()
        while True:
            raw = self.rng.randbytes(self.rng.randint(1, 600))
            if not self.oracle.is_json(raw) or not isinstance(json.loads(raw), dict):
                return self.message(topic, raw, "random_bytes", "JSON")

    def mutated(self) -> Hostile:
        """A valid message with a few bytes replaced, inserted or deleted; invalid by the oracle."""
        topic = self.topic()
        while True:
            raw = bytearray(_dump(self.base(topic)))
            for _ in range(self.rng.randint(1, 4)):
                at = self.rng.randrange(len(raw))
                op = self.rng.random()
                byte = self.rng.choice((self.rng.randrange(256), self.rng.choice(b'{}[]",:0a\\')))
                if op < 0.5:
                    raw[at] = byte
                elif op < 0.75:
                    raw.insert(at, byte)
                else:
                    del raw[at]
            value = bytes(raw)
            if not self.oracle.valid(topic, value):
                return self.message(topic, value, "mutated", "")

    def truncated(self) -> Hostile:
        topic = self.topic()
        raw = _dump(self.base(topic))
        return self.message(topic, raw[: self.rng.randrange(len(raw))], "truncated", "JSON")

    def wrong_type(self) -> Hostile:
        """One field (at any depth) of a wrong type, or missing; the top field names the place."""
        topic = self.topic()
        while True:
            value = self.base(topic)
            places = list(_places(value))
            path = self.rng.choice(places)
            parent = _get(value, path[:-1])
            if self.rng.random() < 0.15 and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = self.rng.choice(_WRONG)
            top = str(path[0])
            if not self.oracle.field_valid(topic, value, top):
                return self.message(topic, _dump(value), "wrong_type", top)

    def huge_array(self, n: int) -> Hostile:
        """Arrays of 100,000 entries (or as many as 1 MB holds) where a few are expected."""
        sample, pod, node = self.base(SAMPLES), self.base(PODS), self.base(NODES)
        variants: list[tuple[str, dict[str, Any], str]] = []
        gpu = sample["gpus"][0]
        variants.append((SAMPLES, {**sample, "gpus": [0] * 100_000}, "gpus"))
        variants.append((SAMPLES, {**sample, "gpus": [{}] * 100_000}, "gpus"))
        variants.append(
            (SAMPLES, {**sample, "gpus": [{**gpu, "xid_errors": ["x"] * 100_000}]}, "gpus")
        )
        variants.append((SAMPLES, {**sample, "allocations": [None] * 100_000}, "allocations"))
        procs = [
            {"pid": i, "mem_bytes": None, "sm_pct": "x", "pod_uid": None, "container": None}
            for i in range(9_000)
        ]
        variants.append((SAMPLES, {**sample, "gpus": [{**gpu, "processes": procs}]}, "gpus"))
        # Types right, values impossible: 5,000 processes use more memory than the GPU has,
        # 5,000 reasons (and under the worker's size limit, so that they are all worked out).
        heavy = [
            {"pid": i, "mem_bytes": 10**15, "sm_pct": None, "pod_uid": None, "container": None}
            for i in range(5_000)
        ]
        variants.append((SAMPLES, {**sample, "gpus": [{**gpu, "processes": heavy}]}, "mem_bytes"))
        many_gpus = [{**gpu, "uuid": "GPU-same", "processes": []}] * 1_500
        variants.append((SAMPLES, {**sample, "gpus": many_gpus}, "more than once"))
        variants.append((PODS, {**pod, "conditions": [None] * 100_000}, "conditions"))
        variants.append((PODS, {**pod, "containers": [[]] * 100_000}, "containers"))
        variants.append((PODS, {**pod, "labels": {f"k{i}": i for i in range(60_000)}}, "labels"))
        variants.append(
            (NODES, {**node, "gpu_capacity": {f"r{i}": "x" for i in range(50_000)}}, "gpu_capacity")
        )
        # Valid per the schema, but a megabyte: its records and state would be as large.
        giant = {**pod, "labels": {f"k{i:04d}": "v" * 1000 for i in range(1020)}}
        variants.append((PODS, giant, ""))
        topic, value, expect = variants[n % len(variants)]
        raw = _dump(value)
        if len(raw) >= MAX_BYTES:  # pragma: no cover - sizes above are chosen to fit
            raise AssertionError(f"huge array variant {n % len(variants)} is {len(raw)} bytes")
        return self.message(topic, raw, "huge_array", expect)

    def deep_nesting(self) -> Hostile:
        """Thousands of nested arrays or objects: at the top, in a field, in an unknown field."""
        topic = self.topic()
        depth = self.rng.choice((1_000, 2_000, 5_000, 10_000))
        depth *= 10 if self.rng.random() < 0.05 else 1  # a few of up to 100,000 levels
        deep_list = "[" * depth + "]" * depth
        deep_obj = '{"a":' * depth + "1" + "}" * depth
        value = self.base(topic)
        r = self.rng.randrange(5)
        if r == 0:
            raw, expect = deep_list, "JSON"
        elif r == 1:
            raw, expect = "[" * depth, "JSON"  # never closed
        elif r == 2:  # a known field: labels of pods and nodes, the GPUs of a sample
            field = "gpus" if topic == SAMPLES else "labels"
            value[field] = "@deep@"
            raw, expect = _dump(value).decode().replace('"@deep@"', deep_obj), field
        elif r == 3:  # an unknown field: readers skip it, but only so deep
            value["extension"] = "@deep@"
            raw, expect = _dump(value).decode().replace('"@deep@"', deep_list), "nested"
        else:  # a wrong schema, then an unknown field that deep
            raw, expect = f'{{"schema":5,"x":{deep_obj}}}', ""
        return self.message(topic, raw.encode(), "deep_nesting", expect)

    def bad_unicode(self) -> Hostile:
        """Text fields that are not Unicode text: bad UTF-8, lone surrogates, BOM, UTF-16."""
        topic = self.topic()
        raw = _dump(self.base(topic))
        field = {SAMPLES: b'"node":"', PODS: b'"name":"', NODES: b'"node":"'}[topic]
        at = raw.index(field) + len(field)
        r = self.rng.randrange(8)
        if r == 0:
            value = raw[:at] + b"\xff\xfe" + raw[at:]  # not UTF-8 at all
        elif r == 1:
            value = raw[:at] + b"\xc0\xaf" + raw[at:]  # overlong "/"
        elif r == 2:
            value = raw[:at] + b"\xed\xa0\x80" + raw[at:]  # a surrogate encoded as UTF-8
        elif r == 3:
            value = raw[:at] + b"\\ud800" + raw[at:]  # a lone high surrogate escape
        elif r == 4:
            value = raw[:at] + b"\\udfff" + raw[at:]  # a lone low surrogate escape
        elif r == 5:
            value = b"\xef\xbb\xbf" + raw  # a byte order mark (RFC 8259: must not be sent)
        elif r == 6:
            value = raw.decode().encode("utf-16-le")
        else:
            value = raw[:at] + b"\x00\x01\x1b" + raw[at:]  # raw control characters in a string
        return self.message(topic, value, "bad_unicode", "JSON")

    def impossible(self) -> Hostile:
        """Right types, values that cannot be true (or a unit mix-up)."""
        topic = self.topic()
        value = self.base(topic)
        now = self.b.t0
        year_ms = 365 * 86_400 * S
        if topic == SAMPLES:
            gpu = value["gpus"][0]
            choices: list[tuple[Callable[[], None], str]] = [
                (lambda: value.update(ts=value["ts"] // S), "before 2015"),
                (lambda: value.update(ts=value["ts"] * S), "after 2100"),
                (lambda: value.update(ts=now + 10 * year_ms), "ahead of the wall clock"),
                (lambda: value.update(interval_ms=5), "interval_ms"),
                (lambda: value.update(interval_ms=7_200_000), "interval_ms"),
                (lambda: value.update(node=""), "node is empty"),
                (lambda: gpu.update(power_w=75_000.0), "power_w"),
                (lambda: gpu.update(mem_used_bytes=gpu["mem_total_bytes"] * 2), "mem_used_bytes"),
                (lambda: value.update(gpus=[gpu, gpu]), "more than once"),
                (lambda: gpu.update(util_pct=250.0), "util_pct"),
                (lambda: gpu.update(mem_total_bytes=-1), "mem_total_bytes"),
                (lambda: value.update(interval_ms=0), "interval_ms"),
            ]
        elif topic == PODS:
            created = value["created_at"]
            choices = [
                (lambda: value.update(ts=value["ts"] // S), "before 2015"),
                (lambda: value.update(ts=now + 10 * year_ms), "ahead of the wall clock"),
                (lambda: value.update(created_at=created * S), "after 2100"),
                (lambda: value.update(started_at=created - 3_600 * S), "started_at"),
                (lambda: value.update(finished_at=created - 7_200 * S), "finished_at"),
                (lambda: value.update(phase="Running", node=None), "without a node"),
                (lambda: value.update(phase="Runing"), "phase"),
                (lambda: value.update(gpu_request={"nvidia.com/gpu": -1}), "gpu_request"),
            ]
        else:
            choices = [
                (lambda: value.update(ts=value["ts"] // S), "before 2015"),
                (lambda: value.update(ts=value["ts"] * S), "after 2100"),
                (lambda: value.update(ts=now + 10 * year_ms), "ahead of the wall clock"),
                (lambda: value.update(node=""), "node is empty"),
                (lambda: value.update(ready="yes"), "ready"),
            ]
        change, expect = self.rng.choice(choices)
        change()
        return self.message(topic, _dump(value), "impossible", expect)

    def other_schema(self) -> Hostile:
        """Another topic's value, an unknown major version, no schema, or a schema not a string."""
        topic = self.topic()
        value = self.base(topic)
        other = self.base(self.rng.choice([t for t in (SAMPLES, PODS, NODES) if t != topic]))
        r = self.rng.randrange(5)
        if r == 0:
            return self.message(topic, _dump(other), "other_schema", "expected")
        if r == 1:
            value["schema"] = value["schema"].replace("/v1", "/v2")
            return self.message(topic, _dump(value), "other_schema", "unknown major version")
        if r == 2:
            del value["schema"]
            return self.message(topic, _dump(value), "other_schema", "schema")
        if r == 3:
            value["schema"] = self.rng.choice([5, None, [], {"v": 1}, True])
            return self.message(topic, _dump(value), "other_schema", "schema")
        return self.message(topic, _dump([value]), "other_schema", "JSON")

    def tombstone(self) -> Hostile:
        return self.message(self.topic(), None, "tombstone", "tombstone")


_WRONG: Final[tuple[Any, ...]] = ("x", 0.5, -1, True, None, [], {}, [1], {"a": 1}, "1", 10**40)


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every field and array entry below a message."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*path, i)
            yield from _places(v, (*path, i))


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def invalid_messages(seed: int, bases: Bases) -> list[Hostile]:
    """`TOTAL` invalid messages, the kinds mixed in a seeded order."""
    rng = random.Random(seed)
    maker = Maker(rng, bases, Oracle())
    made: list[Hostile] = []
    for kind, count in COUNTS.items():
        for n in range(count):
            if kind == "huge_array":
                made.append(maker.huge_array(n))
            else:
                made.append(getattr(maker, kind)())
    rng.shuffle(made)
    return made


# -- hostile but valid -------------------------------------------------------------------


@dataclass(frozen=True)
class HostilePod:
    """A pod of the hostile set: its uid, names, team label and node (None: Pending)."""

    uid: str
    namespace: str
    name: str
    team: str
    node: str | None
    shown: tuple[str | None, str | None, str | None]
    """What /metrics shows of (namespace, pod, team)."""


def hostile_pods(t0: int, nodes: list[str]) -> list[HostilePod]:
    """One Pending pod per hostile string (in every name), and a Running pod on each node."""
    pods: list[HostilePod] = []
    for i, (name, raw, shown) in enumerate(hostile_strings()):
        ns_raw, ns_shown = f"ns{i}-{raw}", None if shown is None else f"ns{i}-{shown}"
        pod_shown = None if shown is None else f"p{i}-{shown}"
        team_shown = None if shown is None else f"t{i}-{shown}"
        pods.append(
            HostilePod(
                uid=f"uid-{name}-{raw}",
                namespace=ns_raw,
                name=f"p{i}-{raw}",
                team=f"t{i}-{raw}",
                node=None,
                shown=(ns_shown, pod_shown, team_shown),
            )
        )
    for j, node in enumerate(nodes):
        raw = list(NAMES.values())[j][0]
        pods.append(
            HostilePod(
                uid=f"uid-running-{j}-{raw}",
                namespace=f"run{j}-{raw}",
                name=f"runner{j}-{raw}",
                team=f"rt{j}-{raw}",
                node=node,
                shown=(None, None, None),
            )
        )
    return pods


def pod_value(pod: HostilePod, t0: int) -> dict[str, Any]:
    """The pod's ADDED event at t0 - 5 s: Pending and unschedulable, or Running on its node."""
    running = pod.node is not None
    created = t0 - 60 * S
    return {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": "ADDED",
        "ts": t0 - 5 * S,
        "resource_version": "7",
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "node": pod.node,
        "phase": "Running" if running else "Pending",
        "created_at": created,
        "scheduled_at": created + S if running else None,
        "started_at": created + 2 * S if running else None,
        "finished_at": None,
        "gpu_request": {"nvidia.com/gpu": 1},
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True" if running else "False",
                "reason": None if running else "Unschedulable",
                "message": None if running else f"0/4 nodes: {pod.name}",
            }
        ],
        "containers": [
            {
                "name": pod.name,
                "state": "running" if running else "waiting",
                "reason": None,
                "exit_code": None,
                "restarts": 0,
            }
        ]
        if running
        else [],
        "labels": {"team": pod.team, "project": pod.name},
        "owner": {"kind": "Job", "name": pod.name},
        "priority_class": pod.namespace,
        "queue": pod.name,
    }


def hostile_node_names() -> list[str]:
    """Node names of the hostile set (valid per schema: any non-empty string)."""
    return [f"node-{NAMES['quote'][0]}", f"node-{NAMES['nul'][0]}-{NAMES['emoji'][0]}"]


def gpu_uuid(node_index: int) -> str:
    """The one GPU of a hostile node, with a uuid as hostile as the names."""
    return f"GPU-{node_index}-{NAMES['injection'][0]}-{NAMES['rtl'][0]}"


def node_value(node: str, index: int, t0: int) -> dict[str, Any]:
    """The hostile node's k8s.nodes event at t0 - 5 s."""
    return {
        "schema": "gpuwatch.k8s.node/v1",
        "type": "ADDED",
        "node": node,
        "ts": t0 - 5 * S,
        "gpu_capacity": {"nvidia.com/gpu": 1},
        "gpu_allocatable": {"nvidia.com/gpu": 1},
        "gpu_product": NAMES["backslash"][0],
        "labels": {"nodepool": NAMES["newline"][0], "nvidia.com/gpu.replicas": "1"},
        "ready": True,
        "unschedulable": False,
    }


def sample_value(node: str, index: int, pod: HostilePod, ts: int, seq: int) -> dict[str, Any]:
    """One second of a hostile node: its GPU allocated to `pod`, busy or idle by the second."""
    uuid = gpu_uuid(index)
    busy = seq % 2 == 0
    return {
        "schema": "gpuwatch.nvml.sample/v1",
        "node": node,
        "ts": ts,
        "interval_ms": 1000,
        "seq": seq,
        "gpus": [
            {
                "uuid": uuid,
                "index": index,
                "model": NAMES["long"][0] if index else NAMES["injection"][0],
                "parent_uuid": None,
                "mig_profile": NAMES["emoji"][0],
                "sharing": "exclusive",
                "util_pct": 90.0 if busy else 0.0,
                "mem_util_pct": 10.0,
                "mem_used_bytes": 40 << 30,
                "mem_total_bytes": 80 << 30,
                "power_w": 400.0,
                "temp_c": -(2**63),
                "xid_errors": [2**64 - 1] * 1000,
                "ecc_dbe": 2**64,
                "processes": [
                    {
                        "pid": 2**64 - 1,
                        "mem_bytes": 30 << 30,
                        "sm_pct": 90.0 if busy else 0.0,
                        "pod_uid": pod.uid,
                        "container": pod.name,
                    }
                ],
            }
        ],
        "allocations": [
            {
                "pod_uid": pod.uid,
                "namespace": pod.namespace,
                "pod": pod.name,
                "container": pod.name,
                "resource": "nvidia.com/gpu",
                "device_ids": [uuid],
            }
        ],
    }
