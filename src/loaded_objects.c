#include "loaded_objects.h"

#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>

#define MAX_CODE_RANGES 32
#define DRIVER_PATH_MAX 512

/* What the last walk found, valid while the loader's counters are the same. */
static struct {
    bool walked;
    unsigned long long adds, subs;
    bool driver_loaded;
    char driver_path[DRIVER_PATH_MAX];
    size_t range_count;
    uintptr_t ranges[MAX_CODE_RANGES][2];
} cache;
static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;

static const char *base_name(const char *name)
{
    const char *slash = strrchr(name, '/');
    return slash != NULL ? slash + 1 : name;
}

bool loaded_objects_is_cuda_driver_name(const char *name)
{
    return name != NULL && strncmp(base_name(name), "libcuda.so", 10) == 0;
}

bool loaded_objects_is_cuda_library_name(const char *name)
{
    if (name == NULL)
        return false;
    const char *base = base_name(name);
    return loaded_objects_is_cuda_driver_name(base) || strstr(base, "cudart") != NULL ||
           strncmp(base, "libnvidia-", 10) == 0;
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
    if (!loaded_objects_is_cuda_library_name(name))
        return 0;
    if (loaded_objects_is_cuda_driver_name(name) && !cache.driver_loaded) {
        cache.driver_loaded = true;
        size_t length = strlen(name);
        if (length >= sizeof(cache.driver_path))
            length = 0; /* too long to keep: found by its soname instead */
        memcpy(cache.driver_path, name, length);
        cache.driver_path[length] = '\0';
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
    cache.driver_loaded = false;
    cache.driver_path[0] = '\0';
    cache.range_count = 0;
    struct walk full = {.counters_only = false};
    dl_iterate_phdr(visit, &full);
    cache.adds = walk.adds;
    cache.subs = walk.subs;
    cache.walked = true;
}

bool loaded_objects_cuda_driver(char *path, size_t path_size)
{
    pthread_mutex_lock(&cache_mutex);
    refresh_locked();
    bool loaded = cache.driver_loaded;
    if (loaded && path != NULL && path_size > 0) {
        size_t length = strlen(cache.driver_path);
        if (length >= path_size)
            length = 0;
        memcpy(path, cache.driver_path, length);
        path[length] = '\0';
    }
    pthread_mutex_unlock(&cache_mutex);
    return loaded;
}

bool loaded_objects_in_cuda_library(uintptr_t address)
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
