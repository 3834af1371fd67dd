"""The node side's durable state: one document per node, written whole, so a crash never splits it.

Everything the node side keeps about one node lives in one `NodeDoc`: its labels (prices),
its alert state, its open GPU windows and its pods' usage tracks. The worker writes the
document whole to a changelog-backed table after the outputs it caused are acknowledged.
After a crash the table holds, for each node, the state after some sample `seen_until`
ends; samples before it are replays and skipped, later ones are processed again and
give the same records (at-least-once with deterministic identities). Separate table keys
per window or per pod could be restored from different points in time, counting a
replayed sample twice in one and not at all in another.

A node is `(cluster, node)`: node names repeat across clusters. A node of the default
cluster is stored under its name, as before clusters existed (state in changelogs still
loads); a node of a named cluster under `cluster/node` (`node_key`): neither a node nor a
cluster name contains `/`, so the two forms never meet.
"""

from __future__ import annotations

from typing import Final

import msgspec

from schemas.fields import DEFAULT_CLUSTER, keep_default_cluster
from schemas.ids import NodeName
from schemas.k8s_node import K8sNode
from streams.core.fleet.fleet_state import FleetNode, FleetUse
from streams.core.node.gpu_alerts import NodeAlertState
from streams.core.node.gpu_windows import GpuWindowAcc, GpuWindows, KeptWindow
from streams.core.node.usage import PodTrack, UsageAggregator

__all__ = [
    "NodeDoc",
    "NodeRuntime",
    "PartitionMeta",
    "decode_doc",
    "decode_meta",
    "encode",
    "node_key",
]


def node_key(cluster: str, node: str) -> str:
    """A node's key among the nodes of every cluster: its name in the default cluster
    (the key it had before clusters existed), `cluster/node` in a named one."""
    return node if cluster == DEFAULT_CLUSTER else f"{cluster}/{node}"


class NodeDoc(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A node's state as stored; unknown fields are ignored, so it can grow."""

    node: NodeName
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    cluster: str = DEFAULT_CLUSTER
    """The node's cluster (left out for the default one, so older documents read as it)."""

    def __post_init__(self) -> None:
        keep_default_cluster(self)  # as the topic values do: the default is left out

    deleted: bool = False
    """A k8s.nodes DELETED was seen; the document goes once its windows are emitted."""
    seen_until: int | None = None
    """End of the newest sample applied: a sample starting before it is a replay."""
    closed_through: int | None = None
    """The node's GPU windows' `closed_through`."""
    alert: NodeAlertState | None = None
    windows: list[GpuWindowAcc] = msgspec.field(default_factory=list)
    tracks: list[PodTrack] = msgspec.field(default_factory=list)
    revisable: list[KeptWindow] = msgspec.field(default_factory=list)
    """Closed GPU windows late data may still revise (`GpuWindows`)."""
    fleet_node: FleetNode | None = None
    """What the node can allocate, as last sent to the fleet partition."""
    fleet_use: FleetUse | None = None
    """What is allocated and idle on it, as last sent to the fleet partition."""


class PartitionMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the node side keeps of a whole partition (SEMANTICS.md, Time)."""

    stream_time: int | None = None
    """The largest sample `ts`, or higher where the partition was raised while idle."""
    covered: int | None = None
    """End of the newest sample (`ts + interval_ms`) of the partition's own data."""
    longest_interval_ms: int = 0
    """The longest sample interval seen: an idle partition is one left behind by more."""
    idle: bool = False
    """Caught up and left behind by the others (set by a tick, cleared by a sample)."""
    live: bool = False
    """Its newest sample was processed within `LIVE_MS` of its end, by the wall clock: live
    data, not a backlog or a replay, so while it is quiet its time moves with the wall
    clock (SEMANTICS.md, Time)."""
    lag_ms: int = 0
    """How long after its end (wall clock) its newest sample was processed: a quiet
    partition's time moves with the wall clock less this and the lateness, from where its
    data was."""
    held: list[K8sNode] = msgspec.field(default_factory=list)
    """Node events ahead of stream time, by `ts`: applied when stream time reaches them."""


_ENCODER: Final = msgspec.json.Encoder()
_DOC: Final = msgspec.json.Decoder(NodeDoc)
_META: Final = msgspec.json.Decoder(PartitionMeta)


def encode(value: NodeDoc | PartitionMeta) -> bytes:
    """A document as compact JSON."""
    return _ENCODER.encode(value)


def decode_doc(raw: bytes) -> NodeDoc:
    """A node document back from JSON."""
    return _DOC.decode(raw)


def decode_meta(raw: bytes) -> PartitionMeta:
    """A partition's meta document back from JSON."""
    return _META.decode(raw)


class NodeRuntime:
    """One node's live state: its document's parts as the pure aggregators use them."""

    def __init__(
        self,
        doc: NodeDoc,
        window_ms: int,
        lateness_ms: int,
        flush_ms: int,
        horizon_ms: int = 0,
    ) -> None:
        self.node = doc.node
        self.cluster = cluster = doc.cluster
        self.key = node_key(doc.cluster, doc.node)
        """The node's key among the nodes of every cluster (`node_key`)."""
        self.labels = dict(doc.labels)
        self.deleted = doc.deleted
        self.seen_until = doc.seen_until
        self.fleet_node = doc.fleet_node
        self.fleet_use = doc.fleet_use
        self.fleet_seen: object = None
        """The allocations and firing idle GPUs `fleet_use` was last worked out from (not
        stored: after a load the next sample works it out again)."""
        self.alert = (
            doc.alert if doc.alert is not None else NodeAlertState(node=doc.node, cluster=cluster)
        )
        self.windows = GpuWindows(
            window_ms,
            lateness_ms,
            store={(acc.uuid, acc.window_start): acc for acc in doc.windows},
            closed_through=doc.closed_through,
            cluster=cluster,
            horizon_ms=horizon_ms,
            revisable={(k.acc.uuid, k.acc.window_start): k for k in doc.revisable},
        )
        self.usage = UsageAggregator(
            window_ms, flush_ms, store={track.uid: track for track in doc.tracks}, cluster=cluster
        )

    @classmethod
    def new(
        cls,
        node: NodeName,
        window_ms: int,
        lateness_ms: int,
        flush_ms: int,
        cluster: str = DEFAULT_CLUSTER,
    ) -> NodeRuntime:
        """A node nothing is known of yet."""
        return cls(NodeDoc(node=node, cluster=cluster), window_ms, lateness_ms, flush_ms)

    def doc(self) -> NodeDoc:
        """The document to store (windows by start and uuid, tracks by uid: replays match)."""
        windows = self.windows.store
        tracks = self.usage.store
        kept = self.windows.revisable
        return NodeDoc(
            node=self.node,
            labels=self.labels,
            cluster=self.cluster,
            deleted=self.deleted,
            seen_until=self.seen_until,
            closed_through=self.windows.closed_through,
            alert=self.alert,
            windows=[windows[key] for key in sorted(windows, key=lambda k: (k[1], k[0]))],
            tracks=[tracks[uid] for uid in sorted(tracks)],
            revisable=[kept[key] for key in sorted(kept, key=lambda k: (k[1], k[0]))],
            fleet_node=self.fleet_node,
            fleet_use=self.fleet_use,
        )

    def empty(self) -> bool:
        """A deleted node with nothing left to emit: its document can go (windows kept for
        revision go with it: a deleted node's agent has nothing more to send)."""
        return self.deleted and not self.windows.store and not self.usage.store
