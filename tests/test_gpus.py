"""GPU sampling against a fake NvmlSource, plus the real pynvml on this driverless machine."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pynvml
import pytest

from fabricctl.supervisor.gpus import (
    GpuMonitor,
    GpuProcess,
    GpuReport,
    GpuSample,
    LostGpu,
    MemoryInfo,
    PynvmlSource,
    detect_gpus,
    sample,
)

GIB = 1 << 30


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeGpu:
    """One fake device: field name -> value, or an NVML error code to raise."""

    def __init__(self, uuid: str, **fields: Any) -> None:
        self.uuid = uuid
        self.fields: dict[str, Any] = {
            "name": "NVIDIA H200",
            "utilization": (87, 40),
            "memory": MemoryInfo(used=80 * GIB, total=141 * GIB, reserved=GIB // 2),
            "temperature": 61,
            "power_mw": 512_345,
            "power_limit_mw": 700_000,
            "clock_sm_mhz": 1980,
            "clock_mem_mhz": 3201,
            "processes": [GpuProcess(4242, 79 * GIB), GpuProcess(4343, None)],
            **fields,
        }

    def get(self, field: str) -> Any:
        value = self.fields[field]
        if isinstance(value, BaseException):
            raise value
        return value


class FakeSource:
    """An NvmlSource over FakeGpu objects; `init_error`/`handle_errors` simulate failures."""

    def __init__(self, gpus: list[FakeGpu], init_error: BaseException | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.handle_errors: dict[int, BaseException] = {}
        self.inits = 0

    def init(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def driver_version(self) -> str:
        return "570.86.15"

    def device_count(self) -> int:
        return len(self.gpus)

    def handle(self, index: int) -> FakeGpu:
        if index in self.handle_errors:
            raise self.handle_errors[index]
        return self.gpus[index]

    def uuid(self, handle: FakeGpu) -> str:
        return handle.uuid

    def __getattr__(self, field: str) -> Any:  # name, utilization, memory, ... per field
        return lambda handle: handle.get(field)


def two_gpus() -> FakeSource:
    return FakeSource([FakeGpu("GPU-aaaa"), FakeGpu("GPU-bbbb", temperature=55)])


def test_present_two_gpus_every_field() -> None:
    report = sample(two_gpus(), now=1234.5)
    assert report.available and report.reason is None
    assert report.driver_version == "570.86.15"
    assert report.sampled_at == 1234.5
    assert report.lost == []
    assert [g.uuid for g in report.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert report.gpus[0] == GpuSample(
        uuid="GPU-aaaa", index=0, name="NVIDIA H200", utilization_gpu=87, utilization_mem=40,
        memory_used=80 * GIB, memory_total=141 * GIB, memory_reserved=GIB // 2,
        temperature_c=61, power_w=512.345, power_limit_w=700.0, clock_sm_mhz=1980,
        clock_mem_mhz=3201, processes=[GpuProcess(4242, 79 * GIB), GpuProcess(4343, None)])
    assert report.gpus[1].index == 1 and report.gpus[1].temperature_c == 55
    assert set(report.by_uuid()) == {"GPU-aaaa", "GPU-bbbb"}


def test_report_round_trips_through_json() -> None:
    report = sample(two_gpus(), now=1.0)
    assert msgspec.json.decode(msgspec.json.encode(report), type=GpuReport) == report


@pytest.mark.parametrize(("code", "text"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch."),
])
def test_init_failure_is_unavailable_with_reason(code: int, text: str) -> None:
    source = FakeSource([FakeGpu("GPU-aaaa")], init_error=nvml_error(code))
    report = sample(source, now=7.0)
    assert report == GpuReport(available=False, reason=f"NVML unavailable: {text}",
                               sampled_at=7.0)


def test_init_failure_that_is_not_nvml_is_still_a_report() -> None:
    source = FakeSource([], init_error=OSError("libnvidia-ml.so.1: cannot open"))
    report = sample(source, now=0.0)
    assert not report.available
    assert report.reason == "NVML unavailable: OSError: libnvidia-ml.so.1: cannot open"


def test_not_supported_fields_become_none() -> None:
    ns = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = FakeGpu("GPU-aaaa", memory=nvml_error(ns), power_mw=nvml_error(ns),
                  temperature=nvml_error(pynvml.NVML_ERROR_NO_PERMISSION),
                  processes=nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
                  clock_mem_mhz=pynvml.NVMLLibraryMismatchError("no _v3"))
    report = sample(FakeSource([gpu]), now=0.0)
    assert report.available and report.lost == []
    (g,) = report.gpus
    assert (g.memory_used, g.memory_total, g.memory_reserved) == (None, None, None)
    assert g.power_w is None and g.temperature_c is None and g.processes is None
    assert g.clock_mem_mhz is None
    assert g.power_limit_w == 700.0 and g.utilization_gpu == 87 and g.clock_sm_mhz == 1980


def test_v1_memory_leaves_reserved_none() -> None:
    gpu = FakeGpu("GPU-aaaa", memory=MemoryInfo(used=GIB, total=16 * GIB))
    (g,) = sample(FakeSource([gpu]), now=0.0).gpus
    assert (g.memory_used, g.memory_total, g.memory_reserved) == (GIB, 16 * GIB, None)


def test_gpu_that_disappears_between_samples_is_dropped_and_listed_lost() -> None:
    source = two_gpus()
    first = sample(source, now=1.0)
    source.handle_errors[1] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    second = sample(source, now=2.0, known=first.roster())
    assert [g.uuid for g in second.gpus] == ["GPU-aaaa"]
    assert second.lost == [LostGpu(1, "GPU-bbbb", "GPU is lost")]  # named from `first`
    # once the count drops too, the previous report still names it (by UUID)
    source.gpus.pop()
    third = sample(source, now=3.0, known=first.roster())
    assert [g.uuid for g in third.gpus] == ["GPU-aaaa"]
    assert third.lost == [LostGpu(1, "GPU-bbbb", "no longer present")]


def test_unknown_error_on_handle_and_lost_mid_query_drop_the_gpu() -> None:
    source = FakeSource([FakeGpu("GPU-aaaa", clock_sm_mhz=nvml_error(
        pynvml.NVML_ERROR_GPU_IS_LOST)), FakeGpu("GPU-bbbb"), FakeGpu("GPU-cccc")])
    source.handle_errors[2] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    report = sample(source, now=0.0)
    assert [g.uuid for g in report.gpus] == ["GPU-bbbb"]
    assert report.lost == [LostGpu(0, "GPU-aaaa", "GPU is lost"),
                           LostGpu(2, None, "Unknown Error")]


def test_real_pynvml_on_driverless_machine_is_unavailable() -> None:
    report = detect_gpus()
    if report.available:  # pragma: no cover - only on a host with a driver
        pytest.skip("this host has an NVIDIA driver")
    assert report.reason is not None and report.reason.startswith("NVML unavailable:")
    assert report.gpus == [] and report.sampled_at > 0
    # and again through an explicit source: retried init does not crash either
    again = sample(PynvmlSource())
    assert not again.available and again.reason == report.reason


async def test_monitor_step_keeps_latest_with_injected_clock() -> None:
    ticks = iter([10.0, 11.0])
    monitor = GpuMonitor(two_gpus(), clock=lambda: next(ticks))
    assert monitor.latest() is None
    first = await monitor.step()
    assert monitor.latest() is first and first.sampled_at == 10.0
    monitor.source.handle_errors[0] = nvml_error(  # type: ignore[attr-defined]
        pynvml.NVML_ERROR_GPU_IS_LOST)
    second = await monitor.step()
    assert monitor.latest() is second and second.sampled_at == 11.0
    assert [g.uuid for g in second.gpus] == ["GPU-bbbb"]
    assert second.lost == [LostGpu(0, "GPU-aaaa", "GPU is lost")]
    monitor.source.gpus.pop(0)  # type: ignore[attr-defined]
    monitor.source.handle_errors.clear()  # type: ignore[attr-defined]
    monitor.clock = lambda: 12.0
    third = await monitor.step()  # still listed while gone, though `second` lacked it
    assert [(g.index, g.uuid) for g in third.gpus] == [(0, "GPU-bbbb")]
    assert third.lost == [LostGpu(0, "GPU-aaaa", "no longer present")]


async def test_monitor_task_samples_until_stopped() -> None:
    done = asyncio.Event()
    seen: list[GpuReport] = []

    def on_sample(report: GpuReport) -> None:
        seen.append(report)
        if len(seen) == 3:
            done.set()

    monitor = GpuMonitor(two_gpus(), interval_s=0.0, clock=lambda: 5.0, on_sample=on_sample)
    monitor.start()
    monitor.start()  # idempotent
    await asyncio.wait_for(done.wait(), timeout=5)
    await monitor.stop()
    count = monitor.samples
    assert count >= 3 and monitor.latest() is seen[-1]
    await asyncio.sleep(0)
    assert monitor.samples == count  # stopped means stopped
    await monitor.stop()  # stopping twice is fine


async def test_monitor_survives_a_broken_source() -> None:
    source = two_gpus()
    source.gpus[0].fields["name"] = ZeroDivisionError("bug")  # not an NVML error
    monitor = GpuMonitor(source, clock=lambda: 3.0)
    report = await monitor.step()
    assert not report.available
    assert report.reason == "GPU sampling failed: ZeroDivisionError: bug"


def test_monitor_unavailable_when_init_fails() -> None:
    source = FakeSource([], init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    report = GpuMonitor(source, clock=lambda: 1.0).sample_now()
    assert report.reason == "NVML unavailable: NVML Shared Library Not Found"


def test_device_count_failure_and_missing_driver_version() -> None:
    source = two_gpus()
    source.device_count = lambda: (_ for _ in ()).throw(  # type: ignore[method-assign]
        nvml_error(pynvml.NVML_ERROR_UNINITIALIZED))
    assert sample(source, now=0.0).reason == "NVML unavailable: Uninitialized"
    source = two_gpus()
    source.driver_version = lambda: (_ for _ in ()).throw(  # type: ignore[method-assign]
        nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    report = sample(source, now=0.0)
    assert report.available and report.driver_version is None and len(report.gpus) == 2


class _Struct:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def test_pynvml_source_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real wrappers, with pynvml's functions patched as an older driver answers them."""

    def memory(handle: Any, version: Any = None) -> _Struct:
        if version is not None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return _Struct(used=3, total=10, free=7)

    def temperature_v(handle: Any, sensor: int) -> int:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def procs_v3(handle: Any) -> list[Any]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called")

    calls: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperatureV", temperature_v)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda h, s: 47)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", procs_v3)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2",
                        lambda h: [_Struct(pid=9, usedGpuMemory=None)])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates",
                        lambda h: _Struct(gpu=5, memory=6))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 1500)
    src = PynvmlSource()
    src.init()
    src.init()  # once per instance
    assert calls == ["init"]
    assert src.memory("h") == MemoryInfo(3, 10, None)
    assert src.temperature("h") == 47
    assert src.processes("h") == [GpuProcess(9, None)]
    assert src.utilization("h") == (5, 6)
    assert src.power_mw("h") == 1500
    src.shutdown()
    src.shutdown()
    assert calls == ["init", "shutdown"]
