"""Launch prebuilt cubins through the CUDA driver API: no Triton compiler, LLVM, ptxas or C compiler.

A cubin built by compiler_core.build is loaded (per device, on first use) with
`cuModuleLoadData` (cuda.bindings) and launched with `cuLaunchKernel` (libcuda through ctypes) on
torch's current stream. Triton kernels
take their non-constexpr arguments, then hidden trailing pointers (global and profile scratch).

Note: per-launch host work is kept to reading the tensors' data pointers, one alignment check
(the build assumed 16-byte aligned pointers), one `struct.pack_into` into a parameter buffer
packed at load time, and the driver call. A launch whose pointers are not aligned returns
False; the caller then runs the kernel from source (never the binary on a broken assumption).
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxcc.compiler_core.errors import ArtifactError

log = logging.getLogger("fxcc.cuda_loader")

_INT_FORMATS = {"i32": "i", "i64": "q", "u64": "Q"}
_MAX_STATIC_SMEM = 48 * 1024


@dataclass
class LoaderStats:
    """What this process's loader has done (read by benchmarks and tests, never by timing code)."""

    modules_loaded: int = 0
    preloaded: int = 0  # of modules_loaded, by `preload` (before their first launch)
    launchers: int = 0
    jit_fallbacks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


stats = LoaderStats()


_cuda_driver: list[Any] = []


