#include "stats.h"

#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define OUT_BUFFER_BYTES 4096 /* written out when full: a few writes per document */

struct out_buffer {
    int fd;
    size_t used;
    bool failed;
    char data[OUT_BUFFER_BYTES];
};

static void out_flush(struct out_buffer *out)
{
    if (!out->failed && !write_fully(out->fd, out->data, out->used))
        out->failed = true;
    out->used = 0;
}

static void out_bytes(struct out_buffer *out, const char *text, size_t length)
{
    while (length > 0) {
        if (out->used == sizeof(out->data))
            out_flush(out);
        size_t room = sizeof(out->data) - out->used;
        size_t take = length < room ? length : room;
        memcpy(out->data + out->used, text, take);
        out->used += take;
        text += take;
        length -= take;
    }
}

static void out_text(struct out_buffer *out, const char *text)
{
    out_bytes(out, text, strlen(text));
}

__attribute__((format(printf, 2, 3))) static void out_format(struct out_buffer *out,
                                                             const char *format, ...)
{
    char line[512];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line, sizeof(line), format, args);
    va_end(args);
    if (n > 0)
        out_bytes(out, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

static void out_json_string(struct out_buffer *out, const char *text)
{
    if (text == NULL) {
        out_text(out, "null");
        return;
    }
    out_text(out, "\"");
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        char escaped[8];
        switch (*c) {
        case '"':
            out_text(out, "\\\"");
            break;
        case '\\':
            out_text(out, "\\\\");
            break;
        case '\n':
            out_text(out, "\\n");
            break;
        case '\t':
            out_text(out, "\\t");
            break;
        case '\r':
            out_text(out, "\\r");
            break;
        default:
            if (*c < 0x20) {
                snprintf(escaped, sizeof(escaped), "\\u%04x", *c);
                out_text(out, escaped);
            } else {
                out_bytes(out, (const char *)c, 1);
            }
        }
    }
    out_text(out, "\"");
}

static void out_key_u64(struct out_buffer *out, const char *key, uint64_t value, bool last)
{
    out_format(out, "\"%s\": %llu%s", key, (unsigned long long)value, last ? "" : ", ");
}

static double seconds(uint64_t nanoseconds)
{
    return (double)nanoseconds / 1e9;
}

static void write_numa_json(struct out_buffer *out, const struct stats_report *report);
static void write_huge_pages_json(struct out_buffer *out, const struct stats_report *report);

