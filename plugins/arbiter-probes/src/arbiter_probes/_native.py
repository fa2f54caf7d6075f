"""Ask a GPU API's own library what it finds, and print it as one line of JSON.

Run as a script in a child process (``python -I -S _native.py cuda|vulkan|opencl|directml``) so
that a driver which hangs or crashes takes only the child with it.  Standard library only: it is
started without site-packages.  Every report is a JSON object; a query that cannot load its
library says so in ``error`` and exits 0, so only a crash or a hang makes the child fail.

It runs past 400 lines because it runs as one script, started without site-packages: every
API's query has to be in this file.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

_WINDOWS = sys.platform == "win32"
_DARWIN = sys.platform == "darwin"


def _names(linux: Sequence[str], windows: Sequence[str], darwin: Sequence[str]) -> list[str]:
    return list(windows if _WINDOWS else darwin if _DARWIN else linux)


def _load(names: Sequence[str]) -> tuple[Any, str, str]:
    """(library, name, "") for the first of ``names`` that loads, else (None, first name, why)."""
    why = "no such library on this platform"
    for name in names:
        try:
            return ctypes.CDLL(name), name, ""
        except OSError as exc:
            text = str(exc)
            missing = any(m in text for m in ("No such file", "not found", "Could not find", "cannot open"))
            why = f"{name} not found" if missing else f"{name} cannot be loaded: {text}"
    return None, (names[0] if names else "?"), why


def _text(buf: ctypes.Array[ctypes.c_char]) -> str:
    return buf.value.decode("utf-8", "replace").strip()


# --- NVML and the CUDA driver --------------------------------------------------------------------

NVML_NAMES = _names(["libnvidia-ml.so.1"], ["nvml.dll", r"C:\Program Files\NVIDIA Corporation\NVSMI\nvml.dll"], [])
CUDA_NAMES = _names(["libcuda.so.1"], ["nvcuda.dll"], ["libcuda.dylib"])


def _nvml() -> dict[str, Any]:
    lib, name, why = _load(NVML_NAMES)
    out: dict[str, Any] = {"library": name}
    if lib is None:
        out["error"] = why
        return out
    lib.nvmlErrorString.restype = ctypes.c_char_p

    def err(call: str, rc: int) -> str:
        text = lib.nvmlErrorString(rc)
        return f"{call} failed: {text.decode() if text else 'error'} ({rc})"

    init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
    rc = init()
    if rc != 0:
        out["error"] = err("nvmlInit", rc)
        return out
    try:
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlSystemGetDriverVersion(buf, 96) == 0:
            out["driver"] = _text(buf)
        cuda = ctypes.c_int()
        get_cuda = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(
            lib, "nvmlSystemGetCudaDriverVersion", None
        )
        if get_cuda is not None and get_cuda(ctypes.byref(cuda)) == 0:
            out["cuda_version"] = cuda.value
        count = ctypes.c_uint()
        get_count = getattr(lib, "nvmlDeviceGetCount_v2", None) or lib.nvmlDeviceGetCount
        rc = get_count(ctypes.byref(count))
        if rc != 0:
            out["error"] = err("nvmlDeviceGetCount", rc)
            return out
        get_handle = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
        devices = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            name_buf = ctypes.create_string_buffer(96)
            if get_handle(index, ctypes.byref(handle)) == 0 and lib.nvmlDeviceGetName(handle, name_buf, 96) == 0:
                devices.append(_text(name_buf))
            else:
                devices.append(f"device {index}")
        out["devices"] = devices
    finally:
        lib.nvmlShutdown()
    return out


def _cuda_driver() -> dict[str, Any]:
    lib, name, why = _load(CUDA_NAMES)
    out: dict[str, Any] = {"library": name}
    if lib is None:
        out["error"] = why
        return out

    def err(call: str, rc: int) -> str:
        text = ctypes.c_char_p()
        get_name = getattr(lib, "cuGetErrorName", None)
        if get_name is not None and get_name(rc, ctypes.byref(text)) == 0 and text.value:
            return f"{call} failed: {text.value.decode()} ({rc})"
        return f"{call} failed: error {rc}"

    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        out["cuda_version"] = version.value
    rc = lib.cuInit(0)
    if rc != 0:
        out["error"] = err("cuInit", rc)
        return out
    count = ctypes.c_int()
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        out["error"] = err("cuDeviceGetCount", rc)
        return out
    devices = []
    for index in range(count.value):
        device = ctypes.c_int()
        name_buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(device), index) == 0 and lib.cuDeviceGetName(name_buf, 256, device) == 0:
            devices.append(_text(name_buf))
        else:
            devices.append(f"device {index}")
    out["devices"] = devices
    return out


def query_cuda() -> dict[str, Any]:
    """NVML first (names, driver version, no CUDA context); the driver library when NVML finds none."""
    report: dict[str, Any] = {"nvml": _nvml()}
    if not report["nvml"].get("devices"):
        report["cuda"] = _cuda_driver()
    return report


# --- Vulkan --------------------------------------------------------------------------------------

VULKAN_NAMES = _names(["libvulkan.so.1"], ["vulkan-1.dll"], ["libvulkan.1.dylib", "libvulkan.dylib"])
VK_TYPES = [
    "PHYSICAL_DEVICE_TYPE_OTHER",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU",
    "PHYSICAL_DEVICE_TYPE_CPU",
]
VK_ERROR_EXTENSION_NOT_PRESENT = -7
VK_INCOMPLETE = 5


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.c_void_p),
        ("enabledLayerCount", ctypes.c_uint32),
        ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32),
        ("ppEnabledExtensionNames", ctypes.POINTER(ctypes.c_char_p)),
    ]


def query_vulkan() -> dict[str, Any]:
    """Devices as the Vulkan loader enumerates them, in ``vulkaninfo --summary``'s terms."""
    lib, name, why = _load(VULKAN_NAMES)
    out: dict[str, Any] = {"library": name}
    if lib is None:
        out["error"] = why
        return out
    lib.vkCreateInstance.argtypes = [
        ctypes.POINTER(_InstanceCreateInfo),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    lib.vkEnumeratePhysicalDevices.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_void_p),
    ]
    lib.vkGetPhysicalDeviceProperties.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.vkDestroyInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    instance = ctypes.c_void_p()
    portability = (ctypes.c_char_p * 1)(b"VK_KHR_portability_enumeration")
    info = _InstanceCreateInfo(sType=1, flags=1, enabledExtensionCount=1, ppEnabledExtensionNames=portability)
    rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc == VK_ERROR_EXTENSION_NOT_PRESENT:  # an older loader: plain enumeration
        info = _InstanceCreateInfo(sType=1)
        rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        out["error"] = f"vkCreateInstance failed: VkResult {rc}" + (" (no driver)" if rc == -9 else "")
        return out
    try:
        count = ctypes.c_uint32()
        rc = lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        if rc != 0:
            out["error"] = f"vkEnumeratePhysicalDevices failed: VkResult {rc}"
            return out
        handles = (ctypes.c_void_p * max(count.value, 1))()
        rc = lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        if rc not in (0, VK_INCOMPLETE):
            out["error"] = f"vkEnumeratePhysicalDevices failed: VkResult {rc}"
            return out
        devices = []
        for index in range(count.value):
            props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties is under 1 KiB
            lib.vkGetPhysicalDeviceProperties(handles[index], props)
            api, _driver, vendor, _device, kind, raw_name = struct.unpack_from("=IIIIi256s", props.raw, 0)
            devices.append(
                {
                    "deviceName": raw_name.split(b"\0", 1)[0].decode("utf-8", "replace"),
                    "deviceType": VK_TYPES[kind] if 0 <= kind < len(VK_TYPES) else f"type {kind}",
                    "vendorID": f"0x{vendor:x}",
                    "apiVersion": f"{(api >> 22) & 0x7F}.{(api >> 12) & 0x3FF}.{api & 0xFFF}",
                }
            )
        out["devices"] = devices
    finally:
        lib.vkDestroyInstance(instance, None)
    return out


