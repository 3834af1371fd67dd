"""Each Redis script's named arguments: the header of the .lua file and the Python call class
name the same KEYS and ARGV, in the same order, one for one."""

from __future__ import annotations

import re
from importlib import resources
from typing import get_args

import pytest

from sinks.redis.script_args import (
    AlertState,
    FieldIfNewer,
    GpuLiveCall,
    HsetIfNewer,
    Param,
    PodTransition,
    PodWindow,
    Positions,
    Rebuild,
    ScriptCall,
    ScriptName,
    TimelineAdd,
    WorkloadCall,
    params,
)

CALLS: dict[str, type[ScriptCall]] = {
    "pod_transition": PodTransition,
    "pod_window": PodWindow,
    "timeline_add": TimelineAdd,
    "alert_state": AlertState,
    "hset_if_newer": HsetIfNewer,
    "gpu_live": GpuLiveCall,
    "positions": Positions,
    "field_if_newer": FieldIfNewer,
    "workload": WorkloadCall,
    "rebuild": Rebuild,
}
# `-- KEYS[2] name`, `-- ARGV[5..] name` (a variable tail), `-- KEYS[3] name?` (may be left out)
HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.)?\] ([a-z_]+)(\?)?$")
SLOTISH = re.compile(r"(KEYS|ARGV)\[")


def header(source: str) -> list[Param]:
    """The named arguments a script's header lists, checked to number 1, 2, ... per kind."""
    out: list[Param] = []
    count = {"KEYS": 0, "ARGV": 0}
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        found = HEADER.match(line)
        if found is None:
            assert not SLOTISH.search(line), f"not a header line: {line!r}"
            continue
        slot, number, rest, name, optional = found.groups()
        count[slot] += 1
        assert int(number) == count[slot], f"{line!r}: expected {slot}[{count[slot]}]"
        out.append(Param("KEYS" if slot == "KEYS" else "ARGV", name, bool(rest), bool(optional)))
    return out


def test_every_script_has_a_call_class_and_every_call_class_a_script() -> None:
    lua = resources.files("sinks.redis").joinpath("lua")
    scripts = {entry.name.removesuffix(".lua") for entry in lua.iterdir()}
    assert scripts == set(get_args(ScriptName)) == set(CALLS)
    assert {name: call.SCRIPT for name, call in CALLS.items()} == {n: n for n in CALLS}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_script_header_names_the_call_classs_arguments_in_order(name: str) -> None:
    source = resources.files("sinks.redis").joinpath("lua", f"{name}.lua").read_text("utf-8")
    assert header(source) == params(CALLS[name])


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_tail_or_a_key_left_out_comes_last_of_its_kind(name: str) -> None:
    for slot in ("KEYS", "ARGV"):
        mine = [p for p in params(CALLS[name]) if p.slot == slot]
        for param in mine[:-1]:
            assert not param.rest, f"{name}: {param.name} is a tail but not last"
        optional = [p.optional for p in mine]
        assert optional == sorted(optional), f"{name}: a key left out before a required one"


def test_a_call_flattens_by_name_into_the_scripts_order() -> None:
    call = HsetIfNewer(
        hash="h",
        order_field="window_start",
        order_value="60000",
        tie_field="window_revision",
        tie_value="1",
        index_member="GPU-a",
        fields=("node", "n1", "model", "H100"),
    )
    assert call.flat() == (
        "hset_if_newer",
        ("h",),
        ("window_start", "60000", "window_revision", "1", "GPU-a", "node", "n1", "model", "H100"),
    )
    with_index = TimelineAdd(
        stream="s", seen="z", pod="p", identity="i", ts="1", maxlen="9", ttl_s="0", fields=()
    )
    assert with_index.flat() == ("timeline_add", ("s", "z", "p"), ("i", "1", "9", "0"))


def test_the_header_reader_refuses_a_gap_and_a_stray_mention() -> None:
    with pytest.raises(AssertionError, match="expected ARGV"):
        header("-- KEYS[1] a\n-- ARGV[1] b\n-- ARGV[3] c\nlocal x = 1\n")
    with pytest.raises(AssertionError, match="not a header line"):
        header("-- KEYS[1] a\n-- and ARGV[2] is the other one\n")
