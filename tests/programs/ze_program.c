/* ze_program: a Level Zero program as a new user would write it (linked
 * against libze_loader, here the tests' fake), locking an 8 MiB
 * posix_memalign buffer, run by tests/integration/test_vendors.c with and
 * without the shim. Its own imports go through the zex functions it gets
 * from zeDriverGetExtensionFunctionAddress, as SYCL's adapter does. It
 * prints what it saw as key=value lines. The scenario is argv[1]:
 *
 *   started       zeInit first, then mlock, munlock, free
 *   deferred      mlock before zeInit; then zeInit; pinshim_drain
 *   own_exact     the program imports the locked buffer, whole, and releases it
 *   own_inside    the same for 64 KiB inside the buffer
 *   own_first     the program imports first, then locks, then releases
 *   release_inner a release of an address inside the locked buffer
 *   own_unseen    the program imports first with functions it got from the
 *                 loader's own zeDriverGetExtensionFunctionAddress (dlsym on
 *                 the loader's handle: calls the shim cannot see), then locks
 *   exit_locked   exits with the buffer locked (the shim releases at exit)
 *   read_only     the buffer is made read-only (mprotect), then locked: no
 *                 host registration of this vendor's pins read-only memory
 *   start_then_lock  zeInit (failing with FAKE_ZE_START=fail, or a real driver
 *                 that finds no device), then mlock, pinshim_drain, munlock
 *   start_then_lock_unseen  the same, zeInit called through the loader's handle
 *                 (dlsym), as SYCL's adapter with its own loader front end
 *                 does: no definition of the shim's sees it
 *   fork_child    zeInit, then a child locks a buffer of its own and says
 *                 what the shim did there; then the parent locks
 *   sycl_dropped  the first half locked (the shim imports it); then what
 *                 SYCL's prepare_for_device_copy and release_from_device_copy
 *                 do inside it through their own loader (the unseen
 *                 functions): an import inside (no-op), its release (drops
 *                 the shim's whole import); then the second half is locked
 *   sycl_at_base  the same drop, then the program imports 64 KiB at the
 *                 buffer's base for itself, and the first half is unlocked
 *   other_driver  with two drivers that import (FAKE_ZE_DRIVERS=2
 *                 FAKE_ZE_IMPORT_DRIVERS=2): the buffer locked (the shim
 *                 imports on driver 0), the program imports and releases it
 *                 on driver 1 */
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BYTES ((size_t)8 << 20)
#define PART_OFFSET ((size_t)1 << 20)
#define PART_BYTES ((size_t)64 << 10)

typedef ze_result_t (*import_fn)(ze_driver_handle_t, void *, size_t);
typedef ze_result_t (*release_fn)(ze_driver_handle_t, void *);
typedef ze_result_t (*base_fn)(ze_driver_handle_t, void *, void **);

static int (*is_registered)(const void *);
static size_t (*drain)(void);
static uint64_t (*calls_by)(int, const char *);
static size_t (*violations)(void);
static int (*initialized)(void);

static ze_driver_handle_t own_driver;
static import_fn import_pointer;
static release_fn release_pointer;
static base_fn base_address;

static int registered(const void *pointer)
{
    return is_registered != NULL ? is_registered(pointer) : -1;
}

/* The base of the import that holds pointer, as the driver says (0: none). */
static uintptr_t imported_base(void *pointer)
{
    void *base = NULL;
    return base_address(own_driver, pointer, &base) == ZE_RESULT_SUCCESS ? (uintptr_t)base : 0;
}

static import_fn unseen_import;
static release_fn unseen_release;

