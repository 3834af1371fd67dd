"""How `gpuwatch top` writes a cell: ages, bytes, percentages, dollars, uuids, subjects.

Pure: values in, short strings out (`3m05s`, `57.0Gi`, `87%`, `GPU-8f3c2a1e`); `-` where a
value is unknown. The tables of `gpuwatch/top/text.py` and the subject names of the JSON
(`gpuwatch/top/as_json.py`) use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from gpuwatch.top.view import AlertRow

__all__ = [
    "NONE",
    "fmt_age",
    "fmt_bytes",
    "fmt_pct",
    "fmt_per_unit",
    "fmt_usd",
    "gpus_cell",
    "owner_name",
    "short_uuid",
    "since",
    "subject",
    "vram_cell",
]

NONE: Final = "-"
_GPUS_LISTED: Final = 2  # uuids listed per pod row; the rest is counted ("+6")


def fmt_age(ms: int) -> str:
    """A duration in milliseconds as `42s`, `3m05s`, `2h07m`, `3d04h`; negative is 0s."""
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


def since(now_ms: int, at: int | None) -> str:
    """The age of `at` (epoch ms) at `now_ms`; `-` when unknown."""
    return NONE if at is None else fmt_age(now_ms - at)


def fmt_bytes(n: int | None) -> str:
    """Bytes in binary units with one decimal: `57.0Gi`, `512.0Mi`; `-` when unknown."""
    if n is None:
        return NONE
    value = float(n)
    for unit in ("", "Ki", "Mi", "Gi"):
        if value < 1024:
            return f"{value:.0f}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}Ti"


def fmt_pct(value: float | None) -> str:
    """A percentage 0..100 as `87%`; `-` when unknown."""
    return NONE if value is None else f"{value:.0f}%"


def fmt_usd(usd: float) -> str:
    """Dollars: four decimals under $1 (a few minutes of a GPU), two from there on."""
    return f"{usd:.4f}" if abs(usd) < 1 else f"{usd:.2f}"


def fmt_per_unit(per_unit: Mapping[str, float | None]) -> str:
    """Cost per unit of work: `$0.000111/steps`; tokens per thousand (`$0.000741/1k
    tokens`), as serving is priced; `-` for a pod that reports none."""
    cells = []
    for unit, usd in sorted(per_unit.items()):
        if usd is None:
            cells.append(f"-/{unit}")
        elif "token" in unit:
            cells.append(f"${usd * 1000:.3g}/1k {unit}")
        else:
            cells.append(f"${usd:.3g}/{unit}")
    return " ".join(cells) or NONE


def short_uuid(uuid: str) -> str:
    """`GPU-8f3c2a1e-5b7d-...` as `GPU-8f3c2a1e`, the form alert summaries use."""
    return uuid[:12]


def gpus_cell(gpus: Sequence[str]) -> str:
    """A pod's GPUs: the count, then the first uuids (`8 GPU-00000000,GPU-11111111,+6`)."""
    if not gpus:
        return "0"
    listed = ",".join(short_uuid(g) for g in gpus[:_GPUS_LISTED])
    more = f",+{len(gpus) - _GPUS_LISTED}" if len(gpus) > _GPUS_LISTED else ""
    return f"{len(gpus)} {listed}{more}"


def vram_cell(used: int | None, total: int | None) -> str:
    """`20.0Gi/80.0Gi`; `-` without a reading."""
    if used is None:
        return NONE
    return f"{fmt_bytes(used)}/{fmt_bytes(total)}"


def owner_name(uid: str, names: Mapping[str, str]) -> str:
    """`namespace/pod` of a pod uid; the uid's first 8 characters for a pod not known."""
    return names.get(uid, uid[:8])


def subject(alert: AlertRow, names: Mapping[str, str]) -> str:
    """What an alert is about: `pod ml/train-0`, `gpu GPU-8f3c2a1e@node`, `node gpu-node-02`."""
    if alert.subject_kind == "pod" and alert.subject_uid:
        return f"pod {owner_name(alert.subject_uid, names)}"
    if alert.subject_kind == "gpu" and alert.subject_uuid:
        node = f"@{alert.subject_node}" if alert.subject_node else ""
        return f"gpu {short_uuid(alert.subject_uuid)}{node}"
    if alert.subject_kind == "workload":
        parts = (alert.labels.get("namespace"), alert.labels.get("workload"))
        return f"workload {'/'.join(p for p in parts if p) or NONE}"
    return f"{alert.subject_kind} {alert.subject_node or NONE}"
