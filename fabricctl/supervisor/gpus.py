"""GPU telemetry through NVML (`pynvml`, package nvidia-ml-py), keyed by GPU UUID.

Contract:
- `sample(source, now=..., known=None) -> GpuReport` never raises for NVML reasons.
  An init failure (no library, driver not loaded, no permission) or a failing device
  count gives `available=False` and `reason="NVML unavailable: <NVML's own text>"`.
- Per field, any NVML error (NotSupported, NoPermission, FunctionNotFound, ...) becomes
  `None`; units are normalised: bytes, %, degrees C, watts (NVML gives mW), MHz.
- A GPU whose handle or UUID query fails, or that answers `GpuIsLost` to any query, is left
  out of `gpus` and listed in `lost`; so is every UUID of `known` (UUID -> index of the GPUs
  seen before) that is absent now. `known` also names a GPU whose own UUID query failed.
  `GpuMonitor` accumulates `known`, so a lost GPU stays listed until it answers again.
- Every NVML call goes through the `NvmlSource` protocol, whose methods raise
  `pynvml.NVMLError` subclasses like pynvml does; `PynvmlSource` is the real one
  (init once per instance, memory v2 -> v1, temperature V -> legacy, processes v3 -> v2
  fallbacks), tests pass a fake.
- `GpuMonitor` samples every `interval_s` (1 s) in a worker thread (`asyncio.to_thread`)
  from an asyncio task and keeps the latest report; `detect_gpus()` is a one-shot sample.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import msgspec
import pynvml

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors an NVML query may raise; NVMLLibraryMismatchError is not an NVMLError subclass.
FIELD_ERRORS: tuple[type[Exception], ...] = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)


class GpuProcess(msgspec.Struct, frozen=True):
    """One compute process on a GPU; `used_memory` is None under MIG/WDDM. PIDs are host PIDs."""

    pid: int
    used_memory: int | None


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU at one instant; every field NVML could not answer is None."""

    uuid: str
    index: int
    name: str | None = None
    utilization_gpu: int | None = None  # % of time a kernel ran, last sample period
    utilization_mem: int | None = None  # % memory-bandwidth busy, NOT VRAM used
    memory_used: int | None = None  # bytes, like these two
    memory_total: int | None = None
    memory_reserved: int | None = None  # None from the v1 memory call
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    processes: list[GpuProcess] | None = None


class LostGpu(msgspec.Struct, frozen=True):
    """A GPU left out of a sample because it vanished or stopped answering; why, in words."""

    index: int | None
    uuid: str | None
    reason: str