# --- OpenCL --------------------------------------------------------------------------------------

OPENCL_NAMES = _names(["libOpenCL.so.1"], ["OpenCL.dll"], ["/System/Library/Frameworks/OpenCL.framework/OpenCL"])
CL_PLATFORM_NAME = 0x0902
CL_DEVICE_TYPE = 0x1000
CL_DEVICE_NAME = 0x102B
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_DEVICE_NOT_FOUND = -1
CL_PLATFORM_NOT_FOUND_KHR = -1001
CL_TYPES = [(1 << 1, "CPU"), (1 << 2, "GPU"), (1 << 3, "Accelerator"), (1 << 4, "Custom")]


def query_opencl() -> dict[str, Any]:
    """Platforms and their devices, with clinfo's names for the device types."""
    lib, name, why = _load(OPENCL_NAMES)
    out: dict[str, Any] = {"library": name}
    if lib is None:
        out["error"] = why
        return out
    size_p = ctypes.POINTER(ctypes.c_size_t)
    lib.clGetPlatformIDs.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.clGetPlatformInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, size_p]
    lib.clGetDeviceIDs.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint32),
    ]
    lib.clGetDeviceInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, size_p]

    def info_text(getter: Callable[..., int], handle: Any, param: int) -> str:
        buf = ctypes.create_string_buffer(1024)
        return _text(buf) if getter(handle, param, 1024, buf, None) == 0 else "?"

    count = ctypes.c_uint32()
    rc = lib.clGetPlatformIDs(0, None, ctypes.byref(count))
    if rc == CL_PLATFORM_NOT_FOUND_KHR:
        out["platforms"] = []
        return out
    if rc != 0:
        out["error"] = f"clGetPlatformIDs failed: error {rc}"
        return out
    platforms = (ctypes.c_void_p * max(count.value, 1))()
    lib.clGetPlatformIDs(count.value, platforms, None)
    listed = []
    for p_index in range(count.value):
        platform = platforms[p_index]
        entry: dict[str, Any] = {"name": info_text(lib.clGetPlatformInfo, platform, CL_PLATFORM_NAME), "devices": []}
        n_devices = ctypes.c_uint32()
        rc = lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n_devices))
        if rc == 0 and n_devices.value:
            devices = (ctypes.c_void_p * n_devices.value)()
            lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n_devices.value, devices, None)
            for device in devices:
                bits = ctypes.c_uint64()
                lib.clGetDeviceInfo(device, CL_DEVICE_TYPE, 8, ctypes.byref(bits), None)
                kinds = [label for bit, label in CL_TYPES if bits.value & bit] or [f"type 0x{bits.value:x}"]
                entry["devices"].append(
                    {"name": info_text(lib.clGetDeviceInfo, device, CL_DEVICE_NAME), "type": ", ".join(kinds)}
                )
        elif rc not in (0, CL_DEVICE_NOT_FOUND):
            entry["error"] = f"clGetDeviceIDs failed: error {rc}"
        listed.append(entry)
    out["platforms"] = listed
    return out