bool stats_write_json(int fd, const struct stats_report *report)
{
    struct out_buffer out = {.fd = fd};
    const struct pinshim_counters *c = &report->counters;
    out_text(&out, "{\"pinshim\": ");
    out_json_string(&out, PINSHIM_VERSION_STRING);
    out_format(&out, ", \"pid\": %ld, \"host\": ", report->pid);
    out_json_string(&out, report->host);
    out_text(&out, ", \"exe\": ");
    out_json_string(&out, report->exe);
    out_format(&out, ", \"fork_child\": %s", report->fork_child ? "true" : "false");
    if (report->ended_by != NULL) {
        out_text(&out, ", \"ended_by\": ");
        out_json_string(&out, report->ended_by);
    }
    if (report->block_size_source != NULL) {
        out_text(&out, ", \"block_size_source\": ");
        out_json_string(&out, report->block_size_source);
    }

    out_text(&out, ",\n \"config\": {");
    for (int i = 0; i < OPT_COUNT; i++) {
        char value[CONFIG_PATH_MAX];
        config_format_value(report->config, (enum option_id)i, value, sizeof(value));
        out_json_string(&out, option_table[i].env_name + sizeof("PINSHIM_") - 1);
        out_text(&out, ": ");
        if (i == OPT_MIN_BYTES || i == OPT_MAX_REGISTRATION || i == OPT_FORK_WARN)
            out_text(&out, value);
        else
            out_json_string(&out, value);
        if (i + 1 < OPT_COUNT)
            out_text(&out, ", ");
    }

    out_format(&out,
               "},\n \"cudart\": {\"loaded\": %s, \"usable\": %s, \"shared_with_program\": %s, "
               "\"path\": ",
               report->runtime_loaded ? "true" : "false", report->runtime_usable ? "true" : "false",
               report->runtime_shared ? "true" : "false");
    out_json_string(&out, report->runtime_path);
    out_text(&out, ", \"error\": ");
    out_json_string(&out, report->runtime_error);
    out_text(&out, ", \"passed_over\": [");
    for (size_t i = 0; i < report->runtime_try_count; i++) {
        out_text(&out, i ? ", {\"runtime\": " : "{\"runtime\": ");
        out_json_string(&out, report->runtime_tries[i].name);
        out_text(&out, ", \"why\": ");
        out_json_string(&out, report->runtime_tries[i].result);
        out_text(&out, "}");
    }
    out_text(&out, "]");

    out_text(&out, "},\n \"context\": {\"mode\": ");
    char mode[16];
    config_format_value(report->config, OPT_CONTEXT, mode, sizeof(mode));
    out_json_string(&out, mode);
    out_text(&out, ", \"driver\": ");
    out_json_string(&out, report->driver_path);
    out_format(&out, ", \"contexts_created\": %llu}", (unsigned long long)report->contexts_created);
    out_text(&out, ",\n \"accelerator\": {\"vendor\": ");
    out_json_string(&out, report->vendor);
    out_text(&out, ", \"title\": ");
    out_json_string(&out, report->vendor_title);
    out_text(&out, ", \"register_call\": ");
    out_json_string(&out, report->register_call);
    out_text(&out, ", \"unregister_call\": ");
    out_json_string(&out, report->unregister_call);
    out_text(&out, ", \"library\": ");
    out_json_string(&out, report->driver_path != NULL ? report->driver_path : report->runtime_path);
    out_text(&out, "}");
    out_text(&out, ",\n \"devices\": [");
    bool first_device = true;
    for (size_t i = 0; i < report->device_count; i++) {
        if (report->devices[i].registrations == 0)
            continue;
        out_format(&out, "%s{\"device\": %zu, \"registrations\": %llu, \"bytes\": %llu}",
                   first_device ? "" : ", ", i,
                   (unsigned long long)report->devices[i].registrations,
                   (unsigned long long)report->devices[i].bytes);
        first_device = false;
    }
    out_text(&out, "]");
    if (report->numa)
        write_numa_json(&out, report);
    write_huge_pages_json(&out, report);

    out_text(&out, ",\n \"register\": {");
    out_key_u64(&out, "ok", c->register_ok, false);
    out_key_u64(&out, "failed", c->register_failed, false);
    out_key_u64(&out, "already_registered", c->register_already_registered, false);
    out_key_u64(&out, "skipped_small", c->register_skipped_small, false);
    out_key_u64(&out, "skipped_no_runtime", report->skipped_disabled, false);
    out_key_u64(&out, "skipped_runtime_library", report->skipped_runtime_library, false);
    out_key_u64(&out, "by_pieces", report->registered_by_pieces, false);
    out_key_u64(&out, "read_only", report->read_only_registrations, false);
    out_key_u64(&out, "skipped_read_only_unsupported", report->skipped_read_only_unsupported,
                false);
    out_key_u64(&out, "skipped_io", report->skipped_io, false);
    out_key_u64(&out, "skipped_no_access", report->skipped_no_access, false);
    out_key_u64(&out, "skipped_shared_file", report->skipped_shared_file, false);
    out_key_u64(&out, "skipped_unmapped", report->skipped_unmapped, false);
    out_key_u64(&out, "skipped_address", report->skipped_address, false);
    out_key_u64(&out, "skipped_onfault_pages", report->skipped_onfault_pages, false);
    out_key_u64(&out, "bytes", c->register_bytes, false);
    out_format(&out, "\"seconds\": %.6f", seconds(c->register_nanoseconds));

    out_text(&out, "},\n \"unregister\": {");
    out_key_u64(&out, "ok", c->unregister_ok, false);
    out_key_u64(&out, "failed", c->unregister_failed, false);
    out_key_u64(&out, "munlock", c->unregister_munlock, false);
    out_key_u64(&out, "free", c->unregister_free, false);
    out_key_u64(&out, "realloc", c->unregister_realloc, false);
    out_key_u64(&out, "munmap", c->unregister_munmap, false);
    out_key_u64(&out, "mremap", c->unregister_mremap, false);
    out_key_u64(&out, "mmap_fixed", c->unregister_mmap_fixed, false);
    out_key_u64(&out, "exit", c->unregister_exit, false);
    out_key_u64(&out, "program", c->unregister_program, false);
    out_key_u64(&out, "mprotect", c->unregister_mprotect, false);
    out_key_u64(&out, "join", c->unregister_join, false);
    out_key_u64(&out, "exit_unloading", report->exit_unloading, false);
    out_key_u64(&out, "gone", report->gone_with_context, false);
    out_format(&out, "\"seconds\": %.6f", seconds(c->unregister_nanoseconds));

    out_text(&out, "},\n \"runs\": {");
    out_key_u64(&out, "joined", report->runs_joined, false);
    out_key_u64(&out, "join_failed", report->join_failed, false);
    out_key_u64(&out, "chunked", report->runs_chunked, false);
    out_key_u64(&out, "held_ranges_at_exit", report->held_ranges_at_exit, false);
    out_key_u64(&out, "held_bytes_at_exit", report->held_bytes_at_exit, true);

    out_text(&out, "},\n \"deferred\": {");
    out_key_u64(&out, "ranges", report->deferred_total, false);
    out_key_u64(&out, "registered_later", report->deferred_registered, false);
    out_key_u64(&out, "dropped", report->deferred_dropped, false);
    out_key_u64(&out, "pending_ranges_at_exit", report->pending_ranges_at_exit, false);
    out_key_u64(&out, "pending_bytes_at_exit", report->pending_bytes_at_exit, true);

    out_text(&out, "},\n \"thread\": {");
    out_key_u64(&out, "queued_at_exit", report->queued_ranges_at_exit, false);
    out_key_u64(&out, "cancelled", report->cancelled_queued, false);
    out_format(&out, "\"wait_seconds\": %.6f, \"background_seconds\": %.6f",
               seconds(report->wait_nanoseconds), seconds(report->background_nanoseconds));

    out_text(&out, "},\n \"program\": {");
    out_key_u64(&out, "registrations", c->program_registrations, false);
    out_key_u64(&out, "unregistrations", report->program_unregistrations, false);
    out_key_u64(&out, "handed_over", report->program_handed_over, false);
    out_key_u64(&out, "kept", report->program_kept, false);
    out_key_u64(&out, "taken_back", report->program_took_back, true);

    out_text(&out, "},\n \"calls\": {");
    out_key_u64(&out, "lock", c->lock_calls, false);
    out_key_u64(&out, "unlock", c->unlock_calls, false);
    out_key_u64(&out, "mlockall", c->mlockall_calls, true);

    out_text(&out, "},\n \"live\": {");
    out_key_u64(&out, "ranges", report->live_ranges_at_exit, false);
    out_key_u64(&out, "bytes", report->live_bytes_at_exit, false);
    out_key_u64(&out, "peak_bytes", c->peak_bytes, true);

    out_format(&out, "},\n \"warnings\": %llu", (unsigned long long)report->warnings);
    out_text(&out, ",\n \"errors\": {");
    for (size_t i = 0; i < report->error_count; i++) {
        out_json_string(&out, report->errors[i].name);
        out_format(&out, ": %llu%s", (unsigned long long)report->errors[i].count,
                   i + 1 < report->error_count ? ", " : "");
    }
    out_text(&out, "}}\n");
    out_flush(&out);
    return !out.failed;
}

