#include "internal_alloc.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define POOL_CHUNK_BYTES (1u << 20)
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *internal_map(size_t bytes)
{
    int saved_errno = errno;
    long result = syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (result == -1) {
        errno = saved_errno;
        return NULL;
    }
    /* Large tables (the registry's hash table at many ranges) are read at random:
     * huge pages spare a TLB miss per lookup where THP is left to madvise. */
    if (bytes >= HUGE_PAGE_BYTES)
        syscall(SYS_madvise, result, bytes, MADV_HUGEPAGE);
    errno = saved_errno;
    return (void *)result;
}

void internal_unmap(void *memory, size_t bytes)
{
    if (memory == NULL)
        return;
    int saved_errno = errno;
    syscall(SYS_munmap, memory, bytes);
    errno = saved_errno;
}

void node_pool_init(struct node_pool *pool, size_t node_size)
{
    memset(pool, 0, sizeof(*pool));
    /* Keep nodes pointer-aligned and big enough to hold the free-list link. */
    size_t align = sizeof(void *) * 2;
    pool->node_size = (node_size + align - 1) / align * align;
}

/* A new chunk for the bump allocator; what was left of the old one goes onto
 * the free list first. */
static bool add_chunk(struct node_pool *pool)
{
    size_t chunk_bytes = POOL_CHUNK_BYTES;
    if (chunk_bytes < pool->node_size + 64)
        chunk_bytes = (pool->node_size + 64 + 4095) & ~(size_t)4095;
    char *chunk = internal_map(chunk_bytes);
    if (chunk == NULL)
        return false;
    while (pool->bump_left >= pool->node_size) {
        *(void **)pool->bump = pool->free_list;
        pool->free_list = pool->bump;
        pool->free_count++;
        pool->bump += pool->node_size;
        pool->bump_left -= pool->node_size;
    }
    /* The chunk header records the link and the size for destroy. */
    ((void **)chunk)[0] = pool->chunks;
    ((size_t *)chunk)[1] = chunk_bytes;
    pool->chunks = chunk;
    pool->bump = chunk + 64;
    pool->bump_left = chunk_bytes - 64;
    return true;
}

void *node_pool_get(struct node_pool *pool)
{
    if (pool->free_list != NULL) {
        void *node = pool->free_list;
        pool->free_list = *(void **)node;
        pool->free_count--;
        memset(node, 0, pool->node_size);
        return node;
    }
    if (pool->bump_left < pool->node_size && !add_chunk(pool))
        return NULL;
    void *node = pool->bump;
    pool->bump += pool->node_size;
    pool->bump_left -= pool->node_size;
    return node; /* fresh mappings are zero-filled */
}

bool node_pool_reserve(struct node_pool *pool, size_t count)
{
    if (pool->free_count + pool->bump_left / pool->node_size >= count)
        return true;
    return add_chunk(pool);
}

void node_pool_put(struct node_pool *pool, void *node)
{
    if (node == NULL)
        return;
    *(void **)node = pool->free_list;
    pool->free_list = node;
    pool->free_count++;
}

void node_pool_destroy(struct node_pool *pool)
{
    char *chunk = pool->chunks;
    while (chunk != NULL) {
        char *next = ((void **)chunk)[0];
        internal_unmap(chunk, ((size_t *)chunk)[1]);
        chunk = next;
    }
    size_t node_size = pool->node_size;
    memset(pool, 0, sizeof(*pool));
    pool->node_size = node_size;
}