# --- Direct3D 12 adapters, for DirectML ----------------------------------------------------------

DXGI_ERROR_NOT_FOUND = 0x887A0002
DXGI_ADAPTER_FLAG_SOFTWARE = 2
D3D_FEATURE_LEVEL_11_0 = 0xB000


class _Guid(ctypes.Structure):
    _fields_ = [("d1", ctypes.c_uint32), ("d2", ctypes.c_uint16), ("d3", ctypes.c_uint16), ("d4", ctypes.c_ubyte * 8)]


def _guid(text: str) -> _Guid:
    return _Guid.from_buffer_copy(uuid.UUID(text).bytes_le)


class _AdapterDesc1(ctypes.Structure):
    _fields_ = [
        ("Description", ctypes.c_wchar * 128),
        ("VendorId", ctypes.c_uint),
        ("DeviceId", ctypes.c_uint),
        ("SubSysId", ctypes.c_uint),
        ("Revision", ctypes.c_uint),
        ("DedicatedVideoMemory", ctypes.c_size_t),
        ("DedicatedSystemMemory", ctypes.c_size_t),
        ("SharedSystemMemory", ctypes.c_size_t),
        ("LuidLow", ctypes.c_uint32),
        ("LuidHigh", ctypes.c_int32),
        ("Flags", ctypes.c_uint),
    ]