/* "numa": bytes registered by node (and local to their device), remote and
 * unknown bytes, the node of each device used. */
static void write_numa_json(struct out_buffer *out, const struct stats_report *report)
{
    out_text(out, ",\n \"numa\": {\"nodes\": {");
    bool first = true;
    for (int node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++) {
        if (report->numa_nodes[node].bytes == 0)
            continue;
        out_format(out, "%s\"%d\": {\"bytes\": %llu, \"local_bytes\": %llu}", first ? "" : ", ",
                   node, (unsigned long long)report->numa_nodes[node].bytes,
                   (unsigned long long)report->numa_nodes[node].local_bytes);
        first = false;
    }
    out_format(out, "}, \"remote_bytes\": %llu, \"unknown_bytes\": %llu, \"device_nodes\": {",
               (unsigned long long)report->numa_remote_bytes,
               (unsigned long long)report->numa_unknown_bytes);
    first = true;
    for (size_t i = 0; i < report->device_count; i++) {
        if (report->devices[i].registrations == 0)
            continue;
        out_format(out, "%s\"%zu\": %d", first ? "" : ", ", i, report->device_nodes[i]);
        first = false;
    }
    out_text(out, "}}");
}

/* "huge_pages": the option, the kernel's mode, the bytes locked by page size
 * and what the shim did to the chunks of the locks. */
