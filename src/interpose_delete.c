/* C++'s operator delete, every form. libstdc++'s calls free, which the shim
 * sees; allocators that replace operator delete (tcmalloc, ASan's runtime)
 * free without calling free, so a locked buffer deleted while registered
 * would stay registered over memory the allocator reuses or returns. Each
 * form releases the block's registrations as free does and then hands over
 * to the next definition (libstdc++'s then calls free, which finds nothing
 * registered: a few instructions). */
#include "interpose_internal.h"
#include "runtime.h"

#include <dlfcn.h>
#include <stddef.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

enum delete_form {
    DELETE_PLAIN,
    DELETE_ARRAY,
    DELETE_SIZED,
    DELETE_ARRAY_SIZED,
    DELETE_ALIGNED,
    DELETE_ARRAY_ALIGNED,
    DELETE_SIZED_ALIGNED,
    DELETE_ARRAY_SIZED_ALIGNED,
    DELETE_NOTHROW,
    DELETE_ARRAY_NOTHROW,
    DELETE_ALIGNED_NOTHROW,
    DELETE_ARRAY_ALIGNED_NOTHROW,
    DELETE_FORMS
};

/* The Itanium C++ ABI's names (std::align_val_t is a size_t enum,
 * std::nothrow_t passed by reference). */
static const char *const delete_names[DELETE_FORMS] = {
    [DELETE_PLAIN] = "_ZdlPv",
    [DELETE_ARRAY] = "_ZdaPv",
    [DELETE_SIZED] = "_ZdlPvm",
    [DELETE_ARRAY_SIZED] = "_ZdaPvm",
    [DELETE_ALIGNED] = "_ZdlPvSt11align_val_t",
    [DELETE_ARRAY_ALIGNED] = "_ZdaPvSt11align_val_t",
    [DELETE_SIZED_ALIGNED] = "_ZdlPvmSt11align_val_t",
    [DELETE_ARRAY_SIZED_ALIGNED] = "_ZdaPvmSt11align_val_t",
    [DELETE_NOTHROW] = "_ZdlPvRKSt9nothrow_t",
    [DELETE_ARRAY_NOTHROW] = "_ZdaPvRKSt9nothrow_t",
    [DELETE_ALIGNED_NOTHROW] = "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    [DELETE_ARRAY_ALIGNED_NOTHROW] = "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

/* The next definitions, looked up at a form's first use (a C++ library may
 * be loaded after the shim) and kept. */
static void *next_delete[DELETE_FORMS];

struct delete_call {
    enum delete_form form;
    void *ptr;
    size_t size, alignment;
    const void *nothrow;
};

static void *next_definition(enum delete_form form)
{
    void *next = __atomic_load_n(&next_delete[form], __ATOMIC_ACQUIRE);
    if (next == NULL) {
        reentry_guard_enter(); /* dlsym may allocate and free */
        next = dlsym(RTLD_NEXT, delete_names[form]);
        reentry_guard_leave();
        if (next != NULL)
            __atomic_store_n(&next_delete[form], next, __ATOMIC_RELEASE);
    }
    return next;
}

static long run_delete(void *arguments)
{
    const struct delete_call *call = arguments;
    void *next = next_definition(call->form);
    if (next == NULL) {
        /* No C++ library defines it after the shim: what its default does. */
        interpose_free(call->ptr);
        return 0;
    }
    switch (call->form) {
    case DELETE_PLAIN:
    case DELETE_ARRAY:
        ((void (*)(void *))next)(call->ptr);
        break;
    case DELETE_SIZED:
    case DELETE_ARRAY_SIZED:
        ((void (*)(void *, size_t))next)(call->ptr, call->size);
        break;
    case DELETE_ALIGNED:
    case DELETE_ARRAY_ALIGNED:
        ((void (*)(void *, size_t))next)(call->ptr, call->alignment);
        break;
    case DELETE_SIZED_ALIGNED:
    case DELETE_ARRAY_SIZED_ALIGNED:
        ((void (*)(void *, size_t, size_t))next)(call->ptr, call->size, call->alignment);
        break;
    case DELETE_NOTHROW:
    case DELETE_ARRAY_NOTHROW:
        ((void (*)(void *, const void *))next)(call->ptr, call->nothrow);
        break;
    case DELETE_ALIGNED_NOTHROW:
    case DELETE_ARRAY_ALIGNED_NOTHROW:
        ((void (*)(void *, size_t, const void *))next)(call->ptr, call->alignment, call->nothrow);
        break;
    case DELETE_FORMS:
        break;
    }
    return 0;
}

static void delete_through_shim(enum delete_form form, void *ptr, size_t size, size_t alignment,
                                const void *nothrow)
{
    struct delete_call call = {form, ptr, size, alignment, nothrow};
    if (ptr == NULL) {
        run_delete(&call);
        return;
    }
    interpose_release_block(ptr, run_delete, &call);
}

PINSHIM_EXPORT void _ZdlPv(void *ptr)
{
    delete_through_shim(DELETE_PLAIN, ptr, 0, 0, NULL);
}

PINSHIM_EXPORT void _ZdaPv(void *ptr)
{
    delete_through_shim(DELETE_ARRAY, ptr, 0, 0, NULL);
}

PINSHIM_EXPORT void _ZdlPvm(void *ptr, size_t size)
{
    delete_through_shim(DELETE_SIZED, ptr, size, 0, NULL);
}

PINSHIM_EXPORT void _ZdaPvm(void *ptr, size_t size)
{
    delete_through_shim(DELETE_ARRAY_SIZED, ptr, size, 0, NULL);
}

PINSHIM_EXPORT void _ZdlPvSt11align_val_t(void *ptr, size_t alignment)
{
    delete_through_shim(DELETE_ALIGNED, ptr, 0, alignment, NULL);
}

PINSHIM_EXPORT void _ZdaPvSt11align_val_t(void *ptr, size_t alignment)
{
    delete_through_shim(DELETE_ARRAY_ALIGNED, ptr, 0, alignment, NULL);
}

PINSHIM_EXPORT void _ZdlPvmSt11align_val_t(void *ptr, size_t size, size_t alignment)
{
    delete_through_shim(DELETE_SIZED_ALIGNED, ptr, size, alignment, NULL);
}

PINSHIM_EXPORT void _ZdaPvmSt11align_val_t(void *ptr, size_t size, size_t alignment)
{
    delete_through_shim(DELETE_ARRAY_SIZED_ALIGNED, ptr, size, alignment, NULL);
}

PINSHIM_EXPORT void _ZdlPvRKSt9nothrow_t(void *ptr, const void *nothrow)
{
    delete_through_shim(DELETE_NOTHROW, ptr, 0, 0, nothrow);
}

PINSHIM_EXPORT void _ZdaPvRKSt9nothrow_t(void *ptr, const void *nothrow)
{
    delete_through_shim(DELETE_ARRAY_NOTHROW, ptr, 0, 0, nothrow);
}

PINSHIM_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *ptr, size_t alignment,
                                                        const void *nothrow)
{
    delete_through_shim(DELETE_ALIGNED_NOTHROW, ptr, 0, alignment, nothrow);
}

PINSHIM_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *ptr, size_t alignment,
                                                        const void *nothrow)
{
    delete_through_shim(DELETE_ARRAY_ALIGNED_NOTHROW, ptr, 0, alignment, nothrow);
}