def _driver() -> Any:
    """cuda.bindings.driver, imported on first use (it ships with torch's CUDA builds)."""
    if not _cuda_driver:
        from cuda.bindings import driver

        _cuda_driver.append(driver)
    return _cuda_driver[0]


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings result tuple; raise ArtifactError on a driver error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise ArtifactError(f"{what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


@dataclass(frozen=True)
class LaunchMeta:
    """A cubin's launch metadata, as compiler_core.build recorded it under `<arch>.*`."""

    name: str
    num_warps: int
    shared: int
    signature: tuple[str, ...]
    scratch_params: int
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    align16: tuple[int, ...]  # pointer argument positions assumed 16-byte aligned
    div16: tuple[int, ...]  # int argument positions assumed divisible by 16

    @classmethod
    def from_metadata(cls, metadata: dict[str, int | str], arch: str) -> LaunchMeta:
        def get(k: str) -> Any:
            try:
                return metadata[f"{arch}.{k}"]
            except KeyError:
                raise ArtifactError(f"kernel metadata lacks {arch}.{k}") from None

        def positions(k: str) -> tuple[int, ...]:
            text = str(get(k))
            return tuple(int(x) for x in text.split(",")) if text else ()

        return cls(
            name=str(get("name")), num_warps=int(get("num_warps")), shared=int(get("shared")),
            signature=tuple(str(get("signature")).split(",")),
            scratch_params=int(get("scratch_params")),
            global_scratch_size=int(get("global_scratch_size")),
            global_scratch_align=int(get("global_scratch_align")),
            profile_scratch_size=int(get("profile_scratch_size")),
            align16=positions("guard_align16"), div16=positions("guard_div16"),
        )


class CubinKernel:
    """One cubin, loaded into each device's primary context the first time it runs there."""

    def __init__(self, cubin: bytes, meta: LaunchMeta) -> None:
        self.cubin = cubin
        self.meta = meta
        self._functions: dict[int, Any] = {}
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()

    def function(self, device: int) -> Any:
        fn = self._functions.get(device)
        if fn is None:
            with self._lock:
                fn = self._functions.get(device)
                if fn is None:
                    fn = self._functions[device] = self._load(device)
        return fn

    def handle(self, device: int) -> int:
        """The loaded function's CUfunction handle on `device`, as the driver API takes it."""
        h = self._handles.get(device)
        if h is None:
            h = self._handles[device] = int(self.function(device))
        return h

    def _load(self, device: int) -> Any:
        cu = _driver()
        with torch.cuda.device(device):
            _ensure_context(cu, device)
            module = _check(cu.cuModuleLoadData(self.cubin), f"cuModuleLoadData({self.meta.name})")
            fn = _check(cu.cuModuleGetFunction(module, self.meta.name.encode()),
                        f"cuModuleGetFunction({self.meta.name})")
            if self.meta.shared > _MAX_STATIC_SMEM:
                _allow_dynamic_smem(cu, fn, device, self.meta)
        with stats.lock:
            stats.modules_loaded += 1
        return fn


_kernels: dict[tuple[str, LaunchMeta], CubinKernel] = {}
_kernels_lock = threading.Lock()


def cubin_kernel(digest: str, cubin: bytes, meta: LaunchMeta) -> CubinKernel:
    """The process-wide CubinKernel for a (verified) cubin: each module is loaded once per device,
    however many plans launch it."""
    with _kernels_lock:
        kernel = _kernels.get((digest, meta))
        if kernel is None:
            kernel = _kernels[(digest, meta)] = CubinKernel(cubin, meta)
        return kernel


def preload(kernels: Iterable[CubinKernel], device: int) -> int:
    """Load each kernel's module into `device`'s primary context now, not at its first launch; how
    many this call loaded (a module already loaded there is not loaded again). Raises ArtifactError
    when the driver refuses one.

    Note: cuModuleLoadData of a cubin costs the driver tens of microseconds to milliseconds, and a
    plan loaded from a Dynamo package pays it for each of its kernels (ResNet-50: 68) inside its first
    call; a package's side thread (client/dynamo_cache.py) preloads them while torch builds guards."""
    loaded = 0
    for kernel in kernels:
        if device in kernel._functions:
            continue
        kernel.handle(device)
        loaded += 1
    with stats.lock:
        stats.preloaded += loaded
    return loaded


def is_loaded(digest: str, device: int) -> bool:
    """Whether a cubin with this digest has been loaded (and so launched) on `device`."""
    with _kernels_lock:
        return any(d == digest and device in k._functions for (d, _), k in _kernels.items())


def _ensure_context(cu: Any, device: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    ctx = _check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        dev = _check(cu.cuDeviceGet(device), "cuDeviceGet")
        _check(cu.cuCtxSetCurrent(_check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
               "cuCtxSetCurrent")


def _allow_dynamic_smem(cu: Any, fn: Any, device: int, meta: LaunchMeta) -> None:
    """Opt in to more than 48 KB of dynamic shared memory (as Triton's own launcher does)."""
    dev = _check(cu.cuDeviceGet(device), "cuDeviceGet")
    optin = _check(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "cuDeviceGetAttribute")
    static = _check(cu.cuFuncGetAttribute(
        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn), "cuFuncGetAttribute")
    if meta.shared > optin - static:
        raise ArtifactError(f"{meta.name} needs {meta.shared} B of shared memory; "
                            f"device {device} allows {optin - static}")
    _check(cu.cuFuncSetAttribute(
        fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - static),
        "cuFuncSetAttribute")


_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(device: int) -> int:
    if _current_raw_stream is not None:
        return int(_current_raw_stream(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


class StepLauncher:
    """One plan step's launch of a CubinKernel, with its parameter buffer packed once.

    Parameter slots are 8 bytes each: buffer pointers first (rewritten each launch), then the
    scratch pointers, then the plan's int arguments (constants, packed here).
    """

    def __init__(self, kernel: CubinKernel, grid: Sequence[int],
                 args: Sequence[str | int]) -> None:
        meta = kernel.meta
        if len(args) != len(meta.signature):
            raise ArtifactError(f"{meta.name} takes {len(meta.signature)} arguments, step passes "
                                f"{len(args)}")
        self.kernel = kernel
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.block = 32 * meta.num_warps
        self.shared = meta.shared
        self.buffers = [a for a in args if isinstance(a, str)]
        n_ptr, n_scratch = len(self.buffers), meta.scratch_params
        n_slots = n_ptr + n_scratch + (len(args) - n_ptr)
        self._buf = ctypes.create_string_buffer(8 * max(1, n_slots))
        base = ctypes.addressof(self._buf)
        slot_of: list[int] = []
        self._int_slots: list[tuple[int, str]] = []  # (slot, struct format) of each int argument
        ptr_i, int_i = 0, n_ptr + n_scratch
        for a, ty in zip(args, meta.signature):
            if isinstance(a, str):
                if not ty.startswith("*"):
                    raise ArtifactError(f"{meta.name}: buffer passed where {ty} is expected")
                slot_of.append(ptr_i)
                ptr_i += 1
            else:
                fmt = _INT_FORMATS.get(ty)
                if fmt is None:
                    raise ArtifactError(f"{meta.name}: int passed where {ty} is expected")
                struct.pack_into(f"<{fmt}", self._buf, 8 * int_i, a)
                self._int_slots.append((int_i, fmt))
                slot_of.append(int_i)
                int_i += 1
        slot_of += list(range(n_ptr, n_ptr + n_scratch))
        self._params = (ctypes.c_void_p * max(1, len(slot_of)))(*(base + 8 * s for s in slot_of))
        self.params_addr = ctypes.addressof(self._params)
        self._ptr_fmt = f"<{n_ptr}Q"
        self._scratch = meta.global_scratch_size > 0 or meta.profile_scratch_size > 0
        self._lock = threading.Lock()
        with stats.lock:
            stats.launchers += 1

    def static_guards_hold(self, args: Sequence[str | int]) -> bool:
        """The build's facts about this step's int arguments (they are constants of the plan)."""
        return all(isinstance(args[i], int) and args[i] % 16 == 0 for i in self.kernel.meta.div16)

    def __call__(self, tensors: Sequence[torch.Tensor], device: int,
                 ints: Sequence[int] | None = None, grid: Sequence[int] | None = None) -> bool:
        """Launch on `device`'s current stream; False (nothing launched) if a guard fails.

        `ints` and `grid` replace the step's int arguments and grid for this launch (a plan
        with symbolic sizes evaluates them per call); the build's div-16 facts are checked on
        them like every other guard.
        """
        ptrs = [t.data_ptr() for t in tensors]
        bits = 0
        for p in ptrs:
            bits |= p
        if bits & 15:
            return False
        if ints is not None and any(ints[i - len(ptrs)] % 16 for i in self._div16_ints(len(ptrs))):
            return False
        launch_grid = self.grid if grid is None else (tuple(grid) + (1, 1))[:3]
        if 0 in launch_grid:
            return True
        fn = self.kernel.handle(device)
        stream = _raw_stream(device)
        with self._lock:  # the parameter buffer is shared by every call of this step
            struct.pack_into(self._ptr_fmt, self._buf, 0, *ptrs)
            if ints is not None:
                for (slot, fmt), v in zip(self._int_slots, ints):
                    struct.pack_into(f"<{fmt}", self._buf, 8 * slot, v)
            if self._scratch:
                keep = self._pack_scratch(len(ptrs), device, launch_grid)  # noqa: F841 - alive until launched
            gx, gy, gz = launch_grid
            _launch(fn, gx, gy, gz, self.block, self.shared, stream, self.params_addr, device)
        return True

    def _div16_ints(self, n_ptr: int) -> list[int]:
        """Argument positions of int arguments the build declared divisible by 16."""
        return [i for i in self.kernel.meta.div16 if i >= n_ptr]

    def _pack_scratch(self, first_slot: int, device: int, grid: tuple[int, ...]) -> list[torch.Tensor]:
        """Allocate the kernel's per-program scratch (Triton's launcher does this per launch)."""
        meta = self.kernel.meta
        programs = grid[0] * grid[1] * grid[2]
        keep: list[torch.Tensor] = []
        for i, size in enumerate((meta.global_scratch_size, meta.profile_scratch_size)):
            if i >= meta.scratch_params:
                break
            ptr = 0
            if size > 0:
                t = torch.empty(size * programs + 256, dtype=torch.uint8, device=device)
                keep.append(t)
                ptr = (t.data_ptr() + 255) // 256 * 256  # align ≥ Triton's scratch alignment
            struct.pack_into("<Q", self._buf, 8 * (first_slot + i), ptr)
        return keep


_CUDA_ERROR_INVALID_CONTEXT = 201
_c_launch: list[Any] = []


def _cu_launch_kernel() -> Any:
    """libcuda's cuLaunchKernel through ctypes, its argument types declared once.

    Note: cuda.bindings converts each argument to its own wrapper types on every call (about
    4.3 µs per launch on the H200's host); a ctypes call with declared argtypes passes the same
    integers straight through. Module loading keeps using cuda.bindings (once per kernel).
    """
    if not _c_launch:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
        u = ctypes.c_uint
        fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _c_launch.append(fn)
    return _c_launch[0]


def _launch(fn: int, gx: int, gy: int, gz: int, block: int, shared: int, stream: int,
            params: int, device: int) -> None:
    """cuLaunchKernel of the function handle `fn` on `stream` with packed parameters `params`."""
    launch = _c_launch[0] if _c_launch else _cu_launch_kernel()
    err = launch(fn, gx, gy, gz, block, 1, 1, shared, stream, params, None)
    if err:
        if err == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never touched the device
            _ensure_context(_driver(), device)
            err = launch(fn, gx, gy, gz, block, 1, 1, shared, stream, params, None)
        if err:
            raise ArtifactError(f"cuLaunchKernel failed: CUresult {err}")


def record_fallback() -> None:
    with stats.lock:
        stats.jit_fallbacks += 1