class GpuReport(msgspec.Struct, frozen=True, kw_only=True):
    """Every GPU on the host at one instant, or why NVML could not be read (`available=False`)."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    gpus: list[GpuSample] = msgspec.field(default_factory=list)
    lost: list[LostGpu] = msgspec.field(default_factory=list)
    sampled_at: float = 0.0

    def by_uuid(self) -> dict[str, GpuSample]:
        """The GPUs keyed by UUID."""
        return {g.uuid: g for g in self.gpus}

    def roster(self) -> dict[str, int]:
        """UUID -> index of the GPUs sampled, the `known` argument of the next `sample`."""
        return {g.uuid: g.index for g in self.gpus}


class MemoryInfo(msgspec.Struct, frozen=True):
    """Used/total/reserved bytes of one GPU (reserved is None from the v1 call)."""

    used: int
    total: int
    reserved: int | None = None


class NvmlSource(Protocol):
    """The NVML calls `sample` needs, so tests can substitute a fake; methods raise NVMLError."""

    def init(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def uuid(self, handle: Any) -> str: ...
    def name(self, handle: Any) -> str: ...
    def utilization(self, handle: Any) -> tuple[int, int]: ...
    def memory(self, handle: Any) -> MemoryInfo: ...
    def temperature(self, handle: Any) -> int: ...
    def power_mw(self, handle: Any) -> int: ...
    def power_limit_mw(self, handle: Any) -> int: ...
    def clock_sm_mhz(self, handle: Any) -> int: ...
    def clock_mem_mhz(self, handle: Any) -> int: ...
    def processes(self, handle: Any) -> list[GpuProcess]: ...


class PynvmlSource:
    """The real `NvmlSource`: thin wrappers over pynvml with version fallbacks."""

    def __init__(self) -> None:
        self._initialized = False

    def init(self) -> None:
        if self._initialized:
            return
        pynvml.nvmlInit()
        self._initialized = True
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            with contextlib.suppress(*FIELD_ERRORS):
                pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        return str(pynvml.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def handle(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def uuid(self, handle: Any) -> str:
        return str(pynvml.nvmlDeviceGetUUID(handle))

    def name(self, handle: Any) -> str:
        return str(pynvml.nvmlDeviceGetName(handle))

    def utilization(self, handle: Any) -> tuple[int, int]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return int(rates.gpu), int(rates.memory)

    def memory(self, handle: Any) -> MemoryInfo:
        try:
            m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return MemoryInfo(int(m.used), int(m.total), int(m.reserved))
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError:  # old driver: no _v2 symbol or version mismatch
            m = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return MemoryInfo(int(m.used), int(m.total), None)

    def temperature(self, handle: Any) -> int:
        sensor = pynvml.NVML_TEMPERATURE_GPU
        try:
            return int(pynvml.nvmlDeviceGetTemperatureV(handle, sensor))
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError:  # older driver without nvmlDeviceGetTemperatureV
            return int(pynvml.nvmlDeviceGetTemperature(handle, sensor))

    def power_mw(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    def power_limit_mw(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))

    def clock_sm_mhz(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))

    def clock_mem_mhz(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))

    def processes(self, handle: Any) -> list[GpuProcess]:
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLLibraryMismatchError:  # driver lacks _v3
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        return [GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in procs]


def _error_text(exc: BaseException) -> str:
    """NVML's own text for NVML errors; the type name too for anything else."""
    if isinstance(exc, pynvml.NVMLError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _GpuLost(Exception):
    """Raised inside `_sample_one` when a query says the GPU is gone."""


def _field(query: Callable[[], T]) -> T | None:
    """One NVML query: its value, None on an NVML error, `_GpuLost` on GpuIsLost."""
    try:
        return query()
    except pynvml.NVMLError_GpuIsLost as exc:
        raise _GpuLost(_error_text(exc)) from exc
    except FIELD_ERRORS:
        return None


def _sample_one(source: NvmlSource, index: int, uuid: str, handle: Any) -> GpuSample:
    util = _field(lambda: source.utilization(handle))
    mem = _field(lambda: source.memory(handle))
    power = _field(lambda: source.power_mw(handle))
    limit = _field(lambda: source.power_limit_mw(handle))
    return GpuSample(
        uuid=uuid,
        index=index,
        name=_field(lambda: source.name(handle)),
        utilization_gpu=None if util is None else util[0],
        utilization_mem=None if util is None else util[1],
        memory_used=None if mem is None else mem.used,
        memory_total=None if mem is None else mem.total,
        memory_reserved=None if mem is None else mem.reserved,
        temperature_c=_field(lambda: source.temperature(handle)),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        clock_sm_mhz=_field(lambda: source.clock_sm_mhz(handle)),
        clock_mem_mhz=_field(lambda: source.clock_mem_mhz(handle)),
        processes=_field(lambda: source.processes(handle)),
    )


def sample(source: NvmlSource, now: float | None = None,
           known: Mapping[str, int] | None = None) -> GpuReport:
    """One pass over every GPU; blocking (call it off the event loop). Never raises for NVML."""
    at = time.time() if now is None else now
    try:
        source.init()
        count = source.device_count()
    except Exception as exc:  # any init failure is "unavailable", never a crash
        return GpuReport(available=False, reason=f"NVML unavailable: {_error_text(exc)}",
                         sampled_at=at)
    try:
        driver: str | None = source.driver_version()
    except FIELD_ERRORS:
        driver = None
    gpus: list[GpuSample] = []
    lost: list[LostGpu] = []
    known = known or {}
    by_index = {i: u for u, i in known.items()}
    for index in range(count):
        uuid: str | None = by_index.get(index)  # names a GPU whose handle fails
        try:
            handle = source.handle(index)
            uuid = source.uuid(handle)
            gpus.append(_sample_one(source, index, uuid, handle))
        except _GpuLost as exc:
            lost.append(LostGpu(index, uuid, str(exc)))
        except FIELD_ERRORS as exc:  # no handle or no UUID: cannot key it, so it is lost
            lost.append(LostGpu(index, uuid, _error_text(exc)))
    seen = {g.uuid for g in gpus} | {lg.uuid for lg in lost}
    lost.extend(LostGpu(i, u, "no longer present") for u, i in known.items() if u not in seen)
    return GpuReport(available=True, driver_version=driver, gpus=gpus, lost=lost, sampled_at=at)


def detect_gpus(source: NvmlSource | None = None) -> GpuReport:
    """One-shot sample, used by `fabricctl up` (sim vs vllm) and `fabricctl doctor`."""
    return sample(source if source is not None else PynvmlSource())


class GpuMonitor:
    """Keeps the latest `GpuReport`, sampled every `interval_s` off the event loop."""

    def __init__(self, source: NvmlSource | None = None, *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time,
                 on_sample: Callable[[GpuReport], None] | None = None) -> None:
        self.source: NvmlSource = source if source is not None else PynvmlSource()
        self.interval_s = interval_s
        self.clock = clock
        self.on_sample = on_sample
        self.samples = 0
        self._latest: GpuReport | None = None
        self._known: dict[str, int] = {}  # UUID -> index of every GPU seen so far
        self._task: asyncio.Task[None] | None = None

    def latest(self) -> GpuReport | None:
        """The most recent report; None before the first sample completes."""
        return self._latest

    def _take(self) -> GpuReport:
        """The blocking part: one `sample`, with any unexpected error turned into a report."""
        now = self.clock()
        try:
            return sample(self.source, now=now, known=dict(self._known))
        except Exception as exc:  # a bug in a source must not kill the monitor
            log.exception("GPU sampling failed")
            reason = f"GPU sampling failed: {_error_text(exc)}"
            return GpuReport(available=False, reason=reason, sampled_at=now)

    def _record(self, report: GpuReport) -> GpuReport:
        self._latest = report
        self._known.update((g.uuid, g.index) for g in report.gpus)
        self.samples += 1
        if self.on_sample is not None:
            self.on_sample(report)
        return report

    def sample_now(self) -> GpuReport:
        """One blocking sampling step, recorded as the latest (for sync callers and tests)."""
        return self._record(self._take())

    async def step(self) -> GpuReport:
        """One sampling step: NVML in a worker thread, recording and `on_sample` on the loop."""
        return self._record(await asyncio.to_thread(self._take))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.step()
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    def start(self) -> None:
        """Start sampling in the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gpu-monitor")

    async def stop(self) -> None:
        """Stop sampling; the latest report stays readable."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
