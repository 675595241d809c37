#include "loaded_objects.h"

#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>

#define MAX_CODE_RANGES 64
#define LIBRARY_PATH_MAX 512

/* What the last walk found, valid while the loader's counters are the same. */
static struct {
    bool walked;
    unsigned long long adds, subs;
    bool loaded[LOADED_LIBRARY_COUNT];
    char path[LOADED_LIBRARY_COUNT][LIBRARY_PATH_MAX];
    size_t range_count;
    uintptr_t ranges[MAX_CODE_RANGES][2];
} cache;
static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;

static const char *base_name(const char *name)
{
    const char *slash = strrchr(name, '/');
    return slash != NULL ? slash + 1 : name;
}

static const char *const library_prefixes[LOADED_LIBRARY_COUNT] = {
    [LOADED_CUDA_DRIVER] = "libcuda.so",
    [LOADED_HIP_RUNTIME] = "libamdhip64.so",
    [LOADED_HSA_RUNTIME] = "libhsa-runtime64.so",
    [LOADED_ZE_LOADER] = "libze_loader.so",
};

static bool starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

bool loaded_objects_is_library_name(const char *name, enum loaded_library which)
{
    return name != NULL && starts_with(base_name(name), library_prefixes[which]);
}

bool loaded_objects_is_gpu_runtime_name(const char *name)
{
    if (name == NULL)
        return false;
    const char *base = base_name(name);
    for (int which = 0; which < LOADED_LIBRARY_COUNT; which++)
        if (starts_with(base, library_prefixes[which]))
            return true;
    /* Their companions: NVIDIA's runtimes and driver libraries, the ROCt
     * thunk under HSA, Level Zero's GPU driver and layers. */
    return strstr(base, "cudart") != NULL || starts_with(base, "libnvidia-") ||
           starts_with(base, "libhsakmt.so") || starts_with(base, "libze_intel_gpu.so") ||
           (starts_with(base, "libze_") && strstr(base, "_layer.so") != NULL);
}

struct walk {
    bool counters_only; /* the first object tells the counters; stop there */
    unsigned long long adds, subs;
};

static int visit(struct dl_phdr_info *info, size_t size, void *context)
{
    struct walk *walk = context;
    /* dlpi_adds and dlpi_subs are there since glibc 2.4 (size says so). */
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
        return 1;
    if (walk->counters_only) {
        walk->adds = info->dlpi_adds;
        walk->subs = info->dlpi_subs;
        return 1;
    }
    const char *name = info->dlpi_name;
    if (!loaded_objects_is_gpu_runtime_name(name))
        return 0;
    for (int which = 0; which < LOADED_LIBRARY_COUNT; which++) {
        if (cache.loaded[which] || !loaded_objects_is_library_name(name, which))
            continue;
        cache.loaded[which] = true;
        size_t length = strlen(name);
        if (length >= sizeof(cache.path[which]))
            length = 0; /* too long to keep: found by its soname instead */
        memcpy(cache.path[which], name, length);
        cache.path[which][length] = '\0';
    }
    for (size_t i = 0; i < info->dlpi_phnum && cache.range_count < MAX_CODE_RANGES; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        if (header->p_type != PT_LOAD || !(header->p_flags & PF_X))
            continue;
        uintptr_t start = (uintptr_t)info->dlpi_addr + header->p_vaddr;
        cache.ranges[cache.range_count][0] = start;
        cache.ranges[cache.range_count][1] = start + header->p_memsz;
        cache.range_count++;
    }
    return 0;
}

/* Walks again when a load or an unload happened since the last walk.
 * Called with cache_mutex held. */
static void refresh_locked(void)
{
    struct walk walk = {.counters_only = true};
    dl_iterate_phdr(visit, &walk);
    if (cache.walked && walk.adds == cache.adds && walk.subs == cache.subs)
        return;
    memset(cache.loaded, 0, sizeof(cache.loaded));
    cache.range_count = 0;
    struct walk full = {.counters_only = false};
    dl_iterate_phdr(visit, &full);
    cache.adds = walk.adds;
    cache.subs = walk.subs;
    cache.walked = true;
}

bool loaded_objects_find(enum loaded_library which, char *path, size_t path_size)
{
    pthread_mutex_lock(&cache_mutex);
    refresh_locked();
    bool loaded = cache.loaded[which];
    if (loaded && path != NULL && path_size > 0) {
        size_t length = strlen(cache.path[which]);
        if (length >= path_size)
            length = 0;
        memcpy(path, cache.path[which], length);
        path[length] = '\0';
    }
    pthread_mutex_unlock(&cache_mutex);
    return loaded;
}

bool loaded_objects_in_gpu_runtime(uintptr_t address)
{
    pthread_mutex_lock(&cache_mutex);
    refresh_locked();
    bool found = false;
    for (size_t i = 0; i < cache.range_count && !found; i++)
        found = address >= cache.ranges[i][0] && address < cache.ranges[i][1];
    pthread_mutex_unlock(&cache_mutex);
    return found;
}

void loaded_objects_after_fork(void)
{
    pthread_mutex_init(&cache_mutex, NULL);
}