def _com_call(obj: ctypes.c_void_p, index: int, *args: Any, argtypes: Sequence[Any] = ()) -> int:
    """Call method ``index`` of COM object ``obj``'s vtable; returns its HRESULT as unsigned."""
    vtable = ctypes.cast(obj, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)))[0]
    prototype = ctypes.WINFUNCTYPE(ctypes.c_long, ctypes.c_void_p, *argtypes)  # type: ignore[attr-defined]
    return int(prototype(vtable[index])(obj, *args)) & 0xFFFFFFFF


def query_directml() -> dict[str, Any]:
    """Hardware adapters that can make a Direct3D 12 device (what DirectML runs on)."""
    if not _WINDOWS:
        return {"error": "not Windows"}
    out: dict[str, Any] = {}
    system_dll = os.path.join(os.environ.get("SYSTEMROOT", r"C:\Windows"), "System32", "DirectML.dll")
    out["directml_dll"] = system_dll if os.path.exists(system_dll) else None
    try:
        dxgi = ctypes.WinDLL("dxgi.dll")  # type: ignore[attr-defined]
        d3d12 = ctypes.WinDLL("d3d12.dll")  # type: ignore[attr-defined]
    except OSError as exc:
        out["error"] = f"Direct3D 12 is not available: {exc}"
        return out
    factory = ctypes.c_void_p()
    hr = dxgi.CreateDXGIFactory1(ctypes.byref(_guid("770aae78-f26f-4dba-a829-253c83d1b387")), ctypes.byref(factory))
    if hr != 0:
        out["error"] = f"CreateDXGIFactory1 failed: HRESULT 0x{hr & 0xFFFFFFFF:08x}"
        return out
    d3d12.D3D12CreateDevice.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    device_iid = _guid("189819f1-1db6-4b57-be54-1821339b85f7")
    adapters = []
    try:
        for index in range(64):
            adapter = ctypes.c_void_p()
            hr = _com_call(factory, 12, index, ctypes.byref(adapter), argtypes=[ctypes.c_uint, ctypes.c_void_p])
            if hr != 0:
                break  # EnumAdapters1: DXGI_ERROR_NOT_FOUND after the last adapter
            try:
                desc = _AdapterDesc1()
                _com_call(adapter, 10, ctypes.byref(desc), argtypes=[ctypes.c_void_p])  # GetDesc1
                hr = d3d12.D3D12CreateDevice(adapter, D3D_FEATURE_LEVEL_11_0, ctypes.byref(device_iid), None)
                adapters.append(
                    {
                        "name": desc.Description,
                        "vendor_id": f"0x{desc.VendorId:04x}",
                        "software": bool(desc.Flags & DXGI_ADAPTER_FLAG_SOFTWARE),
                        "d3d12": (hr & 0xFFFFFFFF) in (0, 1),  # S_OK, or S_FALSE: it could make one
                        "dedicated_mib": desc.DedicatedVideoMemory // (1 << 20),
                    }
                )
            finally:
                _com_call(adapter, 2)  # Release
    finally:
        _com_call(factory, 2)
    out["adapters"] = adapters
    return out


QUERIES: dict[str, Callable[[], dict[str, Any]]] = {
    "cuda": query_cuda,
    "vulkan": query_vulkan,
    "opencl": query_opencl,
    "directml": query_directml,
}


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or argv[0] not in QUERIES:
        print(json.dumps({"error": f"usage: _native.py {'|'.join(QUERIES)}"}))
        return 2
    try:
        report = QUERIES[argv[0]]()
    except Exception as exc:  # a library that misbehaves without crashing: say what it did
        report = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