static void write_huge_pages_json(struct out_buffer *out, const struct stats_report *report)
{
    out_text(out, ",\n \"huge_pages\": {\"option\": ");
    out_json_string(out, report->huge_pages_option != NULL ? report->huge_pages_option : "");
    out_text(out, ", \"kernel\": ");
    out_json_string(out, report->huge_pages_kernel != NULL ? report->huge_pages_kernel : "");
    out_format(out,
               ", \"pmd_size\": %llu, \"huge_bytes\": %llu, \"small_bytes\": %llu, "
               "\"unknown_bytes\": %llu, \"made_bytes\": %llu, \"had_pages_bytes\": %llu, "
               "\"no_block_bytes\": %llu, \"refused_bytes\": %llu, \"stopped_bytes\": %llu, "
               "\"aligned_allocations\": %llu, \"backed_off\": %s}",
               (unsigned long long)report->huge_pmd_size, (unsigned long long)report->huge_bytes,
               (unsigned long long)report->small_bytes,
               (unsigned long long)report->page_size_unknown_bytes,
               (unsigned long long)report->huge_made_bytes,
               (unsigned long long)report->huge_had_pages_bytes,
               (unsigned long long)report->huge_no_block_bytes,
               (unsigned long long)report->huge_refused_bytes,
               (unsigned long long)report->huge_stopped_bytes,
               (unsigned long long)report->huge_aligned_allocations,
               report->huge_backed_off ? "true" : "false");
}

/* "pinshim:   huge pages (auto, THP madvise): locked 1.0 GiB on huge pages,
 * 8.0 KiB on small, 0 B of unknown size; made huge 1.0 GiB, ..." */
static void write_huge_pages_text(struct out_buffer *out, const struct stats_report *report)
{
    char huge[32], small[32], unknown[32], made[32], had_pages[32], no_block[32], refused[32],
        stopped[32];
    log_format_bytes(report->huge_bytes, huge, sizeof(huge));
    log_format_bytes(report->small_bytes, small, sizeof(small));
    log_format_bytes(report->page_size_unknown_bytes, unknown, sizeof(unknown));
    log_format_bytes(report->huge_made_bytes, made, sizeof(made));
    log_format_bytes(report->huge_had_pages_bytes, had_pages, sizeof(had_pages));
    log_format_bytes(report->huge_no_block_bytes, no_block, sizeof(no_block));
    log_format_bytes(report->huge_refused_bytes, refused, sizeof(refused));
    log_format_bytes(report->huge_stopped_bytes, stopped, sizeof(stopped));
    out_format(out,
               "pinshim:   huge pages (%s, THP %s): locked %s on huge pages, %s on small, %s of "
               "unknown size; made huge by the shim %s, left alone with pages %s, left small "
               "for want of free blocks %s, refused by the kernel %s, after a slow batch %s; "
               "%llu allocation(s) aligned%s\n",
               report->huge_pages_option != NULL ? report->huge_pages_option : "?",
               report->huge_pages_kernel != NULL ? report->huge_pages_kernel : "?", huge, small,
               unknown, made, had_pages, no_block, refused, stopped,
               (unsigned long long)report->huge_aligned_allocations,
               report->huge_backed_off ? "; stopped by a slow batch" : "");
}

