/* The accelerator layer: the engine's GPU calls (engine_backend's
 * choose_place, register_range, unregister_range, thread_place,
 * read_only_supported, error_name, call_name), routed to one vendor
 * (vendor.h) per process.
 *
 * Program mode: the first vendor whose runtime the program has started
 * (CUDA, HIP, Level Zero, unless PINSHIM_VENDOR names one) becomes the
 * process's vendor when the first registration can be placed, or when the
 * program makes a registration call of that vendor itself. Create mode: the
 * vendor PINSHIM_VENDOR names, or with auto the first whose runtime loads
 * and starts, in the same order. Another vendor's registration calls the
 * program makes are passed through untouched.
 *
 * Callers hold the reentrancy guard (reentry_guard.h), as vendors require. */
#ifndef PINSHIM_ACCELERATOR_H
#define PINSHIM_ACCELERATOR_H

#include "engine.h"
#include "vendor.h"

#include <stdbool.h>
#include <stddef.h>

enum accelerator_vendor_choice {
    ACCELERATOR_AUTO,
    ACCELERATOR_CUDA,
    ACCELERATOR_HIP,
    ACCELERATOR_ZE,
};

struct accelerator_settings {
    bool register_enabled;
    bool create_mode;
    enum accelerator_vendor_choice vendor;
    int device;          /* create mode: -1 for the locking thread's */
    const char *library; /* create mode, CUDA only: the runtime asked for (PINSHIM_CUDART) */
};

void accelerator_configure(const struct accelerator_settings *given);

/* The engine backend's GPU calls (context unused). */
enum engine_choice accelerator_choose_place(void *context, bool from_worker,
                                            const struct range_place *hint,
                                            struct range_place *place);
struct engine_result accelerator_register(void *context, struct range_place *place, void *base,
                                          size_t length);
struct engine_result accelerator_unregister(void *context, const struct range_place *place,
                                            void *base, size_t length);
bool accelerator_thread_place(void *context, struct range_place *place);
bool accelerator_read_only_supported(void *context, const struct range_place *place);
int accelerator_device_node(void *context, const struct range_place *place);
const char *accelerator_error_name(void *context, int code);
const char *accelerator_call_name(void *context, bool unregister);

/* The process's vendor, or NULL while none is chosen. */
const struct vendor *accelerator_vendor(void);

/* A program's own registration call of vendor's: true when the shim handles
 * it (vendor is, or now becomes, the process's vendor); false when another
 * vendor serves the process and the call must pass through untouched. */
bool accelerator_claim_vendor(const struct vendor *vendor);

/* Program mode: whether some candidate vendor's runtime is loaded in the
 * process (the loader's list; nothing is started or loaded to find out). */
bool accelerator_runtime_loaded(void);

/* Fork handlers: before (no call into a runtime: its own fork handlers may
 * hold its locks), and in the child, where a runtime the parent started
 * cannot be used. */
void accelerator_before_fork(void);
void accelerator_after_fork_child(void);

/* At exit, before the engine's last unregistrations (vendor.h). */
void accelerator_process_exiting(void);

/* For the stats: the vendor used (NULL when none was) and what it says of
 * itself; why registration never started when no vendor was chosen. */
struct accelerator_description {
    const struct vendor *vendor;
    struct vendor_description vendor_description;
    const char *disabled_reason; /* the process forked from one that used a runtime, ... */
    char create_error[512];      /* create mode: why no vendor's runtime could be used */
};
void accelerator_describe(struct accelerator_description *out);

#endif
