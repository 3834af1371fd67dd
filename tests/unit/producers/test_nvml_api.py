"""NvmlApi stays true to the installed pynvml, and the recorded fake to NvmlApi."""

from __future__ import annotations

import inspect

import pynvml
import pytest
from fixtures.nvml.recorded_nvml import RecordedNvml

from producers.nvml import api
from producers.nvml.api import NvmlApi

API_FUNCTIONS = sorted(name for name in vars(NvmlApi) if name.startswith("nvml"))


def parameters(fn: object) -> list[str]:
    assert callable(fn)
    return [name for name in inspect.signature(fn).parameters if name != "self"]


@pytest.mark.parametrize("name", API_FUNCTIONS)
def test_pynvml_has_each_function_with_the_same_parameters(name: str) -> None:
    assert parameters(getattr(pynvml, name)) == parameters(getattr(NvmlApi, name))


@pytest.mark.parametrize("name", API_FUNCTIONS)
def test_the_recorded_fake_has_each_function_with_the_same_parameters(name: str) -> None:
    assert parameters(getattr(RecordedNvml, name)) == parameters(getattr(NvmlApi, name))


@pytest.mark.parametrize(
    ("protocol", "struct"),
    [
        (api.Utilization, pynvml.c_nvmlUtilization_t),
        (api.MemoryInfo, pynvml.c_nvmlMemory_v2_t),
        (api.MemoryInfo, pynvml.c_nvmlMemory_t),
        (api.ProcessInfo, pynvml.c_nvmlProcessInfo_v3_t),
        (api.ProcessUtilizationSample, pynvml.c_nvmlProcessUtilizationSample_t),
        (api.DeviceAttributes, pynvml.c_nvmlDeviceAttributes),
        (api.EventData, pynvml.c_nvmlEventData_t),
    ],
)
def test_struct_protocols_name_fields_pynvml_structs_have(protocol: type, struct: type) -> None:
    fields = {name for name, *_ in struct._fields_}  # type: ignore[attr-defined]
    wanted = {name for name, value in vars(protocol).items() if isinstance(value, property)}
    assert wanted
    assert wanted <= fields