static int start(void)
{
    ze_result_t result = zeInit(0);
    uint32_t count = 1;
    ze_driver_handle_t driver = NULL;
    if (result == ZE_RESULT_SUCCESS)
        result = zeDriverGet(&count, &driver);
    if (result == ZE_RESULT_SUCCESS)
        result = zelLoaderTranslateHandle(ZEL_HANDLE_DRIVER, driver, (void **)&own_driver);
    if (result == ZE_RESULT_SUCCESS)
        result = zeDriverGetExtensionFunctionAddress(driver, "zexDriverImportExternalPointer",
                                                     (void **)&import_pointer);
    if (result == ZE_RESULT_SUCCESS)
        result = zeDriverGetExtensionFunctionAddress(driver, "zexDriverReleaseImportedPointer",
                                                     (void **)&release_pointer);
    if (result == ZE_RESULT_SUCCESS)
        result = zeDriverGetExtensionFunctionAddress(driver, "zexDriverGetHostPointerBaseAddress",
                                                     (void **)&base_address);
    /* The loader's own entry point, past any definition before it. */
    void *loader = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    ze_result_t (*extension_address)(ze_driver_handle_t, const char *, void **) = NULL;
    *(void **)&extension_address = dlsym(loader, "zeDriverGetExtensionFunctionAddress");
    if (result == ZE_RESULT_SUCCESS)
        result =
            extension_address(driver, "zexDriverImportExternalPointer", (void **)&unseen_import);
    if (result == ZE_RESULT_SUCCESS)
        result =
            extension_address(driver, "zexDriverReleaseImportedPointer", (void **)&unseen_release);
    return (int)result;
}

/* Whatever the start answers, the program goes on with memory it locks.
 * What the shim asked of Level Zero is printed from the double's counts. */
static void start_then_lock(unsigned char *buffer, bool unseen)
{
    ze_result_t (*init)(ze_init_flags_t) = zeInit;
    if (unseen) {
        void *loader = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
        *(void **)&init = loader != NULL ? dlsym(loader, "zeInit") : NULL;
        if (init == NULL) {
            printf("harness: no loader's zeInit\n");
            exit(3);
        }
    }
    printf("start=%#x\n", (unsigned)init(ZE_INIT_FLAG_GPU_ONLY));
    printf("mlock=%d\n", mlock(buffer, BYTES));
    printf("waiting=%zu\n", drain != NULL ? drain() : 0);
    printf("registered=%d\n", registered(buffer));
    printf("munlock=%d\n", munlock(buffer, BYTES));
    free(buffer);
    if (calls_by != NULL) {
        /* The program's zeInit reaches the loader through the shim's
         * definition where it has one: counted as the shim's. */
        printf("init_calls=%llu\n",
               (unsigned long long)(calls_by(0, "libpinshim") + calls_by(0, "ze_program")));
        printf("shim_driver_get_calls=%llu\n", (unsigned long long)calls_by(1, "libpinshim"));
        printf("shim_extension_calls=%llu\n", (unsigned long long)calls_by(2, "libpinshim"));
    }
}

/* A child of a process that started Level Zero: whatever it locks stays
 * locked only (the driver starts anew in a new process). */
static void child_locks(unsigned char *buffer)
{
    /* Started, nothing locked yet: no registration has chosen a vendor. */
    printf("start=%#x\n", start());
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        unsigned char *own = NULL;
        if (posix_memalign((void **)&own, 4096, BYTES) != 0)
            _exit(3);
        memset(own, 0x33, BYTES);
        uint64_t imports = calls_by(4, "libpinshim"), lookups = calls_by(1, "libpinshim");
        printf("child_mlock=%d\n", mlock(own, BYTES));
        if (drain != NULL)
            drain();
        printf("child_registered=%d\n", registered(own));
        printf("child_imported=%d\n", imported_base(own) != 0);
        printf("child_shim_calls=%llu\n",
               (unsigned long long)(calls_by(4, "libpinshim") - imports +
                                    calls_by(1, "libpinshim") - lookups));
        printf("child_munlock=%d\n", munlock(own, BYTES));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    printf("child_status=%d\n",
           child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status)
               ? WEXITSTATUS(status)
               : -1);
    printf("mlock=%d\n", mlock(buffer, BYTES));
    printf("registered=%d\n", registered(buffer));
    printf("munlock=%d\n", munlock(buffer, BYTES));
    free(buffer);
}

/* What SYCL's adapter does with the shim's import under it, then the next
 * operation on the shim's range. */
