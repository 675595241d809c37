/* fake_ze: a test double for the Level Zero loader (libze_loader.so.1) with
 * one or more GPU drivers behind it, as far as pinshim and the test programs
 * use them. Never shipped. Built against Level Zero's own headers
 * (level_zero/ze_api.h and loader/ze_loader.h of Debian's libze-dev 1.8,
 * fetched by the tests); the zex prototypes are in no package, so they are
 * declared here as intel/compute-runtime's driver_experimental/zex_driver.h
 * has them. The registration table, invariant checks, failures, latency, log
 * and query API are tests/fake_gpu/fake_pins.h's (FAKE_GPU_*, fake_gpu_*).
 *
 * What is modelled, and where from:
 *  - The loader (oneapi-src/level-zero source/lib/ze_libapi.cpp,
 *    source/loader/ze_ldrddi.cpp, ze_loader_api.cpp): before zeInit,
 *    zeDriverGet answers ZE_RESULT_ERROR_UNINITIALIZED; so does every other
 *    entry point in the 1.8 loader, while loaders from 1.15.7 dereference a
 *    NULL table there (a crash): the double answers UNINITIALIZED and records
 *    "too_early". zeInit(flags) starts the drivers (no driver:
 *    FAKE_ZE_DRIVERS=0, UNINITIALIZED) once: every later zeInit, whatever
 *    its flags, gets the first one's answer (ze_libapi.cpp: call_once and a
 *    static result). FAKE_ZE_START=fail: the drivers are there and find no
 *    device, so zeInit answers UNINITIALIZED (Debian 12's loader 1.8.12 over
 *    Intel's driver 22.43 on a machine without its GPU); the loader, up to
 *    1.17.28, has then unloaded the driver and kept its functions in the
 *    table (ze_loader.cpp check_drivers; ze_lib.cpp fills the table before
 *    the drivers start), so zeDriverGet and every entry point past zeInit
 *    raise SIGSEGV, as the jump into unmapped code does. With
 *    FAKE_ZE_LOADER_KEEPS_DRIVERS=1 the loader is one from 1.17.39 over an
 *    Intel driver before 23.48 (driver.cpp's driverCount = 1 until
 *    78b01e25d3): zeDriverGet answers one driver with a NULL handle, and
 *    zeDriverGetExtensionFunctionAddress on it raises SIGSEGV (a virtual
 *    call on NULL). zelLoaderGetVersions counts no component until a zeInit
 *    has loaded a driver (none with FAKE_ZE_DRIVERS=0), then one, and asks
 *    no driver. Driver handles the loader gives are
 *    its own objects wrapping the driver's (intercept enabled);
 *    zelLoaderTranslateHandle(ZEL_HANDLE_DRIVER, ...) gives the driver's
 *    (NULL in or out: ZE_RESULT_ERROR_INVALID_NULL_POINTER; a handle that is
 *    not the loader's comes back unchanged). zeDriverGetExtensionFunctionAddress
 *    takes the loader's handle, unwraps it and asks the driver: unknown
 *    names are ZE_RESULT_ERROR_INVALID_ARGUMENT (compute-runtime
 *    DriverHandle::getExtensionFunctionAddress). The loader exports no zex
 *    function.
 *  - The driver's host-pointer import (intel/compute-runtime
 *    level_zero/core/source/driver/host_pointer_manager.cpp,
 *    createHostPointerMultiAllocation; driver_handle.cpp):
 *    zexDriverImportExternalPointer(driver, ptr, size): NULL or size 0:
 *    INVALID_ARGUMENT (0x78000004); start and end inside the same import:
 *    SUCCESS, no change, no reference count; start and end in two imports:
 *    OVERLAPPING_REGIONS (0x7800001a); start inside only: HANDLE_OBJECT_IN_USE
 *    (0x78000006); end inside only: INVALID_SIZE (0x78000008); a range that
 *    covers an import strictly is imported again, overlapping (recorded as
 *    "register_overlap"); an unpinnable range (a hole, PROT_NONE, or
 *    read-only memory: DrmMemoryManager::allocUserptr asks for no read-only
 *    userptr): OUT_OF_HOST_MEMORY (0x70000002). Lookups take the import with the greatest base at
 * or below the address and check only that one. No alignment is needed.
 *    zexDriverReleaseImportedPointer(driver, ptr): any address inside an
 *    import drops the whole import (SUCCESS); none: INVALID_ARGUMENT.
 *    zexDriverGetHostPointerBaseAddress(driver, ptr, &base): inside an
 *    import, SUCCESS and its base; else INVALID_ARGUMENT, base untouched.
 *    With FAKE_ZE_IMPORT=0 (the driver's EnableHostPointerImport=0) every
 *    import call is ZE_RESULT_ERROR_UNSUPPORTED_FEATURE. They take the
 *    driver's own handle: the loader's instead is recorded ("loader_handle")
 *    and refused with ZE_RESULT_ERROR_INVALID_NULL_HANDLE (the real driver
 *    would read the loader's object as its own).
 *  - Imported memory is not in the driver's USM registry:
 *    zeMemGetAllocProperties says ZE_MEMORY_TYPE_UNKNOWN (context.cpp);
 *    zeMemAllocDevice's blocks are ZE_MEMORY_TYPE_DEVICE.
 *  - Device memory (level_zero/core/source/context/context.cpp,
 *    Context::allocDeviceMem, checkMemSizeLimit, freeMem): zeMemAllocDevice
 *    of size 0: ZE_RESULT_ERROR_UNSUPPORTED_SIZE (0x78000009), *pptr NULL;
 *    an alignment that is no power of two: UNSUPPORTED_ALIGNMENT (the
 *    validation layer's check); else a block at an address no host mapping
 *    has (non-canonical), with backing from a raw mmap (fake_pins.h).
 *    zeMemFree of anything but a block's base: INVALID_ARGUMENT.
 *  - Immediate command lists on the one context and device:
 *    zeCommandListCreateImmediate (64 live at most, then
 *    OUT_OF_HOST_MEMORY), zeCommandListDestroy, zeCommandListHostSynchronize
 *    (core 1.6, declared in fake_ze.c: success, nothing is pending). A list
 *    handle that is no live list: INVALID_NULL_HANDLE; NULL pointers:
 *    INVALID_NULL_POINTER (the codes of the loader's validation layer,
 *    source/layers/validation/checkers/parameter_validation/
 *    ze_parameter_validation.cpp). Events are accepted and ignored (a wait
 *    count without a list of events: INVALID_SIZE, the same layer's).
 *  - zeCommandListAppendMemoryCopy(list, dst, src, size, ...), as
 *    intel/compute-runtime e37c60bf2a (2026-08) has it:
 *    CommandListCoreFamilyImmediate::appendMemoryCopy and obtainAllocData
 *    (cmdlist/cmdlist_hw_immediate.inl), CommandListCoreFamily::
 *    appendMemoryCopy and resolveAlignedAllocation (cmdlist/cmdlist_hw.inl),
 *    DriverHandle::findAllocationDataForRange and findHostPointerAllocation
 *    (driver/driver_handle.cpp; the range check there unchanged since
 *    4602220e62, 2020). Each end, dst then src: a USM block holding the
 *    start and the end (a size of 1 or less: the start) is device memory;
 *    else the GPU driver's import holding the start (the greatest base at
 *    or below, checked: HostPointerManager's MapBasedAllocationTracker::get)
 *    is used directly if it holds the end too (base + its size >= ptr +
 *    size); else the range is pageable and goes through a temporary host
 *    pointer allocation (CommandList::getHostPtrAlloc, Device::
 *    allocateMemoryFromHostPtr) or an immediate list's staging buffer
 *    (appendStagingMemoryCopy), without an error: a range that leaves its
 *    import, one over two adjacent imports and one that starts outside and
 *    runs into an import are all staged, silently. A start inside a device
 *    block whose range leaves the block: no USM found, no import, and no
 *    host pointer allocation of an address no host mapping has (the
 *    double's device addresses): ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY
 *    (0x70000003), appendMemoryCopy's answer for an end without an
 *    allocation (for a source, the real driver would first try a CPU copy,
 *    allocateInternalGraphicsMemoryWithHostCopy: not modelled). Size 0:
 *    success, nothing done. The double moves the bytes before the call
 *    returns and counts the outcome (fake_gpu_copy_count, fake_pins.h):
 *    PINNED when every host end is imported, STAGED when one is pageable,
 *    DEVICE for two device ends, REFUSED for an error.
 *  - FAKE_ZE_DRIVERS=N drivers (default 1); only driver 0 offers the import
 *    (the GPU's; others are, say, an NPU's), or the first M with
 *    FAKE_ZE_IMPORT_DRIVERS=M (M drivers at least), each with imports of its own (a driver's
 *    lookups and release see its own imports only).
 *  - Built with FAKE_ZE_LOADER_1_15_7 (tests/fake_ze/v1_15_7/, the file
 *    libze_loader.so.1.15.7): loader 1.15.7, whose zeDriverGet and other
 *    entry points crash (SIGSEGV) before zeInit (the table pointer it reads
 *    became atomic and NULL until init in 1.15.7; 1.15.8 checks it).
 *
 * The double's own exports, besides fake_gpu_*: fake_ze_initialized() and
 * the call kinds below for fake_gpu_call_count(_by). */
#ifndef FAKE_ZE_H
#define FAKE_ZE_H

#include <stddef.h>

enum fake_ze_call {
    FAKE_ZE_CALL_INIT,
    FAKE_ZE_CALL_DRIVER_GET,
    FAKE_ZE_CALL_EXTENSION_ADDRESS,
    FAKE_ZE_CALL_TRANSLATE_HANDLE,
    FAKE_ZE_CALL_IMPORT,
    FAKE_ZE_CALL_RELEASE,
    FAKE_ZE_CALL_BASE_ADDRESS,
    FAKE_ZE_CALL_OTHER,
    FAKE_ZE_CALL_MEMORY_COPY, /* zeCommandListAppendMemoryCopy */
    FAKE_ZE_CALL_KIND_COUNT
};

#endif
