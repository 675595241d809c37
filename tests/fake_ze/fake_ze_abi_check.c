/* The numbers src/ze/ze_backend.c and ze_interpose.c use without Level
 * Zero's headers (the shim builds without them), checked here against the
 * headers the fake is built with (Debian's level-zero 1.8). Compiles to
 * nothing. */
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#define SAME(a, b) ((long long)(a) == (long long)(b))

_Static_assert(SAME(ZE_RESULT_SUCCESS, 0) && SAME(ZE_RESULT_ERROR_DEVICE_LOST, 0x70000001) &&
                   SAME(ZE_RESULT_ERROR_UNINITIALIZED, 0x78000001) &&
                   SAME(ZE_RESULT_ERROR_INVALID_ARGUMENT, 0x78000004) &&
                   SAME(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE, 0x78000006) &&
                   SAME(ZE_RESULT_ERROR_INVALID_SIZE, 0x78000008) &&
                   SAME(ZE_RESULT_ERROR_OVERLAPPING_REGIONS, 0x7800001a),
               "ze_result_t values of ze_backend.c");
_Static_assert(SAME(ZE_INIT_FLAG_GPU_ONLY, 1) && SAME(ZEL_HANDLE_DRIVER, 0),
               "flag and handle type values of ze_backend.c");
