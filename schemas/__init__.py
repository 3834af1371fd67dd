"""gpuwatch wire contracts: typed values, codecs and JSON Schemas of every topic."""

from . import topics
from .alert import Alert, AlertName, AlertStatus, AlertSubject, Severity
from .attribution import Attribution, GpuAttribution
from .capacity import Capacity, ReclaimableGpu
from .codec import (
    Codec,
    KeyKind,
    MalformedJSON,
    SchemaError,
    TopicSpec,
    UnknownSchemaVersion,
    WrongSchema,
)
from .deadletter import DeadLetter, RawEncoding
from .fields import (
    AttributionMethod,
    EpochMs,
    K8sEventType,
    Labels,
    LifecycleState,
    Sharing,
    Value,
)
from .gpu_window import GpuWindow, PodWindowShare
from .ids import AlertFingerprint, GpuUuid, NodeName, PodUid
from .k8s_node import K8sNode
from .k8s_pod import Condition, ContainerStatus, K8sPod, Owner, PodPhase
from .k8s_workload import K8sWorkload, WorkloadCondition
from .nvml_sample import Allocation, GpuProcess, GpuReading, NvmlSample
from .pod_lifecycle import PodLifecycle
from .pod_usage import GpuUsage, PodUsage
from .topics import *  # noqa: F403  (the topic specs: `topics.__all__`)
from .workload_lifecycle import WorkloadLifecycle, WorkloadState

__all__ = [
    "Alert",
    "AlertFingerprint",
    "AlertName",
    "AlertStatus",
    "AlertSubject",
    "Allocation",
    "Attribution",
    "AttributionMethod",
    "Capacity",
    "Codec",
    "Condition",
    "ContainerStatus",
    "DeadLetter",
    "EpochMs",
    "GpuAttribution",
    "GpuProcess",
    "GpuReading",
    "GpuUsage",
    "GpuUuid",
    "GpuWindow",
    "K8sEventType",
    "K8sNode",
    "K8sPod",
    "K8sWorkload",
    "KeyKind",
    "Labels",
    "LifecycleState",
    "MalformedJSON",
    "NodeName",
    "NvmlSample",
    "Owner",
    "PodLifecycle",
    "PodPhase",
    "PodUid",
    "PodUsage",
    "PodWindowShare",
    "RawEncoding",
    "ReclaimableGpu",
    "SchemaError",
    "Severity",
    "Sharing",
    "TopicSpec",
    "UnknownSchemaVersion",
    "Value",
    "WorkloadCondition",
    "WorkloadLifecycle",
    "WorkloadState",
    "WrongSchema",
]
__all__ += topics.__all__
