#include "accelerator.h"

#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct accelerator_settings settings;

/* Program mode tries them in this order; create mode's auto too. */
#define VENDOR_COUNT 3
static const struct vendor *const all_vendors[VENDOR_COUNT] = {&cuda_vendor, &hip_vendor,
                                                               &ze_vendor};

/* The vendors this process may use: all, or the one PINSHIM_VENDOR names. */
static const struct vendor *candidates[VENDOR_COUNT];
static size_t candidate_count;

static const struct vendor *active; /* the process's vendor, set once */

enum create_state { CREATE_NOT_TRIED = 0, CREATE_READY, CREATE_FAILED };
static int create_state;
static pthread_mutex_t create_mutex = PTHREAD_MUTEX_INITIALIZER;
static char create_error[512];

static bool fork_child;
static bool parent_started; /* the parent had started a runtime: unusable here */
static const char *disabled_reason;

/* Read-only registration support, asked once per device: 0 unknown, 1 no, 2 yes. */
static uint8_t read_only_support[ENGINE_MAX_DEVICES];
static int device_nodes[ENGINE_MAX_DEVICES]; /* see accelerator_device_node */

void accelerator_configure(const struct accelerator_settings *given)
{
    settings = *given;
    candidate_count = 0;
    for (size_t i = 0; i < VENDOR_COUNT; i++)
        if (settings.vendor == ACCELERATOR_AUTO || (size_t)settings.vendor == i + 1)
            candidates[candidate_count++] = all_vendors[i];
    for (size_t i = 0; i < VENDOR_COUNT; i++) {
        /* PINSHIM_CUDART names CUDA's runtime; the others are searched by
         * their sonames. */
        bool named = all_vendors[i] == &cuda_vendor && settings.library != NULL &&
                     settings.library[0] != '\0';
        struct vendor_settings vendor_settings = {
            .create_mode = settings.create_mode,
            .device = settings.device,
            .library = named ? settings.library : NULL,
            .chosen = (size_t)settings.vendor == i + 1,
        };
        all_vendors[i]->configure(&vendor_settings);
    }
}

const struct vendor *accelerator_vendor(void)
{
    return __atomic_load_n(&active, __ATOMIC_ACQUIRE);
}

/* Makes vendor the process's vendor unless another one is already; returns
 * the process's vendor. */
static const struct vendor *become_active(const struct vendor *vendor)
{
    const struct vendor *expected = NULL;
    if (__atomic_compare_exchange_n(&active, &expected, vendor, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        log_info("registering through %s", vendor->title);
        return vendor;
    }
    return expected;
}

static bool is_candidate(const struct vendor *vendor)
{
    for (size_t i = 0; i < candidate_count; i++)
        if (candidates[i] == vendor)
            return true;
    return false;
}

/* Create mode: the vendor asked for, or the first whose runtime loads and
 * starts; once. NULL when none could be used (logged once). */
static const struct vendor *create_mode_vendor(void)
{
    int state = __atomic_load_n(&create_state, __ATOMIC_ACQUIRE);
    if (state == CREATE_NOT_TRIED) {
        pthread_mutex_lock(&create_mutex);
        state = __atomic_load_n(&create_state, __ATOMIC_ACQUIRE);
        if (state == CREATE_NOT_TRIED) {
            size_t used = 0;
            create_error[0] = '\0';
            /* A vendor the program's own registration call already named is
             * the only one tried. */
            const struct vendor *claimed = accelerator_vendor();
            for (size_t i = 0; i < candidate_count && state != CREATE_READY; i++) {
                char why[256] = "";
                if (claimed != NULL && candidates[i] != claimed)
                    continue;
                if (candidates[i]->create(why, sizeof(why)) &&
                    become_active(candidates[i]) == candidates[i]) {
                    state = CREATE_READY;
                } else if (used < sizeof(create_error)) {
                    int wrote = snprintf(create_error + used, sizeof(create_error) - used,
                                         "%s%s: %s", used ? "; " : "", candidates[i]->title, why);
                    used += wrote > 0 ? (size_t)wrote : 0;
                }
            }
            if (state != CREATE_READY) {
                state = CREATE_FAILED;
                log_warn("%s; continuing with mlock only", create_error);
            }
            __atomic_store_n(&create_state, state, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&create_mutex);
    }
    return state == CREATE_READY ? accelerator_vendor() : NULL;
}

enum engine_choice accelerator_choose_place(void *context, bool from_worker,
                                            const struct range_place *hint,
                                            struct range_place *place)
{
    (void)context;
    *place = (struct range_place){.device = -1};
    if (!settings.register_enabled)
        return ENGINE_PLACE_DISABLED;
    if (fork_child && parent_started) {
        /* No runtime can be used in a child of a process that started it. */
        if (disabled_reason == NULL) {
            disabled_reason = "forked from a process that had started its GPU runtime";
            log_info("%s: locks in this child stay mlocked only", disabled_reason);
        }
        return ENGINE_PLACE_DISABLED;
    }
    if (settings.create_mode) {
        const struct vendor *vendor = create_mode_vendor();
        return vendor != NULL ? vendor->choose_place(from_worker, hint, place)
                              : ENGINE_PLACE_DISABLED;
    }
    const struct vendor *vendor = accelerator_vendor();
    if (vendor != NULL)
        return vendor->choose_place(from_worker, hint, place);
    /* Program mode, no vendor yet: the first whose runtime the program has
     * started, asked without starting any. */
    for (size_t i = 0; i < candidate_count; i++) {
        if (candidates[i]->state() != VENDOR_STARTED)
            continue;
        enum engine_choice choice = candidates[i]->choose_place(from_worker, hint, place);
        if (choice != ENGINE_PLACE_READY)
            continue;
        if (become_active(candidates[i]) == candidates[i])
            return ENGINE_PLACE_READY;
        /* Another thread chose another vendor meanwhile: ask that one. */
        return accelerator_vendor()->choose_place(from_worker, hint, place);
    }
    return ENGINE_PLACE_DEFER;
}

/* Registrations exist only once a vendor is chosen; a call without one (an
 * engine test, a race with fork) is answered as "no context". */
struct engine_result accelerator_register(void *context, struct range_place *place, void *base,
                                          size_t length)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    if (vendor == NULL)
        return engine_result_of(ENGINE_NO_CONTEXT, 0);
    return vendor->register_range(place, base, length);
}

struct engine_result accelerator_unregister(void *context, const struct range_place *place,
                                            void *base, size_t length)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    if (vendor == NULL)
        return engine_result_of(ENGINE_NOT_REGISTERED, 0);
    return vendor->unregister_range(place, base, length);
}

