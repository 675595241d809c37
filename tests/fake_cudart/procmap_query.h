/* PROCMAP_QUERY (Linux 6.11): one VMA by address, its permissions and its
 * name, without reading the whole of /proc/self/maps (a process with 10,000
 * registrations has 10,000 VMAs). The layout of <linux/fs.h>, declared here
 * because older headers lack it. Used by the fake driver and the model. */
#ifndef FAKE_PROCMAP_QUERY_H
#define FAKE_PROCMAP_QUERY_H

#include <fcntl.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <unistd.h>

struct procmap_query {
    uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
        vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define PROCMAP_QUERY_IOCTL _IOWR('f', 17, struct procmap_query)
#define PROCMAP_QUERY_VMA_READABLE 0x01
#define PROCMAP_QUERY_VMA_WRITABLE 0x02
#define PROCMAP_QUERY_VMA_SHARED 0x08
#define PROCMAP_QUERY_COVERING_OR_NEXT_VMA 0x10

/* *fd open on this process's /proc/self/maps (opened again after a fork: a
 * child must not ask about its parent's address space); -1 if it cannot be. */
static inline int procmap_query_fd(int *fd, pid_t *owner)
{
    if (*fd < 0 || *owner != getpid()) {
        if (*fd >= 0)
            close(*fd);
        *fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        *owner = getpid();
    }
    return *fd;
}

#endif