/* "pinshim:   numa: node 0 12.0 MiB (12.0 MiB local), node 1 4.0 MiB (0 B
 * local); remote 4.0 MiB, node unknown 0 B" */
static void write_numa_text(struct out_buffer *out, const struct stats_report *report)
{
    out_text(out, "pinshim:   numa:");
    bool any = false;
    for (int node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++) {
        if (report->numa_nodes[node].bytes == 0)
            continue;
        char bytes[32], local[32];
        log_format_bytes(report->numa_nodes[node].bytes, bytes, sizeof(bytes));
        log_format_bytes(report->numa_nodes[node].local_bytes, local, sizeof(local));
        out_format(out, "%s node %d %s (%s local)", any ? "," : "", node, bytes, local);
        any = true;
    }
    char remote[32], unknown[32];
    log_format_bytes(report->numa_remote_bytes, remote, sizeof(remote));
    log_format_bytes(report->numa_unknown_bytes, unknown, sizeof(unknown));
    out_format(out, "%s remote %s, node unknown %s\n", any ? ";" : "", remote, unknown);
}

bool stats_write_text(int fd, const struct stats_report *report)
{
    struct out_buffer out = {.fd = fd};
    const struct pinshim_counters *c = &report->counters;
    char registered[32], live[32], peak[32];
    log_format_bytes(c->register_bytes, registered, sizeof(registered));
    log_format_bytes(report->live_bytes_at_exit, live, sizeof(live));
    log_format_bytes(c->peak_bytes, peak, sizeof(peak));
    /* The first line stands alone in a job log of many processes. */
    out_format(&out,
               "pinshim: pid %ld on %s: registered %llu (%s in %.3f s), unregistered %llu, "
               "failed %llu+%llu, live at exit %llu (%s)\n",
               report->pid, report->host, (unsigned long long)c->register_ok, registered,
               seconds(c->register_nanoseconds), (unsigned long long)c->unregister_ok,
               (unsigned long long)c->register_failed, (unsigned long long)c->unregister_failed,
               (unsigned long long)report->live_ranges_at_exit, live);
    bool program_mode = report->config->context_mode == CONTEXT_PROGRAM;
    if (program_mode && report->driver_path != NULL)
        out_format(&out, "pinshim:   context: the program's %s, through %s (%s)\n",
                   report->vendor_title != NULL ? report->vendor_title : "runtime",
                   report->driver_path,
                   report->register_call != NULL ? report->register_call : "?");
    else if (program_mode && report->runtime_error != NULL)
        out_format(&out, "pinshim:   context: none used: %s\n", report->runtime_error);
    else if (program_mode)
        out_text(&out, "pinshim:   context: the program's; the program never had one while "
                       "the shim looked\n");
    else if (report->runtime_usable)
        out_format(&out, "pinshim:   runtime %s%s (%s, %s); %llu context(s) created by the shim\n",
                   report->runtime_path, report->runtime_shared ? " (shared with the program)" : "",
                   report->vendor_title != NULL ? report->vendor_title : "?",
                   report->register_call != NULL ? report->register_call : "?",
                   (unsigned long long)report->contexts_created);
    else if (report->runtime_error != NULL)
        out_format(&out, "pinshim:   runtime not used: %s\n", report->runtime_error);
    else
        out_text(&out, "pinshim:   runtime not loaded (no lock reached PINSHIM_MIN_BYTES)\n");
    if (report->deferred_total != 0 || report->pending_ranges_at_exit != 0) {
        char pending[32];
        log_format_bytes(report->pending_bytes_at_exit, pending, sizeof(pending));
        out_format(&out,
                   "pinshim:   deferred %llu range(s) until the program had a context: %llu "
                   "registered later, %llu released first, %llu (%s) still waiting at exit\n",
                   (unsigned long long)report->deferred_total,
                   (unsigned long long)report->deferred_registered,
                   (unsigned long long)report->deferred_dropped,
                   (unsigned long long)report->pending_ranges_at_exit, pending);
    }
    if (report->background_nanoseconds != 0 || report->queued_ranges_at_exit != 0 ||
        report->cancelled_queued != 0)
        out_format(&out,
                   "pinshim:   thread: %.3f s registering in the background, %.3f s in the "
                   "program's calls; %llu cancelled before registration, %llu queued at exit\n",
                   seconds(report->background_nanoseconds), seconds(report->wait_nanoseconds),
                   (unsigned long long)report->cancelled_queued,
                   (unsigned long long)report->queued_ranges_at_exit);
    if (report->device_count > 0) {
        out_text(&out, "pinshim:   devices:");
        for (size_t i = 0; i < report->device_count; i++) {
            if (report->devices[i].registrations == 0)
                continue;
            char bytes[32];
            log_format_bytes(report->devices[i].bytes, bytes, sizeof(bytes));
            out_format(&out, " %zu: %llu (%s)", i,
                       (unsigned long long)report->devices[i].registrations, bytes);
        }
        out_text(&out, "\n");
    }
    if (report->numa && c->register_bytes != 0)
        write_numa_text(&out, report);
    if (report->huge_bytes + report->small_bytes + report->page_size_unknown_bytes != 0)
        write_huge_pages_text(&out, report);
    if (c->program_registrations != 0 || c->unregister_program != 0)
        out_format(&out,
                   "pinshim:   program: registered %llu range(s) itself (%llu handed over by the "
                   "shim without a call, %llu of the shim's given up first), unregistered %llu "
                   "(%llu kept by the shim without a call, %llu taken back)\n",
                   (unsigned long long)c->program_registrations,
                   (unsigned long long)report->program_handed_over,
                   (unsigned long long)c->unregister_program,
                   (unsigned long long)report->program_unregistrations,
                   (unsigned long long)report->program_kept,
                   (unsigned long long)report->program_took_back);
    out_format(&out,
               "pinshim:   register: %llu already registered by the program, %llu below "
               "min_bytes, %llu with registration off, %llu MLOCK_ONFAULT pages not registered; "
               "peak %s\n",
               (unsigned long long)c->register_already_registered,
               (unsigned long long)c->register_skipped_small,
               (unsigned long long)report->skipped_disabled,
               (unsigned long long)report->skipped_onfault_pages, peak);
    if (report->registered_by_pieces != 0 || report->skipped_runtime_library != 0)
        out_format(&out,
                   "pinshim:   mappings: %llu range(s) registered piece by piece, %llu piece(s) "
                   "READ_ONLY; left out: %llu read-only (no READ_ONLY support), %llu I/O, %llu "
                   "PROT_NONE, %llu shared file, %llu unmapped; %llu lock(s) by CUDA itself\n",
                   (unsigned long long)report->registered_by_pieces,
                   (unsigned long long)report->read_only_registrations,
                   (unsigned long long)report->skipped_read_only_unsupported,
                   (unsigned long long)report->skipped_io,
                   (unsigned long long)report->skipped_no_access,
                   (unsigned long long)report->skipped_shared_file,
                   (unsigned long long)report->skipped_unmapped,
                   (unsigned long long)report->skipped_runtime_library);
    out_format(&out,
               "pinshim:   unregister by munlock %llu, free %llu, realloc %llu, munmap %llu, "
               "mremap %llu, mmap_fixed %llu, mprotect %llu, join %llu, exit %llu (%llu after the "
               "runtime unloaded), %llu found gone\n",
               (unsigned long long)c->unregister_munlock, (unsigned long long)c->unregister_free,
               (unsigned long long)c->unregister_realloc, (unsigned long long)c->unregister_munmap,
               (unsigned long long)c->unregister_mremap,
               (unsigned long long)c->unregister_mmap_fixed,
               (unsigned long long)c->unregister_mprotect, (unsigned long long)c->unregister_join,
               (unsigned long long)c->unregister_exit, (unsigned long long)report->exit_unloading,
               (unsigned long long)report->gone_with_context);
    if (report->runs_joined != 0 || report->join_failed != 0 || report->runs_chunked != 0 ||
        report->held_ranges_at_exit != 0)
        out_format(&out,
                   "pinshim:   runs: %llu registered again whole after they grew or joined, "
                   "%llu refused whole and registered in their old pieces, %llu in chunks; "
                   "%llu range(s) (%llu bytes) locked but held unregistered at exit\n",
                   (unsigned long long)report->runs_joined, (unsigned long long)report->join_failed,
                   (unsigned long long)report->runs_chunked,
                   (unsigned long long)report->held_ranges_at_exit,
                   (unsigned long long)report->held_bytes_at_exit);
    if (report->error_count > 0) {
        out_text(&out, "pinshim:   errors:");
        for (size_t i = 0; i < report->error_count; i++)
            out_format(&out, " %s %llu", report->errors[i].name,
                       (unsigned long long)report->errors[i].count);
        out_text(&out, "\n");
    }
    out_flush(&out);
    return !out.failed;
}