static void sycl_dropped(unsigned char *buffer, bool at_base)
{
    size_t half = BYTES / 2;
    printf("start=%#x\n", start());
    printf("mlock=%d\n", mlock(buffer, half));
    printf("registered=%d\n", registered(buffer));
    printf("prepare=%#x\n", unseen_import(own_driver, buffer + PART_OFFSET, PART_BYTES));
    printf("release=%#x\n", unseen_release(own_driver, buffer + PART_OFFSET));
    printf("imported_between=%d\n", imported_base(buffer) != 0);
    if (at_base) {
        printf("own_import=%#x\n", unseen_import(own_driver, buffer, PART_BYTES));
        printf("munlock_half=%d\n", munlock(buffer, half));
        printf("own_import_kept=%d\n", imported_base(buffer) == (uintptr_t)buffer);
        printf("own_release=%#x\n", unseen_release(own_driver, buffer));
    } else {
        printf("mlock_rest=%d\n", mlock(buffer + half, half));
        if (drain != NULL)
            drain();
        printf("registered_after=%d\n", registered(buffer + half));
        printf("imported_after=%d\n", imported_base(buffer + half) == (uintptr_t)buffer);
        printf("munlock=%d\n", munlock(buffer, BYTES));
    }
    printf("imported_after_munlock=%d\n", imported_base(buffer) != 0);
    printf("shim_release_calls=%llu\n", (unsigned long long)calls_by(5, "libpinshim"));
    printf("violations=%zu\n", violations());
}

