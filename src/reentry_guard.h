/* The reentrancy guard: the depth of the shim's own calls into a GPU runtime
 * and dlopen on this thread. Calls the intercepted functions see meanwhile
 * (the runtime's own mlock, mmap, free) go straight to the real functions. */
#ifndef PINSHIM_REENTRY_GUARD_H
#define PINSHIM_REENTRY_GUARD_H

#include <stdbool.h>

extern __thread int reentry_guard_depth __attribute__((tls_model("initial-exec")));

static inline bool reentry_guarded(void)
{
    return reentry_guard_depth != 0;
}
static inline void reentry_guard_enter(void)
{
    reentry_guard_depth++;
}
static inline void reentry_guard_leave(void)
{
    reentry_guard_depth--;
}

#endif