bool accelerator_thread_place(void *context, struct range_place *place)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    *place = (struct range_place){.device = -1};
    return vendor != NULL && vendor->thread_place(place);
}

bool accelerator_read_only_supported(void *context, const struct range_place *place)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    int device = place->device >= 0 ? place->device : 0;
    if (vendor == NULL || device >= ENGINE_MAX_DEVICES)
        return false;
    uint8_t known = __atomic_load_n(&read_only_support[device], __ATOMIC_RELAXED);
    if (known != 0)
        return known == 2;
    bool supported = vendor->read_only_supported(place);
    __atomic_store_n(&read_only_support[device], supported ? 2 : 1, __ATOMIC_RELAXED);
    log_info("device %d %s read-only registrations (read-only memory %s)", device,
             supported ? "takes" : "takes no",
             supported ? "is registered so" : "stays mlocked only");
    return supported;
}

int accelerator_device_node(void *context, const struct range_place *place)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    int device = place->device;
    if (vendor == NULL || vendor->device_numa_node == NULL || device < 0 ||
        device >= ENGINE_MAX_DEVICES)
        return -1;
    /* 0: not asked yet; else the node + 2 (1: unknown). */
    int known = __atomic_load_n(&device_nodes[device], __ATOMIC_RELAXED);
    if (known != 0)
        return known - 2;
    int node = vendor->device_numa_node(place);
    if (node < -1)
        node = -1;
    __atomic_store_n(&device_nodes[device], node + 2, __ATOMIC_RELAXED);
    return node;
}

const char *accelerator_error_name(void *context, int code)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    return vendor != NULL ? vendor->code_name(code) : NULL;
}

const char *accelerator_call_name(void *context, bool unregister)
{
    (void)context;
    const struct vendor *vendor = accelerator_vendor();
    return vendor != NULL ? vendor->call_name(unregister) : NULL;
}

bool accelerator_claim_vendor(const struct vendor *vendor)
{
    /* Nothing is loaded or started here: in create mode the runtime is
     * loaded at the first registration, as always. */
    return settings.register_enabled && is_candidate(vendor) && become_active(vendor) == vendor;
}

bool accelerator_runtime_loaded(void)
{
    const struct vendor *vendor = accelerator_vendor();
    if (vendor != NULL)
        return vendor->state() != VENDOR_ABSENT;
    for (size_t i = 0; i < candidate_count; i++)
        if (candidates[i]->state() != VENDOR_ABSENT)
            return true;
    return false;
}

static bool loaded_at_fork[VENDOR_COUNT];

void accelerator_before_fork(void)
{
    /* Every vendor's: a runtime the program started is unusable in the
     * child, also one no registration had chosen yet, or one the shim never
     * asked about: its library's presence is noted here (the loader's list,
     * no call into a runtime) and the child reads the rest. */
    for (size_t i = 0; i < VENDOR_COUNT; i++) {
        parent_started = parent_started || all_vendors[i]->seen_started();
        loaded_at_fork[i] = loaded_objects_find(all_vendors[i]->fork_library, NULL, 0);
    }
}

void accelerator_after_fork_child(void)
{
    fork_child = true;
    parent_started = parent_started || accelerator_vendor() != NULL ||
                     __atomic_load_n(&create_state, __ATOMIC_RELAXED) == CREATE_READY;
    for (size_t i = 0; i < VENDOR_COUNT; i++)
        parent_started =
            parent_started || (loaded_at_fork[i] && (all_vendors[i]->started_before_fork == NULL ||
                                                     all_vendors[i]->started_before_fork()));
    __atomic_store_n(&active, NULL, __ATOMIC_RELEASE);
    if (create_state == CREATE_READY)
        create_state = CREATE_NOT_TRIED;
    pthread_mutex_init(&create_mutex, NULL);
    for (size_t i = 0; i < VENDOR_COUNT; i++)
        all_vendors[i]->after_fork_child();
}

void accelerator_process_exiting(void)
{
    for (size_t i = 0; i < VENDOR_COUNT; i++)
        all_vendors[i]->process_exiting();
}

void accelerator_describe(struct accelerator_description *out)
{
    memset(out, 0, sizeof(*out));
    out->vendor = accelerator_vendor();
    if (out->vendor != NULL)
        out->vendor->describe(&out->vendor_description);
    else if (settings.create_mode && candidate_count == 1)
        candidates[0]->describe(&out->vendor_description);
    out->disabled_reason = disabled_reason;
    if (__atomic_load_n(&create_state, __ATOMIC_ACQUIRE) == CREATE_FAILED)
        snprintf(out->create_error, sizeof(out->create_error), "%s", create_error);
}
