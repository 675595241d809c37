/* lock_latency --deepspeed (lock_latency_deepspeed.c): DeepSpeed's native
 * pinning with and without the shim's huge pages. */
#ifndef PINSHIM_BENCH_LOCK_LATENCY_DEEPSPEED_H
#define PINSHIM_BENCH_LOCK_LATENCY_DEEPSPEED_H

#include <stdbool.h>
#include <stddef.h>

/* The parent: argv as lock_latency got it; shim: libpinshim.so's path. */
int lock_latency_deepspeed_main(int argc, char **argv, const char *shim);
/* The children: one locked buffer; a warm-up of huge pages. */
int lock_latency_deepspeed_child(size_t bytes, bool advise);
int lock_latency_warm_up_child(size_t bytes);
/* 32 buffers written sparsely: what the alignment adds. */
int lock_latency_memory_child(size_t bytes);

#endif
