/* A program's own host registration calls for the vendors whose calls have
 * the shape register(ptr, size, flags) / unregister(ptr): CUDA's
 * cudaHostRegister and HIP's hipHostRegister (src/cuda/cuda_interpose.c,
 * src/hip/hip_interpose.c define the exported symbols and find the next
 * definition; this does the rest, the same for both). */
#include "accelerator.h"
#include "interpose_internal.h"
#include "reentry_guard.h"
#include "runtime.h"

#include <stdint.h>

/* An address no one registers: the program's unregistration of memory only
 * the shim registered is answered by the runtime for this instead, so the
 * program gets exactly the error (and last-error state) it would get without
 * the shim, and the shim's registration stays. */
static char never_registered;

struct register_call {
    program_host_register_fn next;
    void *ptr;
    size_t size;
    unsigned int flags;
};

static long run_register(void *arguments)
{
    struct register_call *call = arguments;
    return call->next(call->ptr, call->size, call->flags);
}

struct unregister_call {
    program_host_unregister_fn next;
    void *ptr;
};

static long run_unregister(void *arguments)
{
    struct unregister_call *call = arguments;
    return call->next(call->ptr);
}

/* Whether the shim takes part in this call: initialised, not inside its own
 * call, and the vendor the process's (or now becoming it). */
static bool shim_handles(const struct vendor *vendor)
{
    if (reentry_guarded() || !runtime_is_initialized())
        return false;
    reentry_guard_enter();
    bool handles = accelerator_claim_vendor(vendor);
    reentry_guard_leave();
    return handles;
}

int program_host_register(const struct program_host_calls *calls, program_host_register_fn next,
                          void *ptr, size_t size, unsigned int flags)
{
    if (!shim_handles(calls->vendor))
        return next(ptr, size, flags);
    runtime_notice_gpu();
    struct register_call arguments = {next, ptr, size, flags};
    struct engine_program_call call = {{run_register, &arguments, calls->register_name},
                                       calls->success};
    reentry_guard_enter();
    int result = (int)engine_program_register(&runtime_engine, (uintptr_t)ptr, size, flags, &call);
    reentry_guard_leave();
    return result;
}

int program_host_unregister(const struct program_host_calls *calls, program_host_unregister_fn next,
                            void *ptr)
{
    if (!shim_handles(calls->vendor))
        return next(ptr);
    if (engine_is_shim_registration(&runtime_engine, (uintptr_t)ptr))
        return next(&never_registered); /* not the program's: as without the shim */
    struct unregister_call arguments = {next, ptr};
    struct engine_program_call call = {{run_unregister, &arguments, calls->unregister_name},
                                       calls->success};
    reentry_guard_enter();
    int result = (int)engine_program_unregister(&runtime_engine, (uintptr_t)ptr, &call);
    reentry_guard_leave();
    return result;
}