bool stats_expand_path(const char *template_path, long pid, const char *host, char *out,
                       size_t out_size)
{
    size_t used = 0;
    for (const char *c = template_path; *c; c++) {
        char piece[64];
        const char *text = piece;
        if (*c == '%' && c[1] == 'p') {
            snprintf(piece, sizeof(piece), "%ld", pid);
            c++;
        } else if (*c == '%' && c[1] == 'h') {
            text = host;
            c++;
        } else if (*c == '%' && c[1] == '%') {
            text = "%";
            c++;
        } else {
            piece[0] = *c;
            piece[1] = '\0';
        }
        size_t length = strlen(text);
        if (used + length + 1 > out_size)
            return false;
        memcpy(out + used, text, length);
        used += length;
    }
    if (out_size == 0)
        return false;
    out[used] = '\0';
    return true;
}

bool stats_worth_writing(const struct stats_report *report, const struct pinshim_config *config)
{
    if (config->stats_mode == STATS_NONE)
        return false;
    if (config->stats_all)
        return true;
    return report->counters.lock_calls > 0 || report->counters.mlockall_calls > 0 ||
           report->warnings > 0;
}

static uint64_t mix64(uint64_t x)
{
    /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void system_random_fill(void *context, unsigned char *out, size_t length)
{
    (void)context;
    size_t got = 0;
    while (got < length) {
        /* The system call, not glibc's getrandom(), which came in 2.25: the
         * wheels are built for glibc 2.17 (scripts/build-dist). */
        long n = syscall(SYS_getrandom, out + got, length - got, GRND_NONBLOCK);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
        got += (size_t)n;
    }
    if (got == length)
        return;
    /* No getrandom: clocks, pid, a stack and a code address, and a counter.
     * Guessable with effort; O_EXCL|O_NOFOLLOW still refuse whatever is
     * planted at a guessed name, which then only costs another attempt. */
    static uint64_t counter;
    struct timespec realtime = {0}, monotonic = {0};
    clock_gettime(CLOCK_REALTIME, &realtime);
    clock_gettime(CLOCK_MONOTONIC, &monotonic);
    uint64_t state = (uint64_t)realtime.tv_sec * 1000000000ULL + (uint64_t)realtime.tv_nsec;
    state ^= mix64((uint64_t)monotonic.tv_nsec ^ ((uint64_t)getpid() << 32));
    state ^= mix64((uint64_t)(uintptr_t)&state ^ (uint64_t)(uintptr_t)system_random_fill);
    state ^= mix64(__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    for (size_t i = 0; i < length; i++) {
        if (i % 8 == 0)
            state = mix64(state);
        out[i] ^= (unsigned char)(state >> (8 * (i % 8)));
    }
}

const struct stats_random stats_system_random = {.fill = system_random_fill, .context = NULL};

/* The directory part of path ("." when it has none) and where its final name starts. */
static bool split_path(const char *path, char *directory, size_t directory_size, const char **name)
{
    const char *slash = strrchr(path, '/');
    size_t length = slash == NULL ? 1 : (slash == path ? 1 : (size_t)(slash - path));
    if (length >= directory_size)
        return false;
    if (slash == NULL)
        directory[0] = '.';
    else
        memcpy(directory, slash == path ? "/" : path, length);
    directory[length] = '\0';
    *name = slash == NULL ? path : slash + 1;
    return true;
}

#define TEMPORARY_NAME_KEEP 200

static bool temporary_leaf(const char *name, const unsigned char random[STATS_RANDOM_BYTES],
                           char *out, size_t out_size)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    /* 12 bytes, 96 bits, as 16 characters of 6 bits. */
    char letters[STATS_RANDOM_BYTES * 4 / 3 + 1];
    for (size_t i = 0; i < STATS_RANDOM_BYTES / 3; i++) {
        unsigned bits = (unsigned)random[3 * i] << 16 | (unsigned)random[3 * i + 1] << 8 |
                        (unsigned)random[3 * i + 2];
        for (size_t j = 0; j < 4; j++)
            letters[4 * i + j] = alphabet[(bits >> (18 - 6 * j)) & 63];
    }
    letters[sizeof(letters) - 1] = '\0';
    size_t keep = strlen(name);
    if (keep > TEMPORARY_NAME_KEEP)
        keep = TEMPORARY_NAME_KEEP;
    int n = snprintf(out, out_size, ".%.*s.%s.tmp", (int)keep, name, letters);
    return n > 0 && (size_t)n < out_size;
}

bool stats_temporary_name(const char *path, const unsigned char random[STATS_RANDOM_BYTES],
                          char *out, size_t out_size)
{
    char directory[CONFIG_PATH_MAX];
    const char *name;
    char leaf[TEMPORARY_NAME_KEEP + 32];
    if (!split_path(path, directory, sizeof(directory), &name) ||
        !temporary_leaf(name, random, leaf, sizeof(leaf)))
        return false;
    bool root = strcmp(directory, "/") == 0;
    int n = snprintf(out, out_size, "%s/%s", root ? "" : directory, leaf);
    return n > 0 && (size_t)n < out_size;
}

bool stats_write_file(const char *path, const struct stats_report *report, char *why,
                      size_t why_size)
{
    return stats_write_file_using(path, report, &stats_system_random, why, why_size);
}

bool stats_write_file_using(const char *path, const struct stats_report *report,
                            const struct stats_random *random, char *why, size_t why_size)
{
    char directory[CONFIG_PATH_MAX];
    const char *name;
    if (!split_path(path, directory, sizeof(directory), &name)) {
        snprintf(why, why_size, "path too long");
        return false;
    }
    if (name[0] == '\0') {
        snprintf(why, why_size, "%s", strerror(EISDIR));
        return false;
    }
    /* Every step is relative to one descriptor of the directory, so the
     * temporary file and the final name are in the same directory whatever
     * happens to the path meanwhile. */
    int directory_fd = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (directory_fd < 0) {
        snprintf(why, why_size, "%s", strerror(errno));
        return false;
    }
    char temporary[TEMPORARY_NAME_KEEP + 32];
    int fd = -1;
    int attempts = 0;
    while (fd < 0 && attempts < STATS_TEMPORARY_ATTEMPTS) {
        unsigned char bytes[STATS_RANDOM_BYTES] = {0};
        random->fill(random->context, bytes, sizeof(bytes));
        attempts++;
        if (!temporary_leaf(name, bytes, temporary, sizeof(temporary))) {
            errno = ENAMETOOLONG;
            break;
        }
        /* O_EXCL: never opens what is there, a symlink included (EEXIST);
         * O_NOFOLLOW says so again. */
        fd = openat(directory_fd, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int error = errno;
        if (error == EEXIST)
            snprintf(why, why_size, "%s (%d temporary names taken)", strerror(error), attempts);
        else
            snprintf(why, why_size, "%s", strerror(error));
        close(directory_fd);
        return false;
    }
    /* No fsync: rename is enough for readers, and exit should stay cheap. */
    errno = 0;
    bool ok = stats_write_json(fd, report);
    int error = ok ? 0 : (errno != 0 ? errno : EIO);
    if (close(fd) != 0 && error == 0)
        error = errno;
    /* rename replaces whatever is at the final name (a symlink included: the
     * link goes, its target is untouched) and never follows it. */
    if (error == 0 && renameat(directory_fd, temporary, directory_fd, name) != 0)
        error = errno;
    if (error != 0) {
        snprintf(why, why_size, "%s", strerror(error));
        unlinkat(directory_fd, temporary, 0);
    }
    close(directory_fd);
    return error == 0;
}