/* The program's imports on driver 1 beside the shim's on driver 0. */
static void other_driver(unsigned char *buffer)
{
    printf("start=%#x\n", start());
    uint32_t count = 2;
    ze_driver_handle_t handles[2] = {NULL, NULL};
    ze_driver_handle_t second = NULL;
    import_fn second_import = NULL;
    release_fn second_release = NULL;
    if (zeDriverGet(&count, handles) != ZE_RESULT_SUCCESS || count < 2 ||
        zelLoaderTranslateHandle(ZEL_HANDLE_DRIVER, handles[1], (void **)&second) !=
            ZE_RESULT_SUCCESS ||
        zeDriverGetExtensionFunctionAddress(handles[1], "zexDriverImportExternalPointer",
                                            (void **)&second_import) != ZE_RESULT_SUCCESS ||
        zeDriverGetExtensionFunctionAddress(handles[1], "zexDriverReleaseImportedPointer",
                                            (void **)&second_release) != ZE_RESULT_SUCCESS) {
        printf("harness: no second driver that imports\n");
        exit(3);
    }
    printf("mlock=%d\n", mlock(buffer, BYTES));
    printf("registered=%d\n", registered(buffer));
    printf("other_import=%#x\n", second_import(second, buffer, BYTES));
    printf("registered_beside=%d\n", registered(buffer));
    printf("imported_beside=%d\n", imported_base(buffer) == (uintptr_t)buffer);
    printf("other_release=%#x\n", second_release(second, buffer));
    if (drain != NULL)
        drain();
    printf("registered_after=%d\n", registered(buffer));
    printf("imported_after=%d\n", imported_base(buffer) == (uintptr_t)buffer);
    printf("munlock=%d\n", munlock(buffer, BYTES));
    printf("imported_after_munlock=%d\n", imported_base(buffer) != 0);
    printf("shim_import_calls=%llu\n", (unsigned long long)calls_by(4, "libpinshim"));
    printf("shim_release_calls=%llu\n", (unsigned long long)calls_by(5, "libpinshim"));
    printf("violations=%zu\n", violations());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *scenario = argc > 1 ? argv[1] : "started";
    *(void **)&is_registered = dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    *(void **)&drain = dlsym(RTLD_DEFAULT, "pinshim_drain");
    *(void **)&calls_by = dlsym(RTLD_DEFAULT, "fake_gpu_call_count_by");
    *(void **)&violations = dlsym(RTLD_DEFAULT, "fake_gpu_violation_count");
    *(void **)&initialized = dlsym(RTLD_DEFAULT, "fake_ze_initialized");
    unsigned char *buffer = NULL;
    if (posix_memalign((void **)&buffer, 4096, BYTES) != 0)
        return 3;
    memset(buffer, 0x5a, BYTES);

    if (strcmp(scenario, "start_then_lock") == 0 ||
        strcmp(scenario, "start_then_lock_unseen") == 0) {
        start_then_lock(buffer, strcmp(scenario, "start_then_lock_unseen") == 0);
        return 0;
    }
    if (strcmp(scenario, "fork_child") == 0) {
        child_locks(buffer);
        return 0;
    }
    if (strcmp(scenario, "sycl_dropped") == 0 || strcmp(scenario, "sycl_at_base") == 0) {
        sycl_dropped(buffer, strcmp(scenario, "sycl_at_base") == 0);
        return 0;
    }
    if (strcmp(scenario, "other_driver") == 0) {
        other_driver(buffer);
        return 0;
    }
    if (strcmp(scenario, "deferred") == 0) {
        printf("mlock=%d\n", mlock(buffer, BYTES));
        printf("registered_before_start=%d\n", registered(buffer));
        printf("started_by_then=%d\n", initialized());
        printf("start=%#x\n", start());
        if (drain != NULL)
            drain();
        printf("registered_after_start=%d\n", registered(buffer));
        printf("imported_base=%d\n", imported_base(buffer + 4096) == (uintptr_t)buffer);
    } else {
        printf("start=%#x\n", start());
        if (strcmp(scenario, "own_first") == 0)
            printf("own_import=%#x\n", import_pointer(own_driver, buffer, BYTES));
        if (strcmp(scenario, "own_unseen") == 0)
            printf("own_import=%#x\n", unseen_import(own_driver, buffer, BYTES));
        if (strcmp(scenario, "read_only") == 0)
            printf("protect=%d\n", mprotect(buffer, BYTES, PROT_READ));
        printf("mlock=%d\n", mlock(buffer, BYTES));
        printf("registered=%d\n", registered(buffer));
        printf("imported_base=%d\n", imported_base(buffer + 4096) == (uintptr_t)buffer);
        if (strcmp(scenario, "exit_locked") == 0)
            exit(0);
        if (strcmp(scenario, "own_exact") == 0) {
            printf("own_import=%#x\n", import_pointer(own_driver, buffer, BYTES));
            printf("own_release=%#x\n", release_pointer(own_driver, buffer));
        } else if (strcmp(scenario, "own_inside") == 0) {
            printf("own_import=%#x\n",
                   import_pointer(own_driver, buffer + PART_OFFSET, PART_BYTES));
            printf("part_base=%d\n",
                   imported_base(buffer + PART_OFFSET) == (uintptr_t)(buffer + PART_OFFSET));
            printf("own_release=%#x\n", release_pointer(own_driver, buffer + PART_OFFSET));
        } else if (strcmp(scenario, "own_first") == 0) {
            printf("own_release=%#x\n", release_pointer(own_driver, buffer));
        } else if (strcmp(scenario, "own_unseen") == 0) {
            printf("own_release=%#x\n", unseen_release(own_driver, buffer));
            printf("imported_between=%d\n", imported_base(buffer) != 0);
            printf("own_import_again=%#x\n", unseen_import(own_driver, buffer, BYTES));
            printf("own_release_again=%#x\n", unseen_release(own_driver, buffer));
        } else if (strcmp(scenario, "release_inner") == 0) {
            printf("inner_release=%#x\n", release_pointer(own_driver, buffer + 4096));
        }
        if (drain != NULL)
            drain();
        printf("registered_after=%d\n", registered(buffer));
        printf("imported_after=%d\n", imported_base(buffer) == (uintptr_t)buffer);
    }
    printf("munlock=%d\n", munlock(buffer, BYTES));
    if (strcmp(scenario, "read_only") == 0)
        printf("unprotect=%d\n", mprotect(buffer, BYTES, PROT_READ | PROT_WRITE));
    printf("registered_after_munlock=%d\n", registered(buffer));
    printf("imported_after_munlock=%d\n", imported_base(buffer) != 0);
    free(buffer);
    /* The calls the driver saw from the program and from the shim (import 4,
     * release 5: fake_ze.h). */
    printf("program_import_calls=%llu\n", (unsigned long long)calls_by(4, "ze_program"));
    printf("program_release_calls=%llu\n", (unsigned long long)calls_by(5, "ze_program"));
    printf("shim_import_calls=%llu\n", (unsigned long long)calls_by(4, "libpinshim"));
    printf("shim_release_calls=%llu\n", (unsigned long long)calls_by(5, "libpinshim"));
    printf("violations=%zu\n", violations());
    return 0;
}
