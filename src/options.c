#include "options.h"

#include "io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <unistd.h>

/* Register flag names in the order of their bit values (cudaHostRegister*). */
static const struct {
    const char *name;
    unsigned value;
} register_flag_names[] = {
    {"portable", 0x01},
    {"mapped", 0x02},
    {"readonly", 0x08},
};

static void copy_text(char *out, size_t out_size, const char *text)
{
    if (out_size == 0)
        return;
    size_t n = strlen(text);
    if (n >= out_size)
        n = out_size - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

static bool parse_boolean(const char *value, bool *out, char *why, size_t why_size)
{
    static const char *const truthy[] = {"1", "true", "yes", "on"};
    static const char *const falsy[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(value, truthy[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(value, falsy[i]) == 0) {
            *out = false;
            return true;
        }
    }
    copy_text(why, why_size, "not a boolean");
    return false;
}

/* Appends text to out (NUL-terminated), cutting it short if it does not fit. */
static void append_text(char *out, size_t out_size, const char *text)
{
    size_t used = strlen(out);
    if (used < out_size)
        copy_text(out + used, out_size - used, text);
}

static bool parse_register(const char *value, struct pinshim_config *cfg, char *why,
                           size_t why_size)
{
    return parse_boolean(value, &cfg->register_enabled, why, why_size);
}

static bool parse_stats_all(const char *value, struct pinshim_config *cfg, char *why,
                            size_t why_size)
{
    return parse_boolean(value, &cfg->stats_all, why, why_size);
}

bool parse_byte_size(const char *text, uint64_t *out)
{
    if (text == NULL || *text < '0' || *text > '9')
        return false;
    uint64_t value = 0;
    const char *cursor = text;
    while (*cursor >= '0' && *cursor <= '9') {
        unsigned digit = (unsigned)(*cursor - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return false;
        value = value * 10 + digit;
        cursor++;
    }
    unsigned shift = 0;
    switch (*cursor) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        cursor++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        cursor++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        cursor++;
        break;
    default:
        return false;
    }
    if (*cursor != '\0')
        return false;
    if (shift != 0 && value > (UINT64_MAX >> shift))
        return false;
    *out = value << shift;
    return true;
}

static bool parse_min_bytes(const char *value, struct pinshim_config *cfg, char *why,
                            size_t why_size)
{
    uint64_t bytes;
    if (!parse_byte_size(value, &bytes)) {
        copy_text(why, why_size, "not a byte count");
        return false;
    }
    cfg->min_bytes = bytes;
    return true;
}

static bool parse_flags(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    unsigned flags = 0;
    const char *cursor = value;
    if (*cursor == '\0') {
        copy_text(why, why_size, "empty list");
        return false;
    }
    for (;;) {
        const char *comma = strchr(cursor, ',');
        size_t length = comma ? (size_t)(comma - cursor) : strlen(cursor);
        bool known = false;
        if (length == 7 && strncasecmp(cursor, "default", 7) == 0)
            known = true;
        for (size_t i = 0; !known && i < sizeof(register_flag_names) / sizeof(*register_flag_names);
             i++) {
            const char *name = register_flag_names[i].name;
            if (strlen(name) == length && strncasecmp(cursor, name, length) == 0) {
                flags |= register_flag_names[i].value;
                known = true;
            }
        }
        if (!known) {
            snprintf(why, why_size, "unknown flag '%.*s'", (int)(length > 40 ? 40 : length),
                     cursor);
            return false;
        }
        if (comma == NULL)
            break;
        cursor = comma + 1;
    }
    cfg->register_flags = flags;
    return true;
}

static bool parse_cudart(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    if (strlen(value) >= sizeof(cfg->cudart)) {
        copy_text(why, why_size, "path too long");
        return false;
    }
    copy_text(cfg->cudart, sizeof(cfg->cudart), value);
    return true;
}

static bool parse_stats(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    if (*value == '\0' || strcmp(value, "0") == 0) {
        cfg->stats_mode = STATS_NONE;
        return true;
    }
    if (strcmp(value, "1") == 0 || strcasecmp(value, "stderr") == 0) {
        cfg->stats_mode = STATS_TEXT;
        return true;
    }
    if (strlen(value) >= sizeof(cfg->stats_path)) {
        copy_text(why, why_size, "path too long");
        return false;
    }
    for (const char *c = value; *c; c++) {
        if (*c != '%')
            continue;
        c++;
        if (*c != 'p' && *c != 'h' && *c != '%') {
            copy_text(why, why_size, "'%' must be followed by p, h or %");
            return false;
        }
    }
    cfg->stats_mode = STATS_JSON;
    copy_text(cfg->stats_path, sizeof(cfg->stats_path), value);
    return true;
}

static bool parse_live(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    if (*value == '\0' || strcasecmp(value, "auto") == 0) {
        cfg->live_mode = LIVE_AUTO;
        return true;
    }
    if (strcmp(value, "0") == 0 || strcasecmp(value, "off") == 0) {
        cfg->live_mode = LIVE_OFF;
        return true;
    }
    if (value[0] != '/') {
        copy_text(why, why_size, "not auto, off or an absolute directory path");
        return false;
    }
    if (strlen(value) >= sizeof(cfg->live_directory)) {
        copy_text(why, why_size, "path too long");
        return false;
    }
    cfg->live_mode = LIVE_DIRECTORY;
    copy_text(cfg->live_directory, sizeof(cfg->live_directory), value);
    return true;
}

static const char *const log_level_names[] = {"quiet", "warn", "info", "debug"};

static bool parse_log(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(value, log_level_names[i]) == 0) {
            cfg->log_level = (enum log_level)i;
            return true;
        }
    }
    copy_text(why, why_size, "unknown level");
    return false;
}

static bool parse_block_size(const char *value, struct pinshim_config *cfg, char *why,
                             size_t why_size)
{
    if (strcasecmp(value, "auto") == 0 || strcasecmp(value, "allocator") == 0) {
        cfg->block_size_from_allocator = strcasecmp(value, "allocator") == 0;
        return true;
    }
    copy_text(why, why_size, "unknown source");
    return false;
}

/* Finds value (case-insensitive) in names; false when absent. */
static bool parse_name(const char *value, const char *const *names, size_t count, int *out)
{
    for (size_t i = 0; i < count; i++) {
        if (strcasecmp(value, names[i]) == 0) {
            *out = (int)i;
            return true;
        }
    }
    return false;
}

static const char *const context_names[] = {"program", "create"};
static const char *const vendor_names[] = {"auto", "cuda", "hip", "ze"};
static const char *const onfault_names[] = {"resident", "skip", "all"};
static const char *const fork_names[] = {"copy", "dontfork"};
static const char *const huge_pages_names[] = {"auto", "off"};

static bool parse_context(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    int mode;
    if (!parse_name(value, context_names, 2, &mode)) {
        copy_text(why, why_size, "unknown mode");
        return false;
    }
    cfg->context_mode = (enum context_mode)mode;
    return true;
}

static bool parse_vendor(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    int vendor;
    if (!parse_name(value, vendor_names, 4, &vendor)) {
        copy_text(why, why_size, "unknown vendor");
        return false;
    }
    cfg->vendor = (enum vendor_choice)vendor;
    return true;
}

static bool parse_device(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    if (strcasecmp(value, "thread") == 0) {
        cfg->device = -1;
        return true;
    }
    uint64_t device;
    if (!parse_byte_size(value, &device) || strpbrk(value, "kKmMgG") != NULL || device > 4095) {
        copy_text(why, why_size, "not a device ordinal");
        return false;
    }
    cfg->device = (int)device;
    return true;
}

static bool parse_async(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    struct pinshim_config scratch = *cfg;
    if (!parse_register(value, &scratch, why, why_size))
        return false;
    cfg->asynchronous = scratch.register_enabled;
    return true;
}

static bool parse_numa(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    struct pinshim_config scratch = *cfg;
    if (!parse_register(value, &scratch, why, why_size))
        return false;
    cfg->numa = scratch.register_enabled;
    return true;
}

static bool parse_nvtx(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    struct pinshim_config scratch = *cfg;
    if (!parse_register(value, &scratch, why, why_size))
        return false;
    cfg->nvtx = scratch.register_enabled;
    return true;
}

/* The smallest PINSHIM_MAX_REGISTRATION: the smallest page of any Linux host
 * (the engine raises a smaller chunk to one page of the process, and rounds
 * larger ones down to whole pages). */
#define MAX_REGISTRATION_SMALLEST_BYTES 4096

static bool parse_max_registration(const char *value, struct pinshim_config *cfg, char *why,
                                   size_t why_size)
{
    uint64_t bytes;
    if (!parse_byte_size(value, &bytes) || bytes < MAX_REGISTRATION_SMALLEST_BYTES) {
        copy_text(why, why_size, "not a byte count of at least 4K");
        return false;
    }
    cfg->max_registration_bytes = bytes;
    return true;
}

static bool parse_onfault(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    int mode;
    if (!parse_name(value, onfault_names, 3, &mode)) {
        copy_text(why, why_size, "unknown rule");
        return false;
    }
    cfg->onfault = (enum onfault_mode)mode;
    return true;
}

static bool parse_huge_pages(const char *value, struct pinshim_config *cfg, char *why,
                             size_t why_size)
{
    int mode;
    if (!parse_name(value, huge_pages_names, 2, &mode)) {
        copy_text(why, why_size, "unknown mode");
        return false;
    }
    cfg->huge_pages = (enum huge_pages_mode)mode;
    return true;
}

static bool parse_fork(const char *value, struct pinshim_config *cfg, char *why, size_t why_size)
{
    int mode;
    if (!parse_name(value, fork_names, 2, &mode)) {
        copy_text(why, why_size, "unknown mode");
        return false;
    }
    cfg->fork_mode = (enum fork_mode)mode;
    return true;
}

static bool parse_fork_warn(const char *value, struct pinshim_config *cfg, char *why,
                            size_t why_size)
{
    uint64_t bytes;
    if (!parse_byte_size(value, &bytes)) {
        copy_text(why, why_size, "not a byte count");
        return false;
    }
    cfg->fork_warn_bytes = bytes;
    return true;
}

const struct option_spec option_table[OPT_COUNT] = {
    {.id = OPT_REGISTER,
     .env_name = "PINSHIM_REGISTER",
     .cli_name = "no-register",
     .flag_value = "0",
     .accepted = "1/true/yes/on, 0/false/no/off",
     .default_text = "on",
     .help = "Whether locked ranges are registered with the GPU runtime; off (--no-register) "
             "keeps mlock only and never loads a runtime.",
     .parse = parse_register},
    {.id = OPT_MIN_BYTES,
     .env_name = "PINSHIM_MIN_BYTES",
     .cli_name = "min-bytes",
     .cli_argument = "SIZE",
     .accepted = "bytes, or with a K/M/G suffix (powers of 1024)",
     .default_text = "64K",
     .help = "Fewest bytes locked in a run of locked pages for it to be registered (a smaller "
             "lock alone stays locked only, and asks the runtime nothing); posix_memalign "
             "requests of at least this (and of at least 64K) get whole pages.",
     .parse = parse_min_bytes},
    {.id = OPT_FLAGS,
     .env_name = "PINSHIM_FLAGS",
     .cli_name = "flags",
     .cli_argument = "LIST",
     .accepted = "comma list of default, portable, mapped, readonly",
     .default_text = "default",
     .help = "Registration flags, CUDA's and HIP's (the same values; default: mapped and "
             "portable, what cudaHostRegisterDefault means on 64-bit systems); Level Zero's "
             "import takes none.",
     .parse = parse_flags},
    {.id = OPT_CUDART,
     .names_file = true,
     .env_name = "PINSHIM_CUDART",
     .cli_name = "cudart",
     .cli_argument = "LIB",
     .accepted = "path or soname of a CUDA runtime",
     .default_text = "search",
     .help = "With PINSHIM_CONTEXT=create, the runtime to load; the default uses a libcudart "
             "already loaded, else libcudart.so.13, .12, .11, libcudart.so (program mode uses "
             "the driver the program loaded).",
     .parse = parse_cudart},
    {.id = OPT_STATS,
     .names_file = true,
     .env_name = "PINSHIM_STATS",
     .cli_name = "stats",
     .cli_argument = "FILE",
     .accepted = "0, 1 or stderr, or a file path where %p is the pid, %h the host name, %% a "
                 "percent sign",
     .default_text = "0",
     .help = "Statistics at exit, from processes that locked memory or got a warning: a text "
             "summary on stderr, or a JSON document written to a file.",
     .parse = parse_stats},
    {.id = OPT_STATS_ALL,
     .env_name = "PINSHIM_STATS_ALL",
     .cli_name = "stats-all",
     .flag_value = "1",
     .accepted = "1/true/yes/on, 0/false/no/off",
     .default_text = "off",
     .help = "Statistics from every process the shim was loaded in, also those that locked "
             "nothing and got no warning (was the shim loaded at all?).",
     .parse = parse_stats_all},
    {.id = OPT_LOG,
     .env_name = "PINSHIM_LOG",
     .cli_name = "log",
     .cli_argument = "LEVEL",
     .accepted = "quiet, warn, info, debug",
     .default_text = "warn",
     .help = "What is logged on stderr; info logs every registration with its size and time.",
     .parse = parse_log},
    {.id = OPT_BLOCK_SIZE,
     .env_name = "PINSHIM_BLOCK_SIZE",
     .cli_name = "block-size",
     .cli_argument = "SOURCE",
     .accepted = "auto, allocator",
     .default_text = "auto",
     .help = "How free learns a block's size while ranges are registered: auto reads glibc's "
             "chunk header when checks at the first lock show it is safe, allocator always "
             "calls malloc_usable_size.",
     .parse = parse_block_size},
    {.id = OPT_CONTEXT,
     .env_name = "PINSHIM_CONTEXT",
     .cli_name = "context",
     .cli_argument = "MODE",
     .accepted = "program, create",
     .default_text = "program",
     .help = "Where registrations go: program registers through the GPU runtime the program "
             "itself started (CUDA, HIP or Level Zero), into the context it uses, and waits "
             "(deferred) while it has started none, never starting one; create loads and "
             "starts a runtime (PINSHIM_VENDOR) and registers without waiting for the program "
             "(from the locking thread, or the shim's thread with PINSHIM_ASYNC=on), creating a "
             "context if need be.",
     .parse = parse_context},
    {.id = OPT_VENDOR,
     .env_name = "PINSHIM_VENDOR",
     .cli_name = "vendor",
     .cli_argument = "NAME",
     .accepted = "auto, cuda, hip, ze",
     .default_text = "auto",
     .help = "Whose runtime registers: cuda (libcuda, libcudart), hip (libamdhip64) or ze "
             "(Level Zero's libze_loader); auto takes, in program mode, the first of them in "
             "that order that the program started, and in create mode the first that loads and "
             "starts.",
     .parse = parse_vendor},
    {.id = OPT_DEVICE,
     .env_name = "PINSHIM_DEVICE",
     .cli_name = "device",
     .cli_argument = "N",
     .accepted = "a device ordinal, or thread",
     .default_text = "thread",
     .help = "With PINSHIM_CONTEXT=create, the device registrations are made on; thread uses "
             "the locking thread's current device.",
     .parse = parse_device},
    {.id = OPT_ASYNC,
     .env_name = "PINSHIM_ASYNC",
     .cli_name = "async",
     .cli_argument = "BOOL",
     .accepted = "1/true/yes/on, 0/false/no/off",
     .default_text = "off",
     .help = "Whether lock calls return before the pages are registered: off (the default) "
             "registers inside mlock, so a buffer is pinned when mlock returns, as "
             "cudaHostAlloc's and pin_memory()'s are; on returns once the kernel has locked "
             "the pages and a shim thread registers them (pinshim_drain waits for it).",
     .parse = parse_async},
    {.id = OPT_MAX_REGISTRATION,
     .env_name = "PINSHIM_MAX_REGISTRATION",
     .cli_name = "max-registration",
     .cli_argument = "SIZE",
     .accepted = "bytes, or with a K/M/G suffix (powers of 1024), at least 4K",
     .default_text = "64G",
     .help = "The chunks a run of locked pages larger than this is registered in when the "
             "driver refuses it in one call (drivers of the R580 series refuse 512 GiB and "
             "more); a run the driver takes whole is never cut, since a copy across a joint "
             "fails.",
     .parse = parse_max_registration},
    {.id = OPT_ONFAULT,
     .env_name = "PINSHIM_ONFAULT",
     .cli_name = "onfault",
     .cli_argument = "RULE",
     .accepted = "resident, skip, all",
     .default_text = "resident",
     .help = "What mlock2(MLOCK_ONFAULT) registers: resident registers the lock when every "
             "page is resident when it returns, and otherwise holds its run of locked pages "
             "unregistered until a plain lock faults them in; skip holds it always; all "
             "registers the whole range (which faults it all in).",
     .parse = parse_onfault},
    {.id = OPT_FORK,
     .env_name = "PINSHIM_FORK",
     .cli_name = "fork",
     .cli_argument = "MODE",
     .accepted = "copy, dontfork",
     .default_text = "copy",
     .help = "What a fork child gets of registered memory: copy keeps Linux's default (since "
             "5.9 the kernel copies DMA-pinned pages into the child at fork); dontfork marks "
             "registrations MADV_DONTFORK, so children do not get those pages at all.",
     .parse = parse_fork},
    {.id = OPT_FORK_WARN,
     .env_name = "PINSHIM_FORK_WARN",
     .cli_name = "fork-warn",
     .cli_argument = "SIZE",
     .accepted = "bytes, or with a K/M/G suffix (powers of 1024); 0 never warns",
     .default_text = "1G",
     .help = "With PINSHIM_FORK=copy, warn once when a fork happens while at least this much "
             "memory is registered (the kernel copies it into the child).",
     .parse = parse_fork_warn},
    {.id = OPT_LIVE,
     .names_file = true,
     .env_name = "PINSHIM_LIVE",
     .cli_name = "live",
     .cli_argument = "DIR",
     .accepted = "auto, off, or an absolute directory path",
     .default_text = "auto",
     .help = "Where a process that locks memory keeps its live record, the counters in a "
             "small file updated in place, which pinshim top shows and pinshim report reads "
             "when the process was killed: auto is a per-user directory on a memory file "
             "system ($XDG_RUNTIME_DIR/pinshim, else /dev/shm/pinshim-UID, else "
             "/tmp/pinshim-UID); the file goes at a clean exit, and in the auto directory a "
             "killed process's goes when the next process makes its own (a day later when it "
             "names a statistics file).",
     .parse = parse_live},
    {.id = OPT_NUMA,
     .env_name = "PINSHIM_NUMA",
     .cli_name = "numa",
     .cli_argument = "BOOL",
     .accepted = "1/true/yes/on, 0/false/no/off",
     .default_text = "on",
     .help = "Whether each registration's pages are located on NUMA nodes (move_pages(2), "
             "which moves nothing; at most 256 pages asked per registration) and compared with "
             "the node of the GPU they were registered for: bytes per node, local and remote, "
             "in the statistics, and one warning per process when memory is remote.",
     .parse = parse_numa},
    {.id = OPT_NVTX,
     .env_name = "PINSHIM_NVTX",
     .cli_name = "nvtx",
     .cli_argument = "BOOL",
     .accepted = "1/true/yes/on, 0/false/no/off",
     .default_text = "on",
     .help = "Whether each registration, unregistration and wait of a lock call for one is an "
             "NVTX range in the domain pinshim, which Nsight Systems shows on the thread's row; "
             "nothing is loaded or recorded unless a tool is attached (NVTX_INJECTION64_PATH), "
             "and never in secure-execution mode.",
     .parse = parse_nvtx},
    {.id = OPT_HUGE_PAGES,
     .env_name = "PINSHIM_HUGEPAGES",
     .cli_name = "hugepages",
     .cli_argument = "MODE",
     .accepted = "auto, off",
     .default_text = "auto",
     .help = "Whether memory about to be locked goes on transparent huge pages, which pin in "
             "about half the time: with auto, where THP is madvise (Linux 6.1 and later), the "
             "2 MiB-aligned chunks (the kernel's PMD size) of a plain lock's range that have no "
             "page yet are made huge just before it (MADV_COLLAPSE, which leaves the mapping's "
             "flags alone), no more than the kernel has free huge blocks, and aligned "
             "allocations of at least that size are aligned to it; a batch made at under "
             "1 GiB/s stops it for the process; under THP always or never nothing is done.",
     .parse = parse_huge_pages},
};

void config_set_defaults(struct pinshim_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->register_enabled = true;
    cfg->min_bytes = (uint64_t)64 * 1024;
    cfg->register_flags = 0;
    cfg->stats_mode = STATS_NONE;
    cfg->log_level = LOG_WARN;
    cfg->context_mode = CONTEXT_PROGRAM;
    cfg->device = -1;
    cfg->asynchronous = false;
    cfg->max_registration_bytes = (uint64_t)64 << 30;
    cfg->onfault = ONFAULT_RESIDENT;
    cfg->fork_mode = FORK_COPY;
    cfg->fork_warn_bytes = (uint64_t)1 << 30;
    cfg->numa = true;
    cfg->nvtx = true;
}

bool config_secure_execution(void)
{
    return getauxval(AT_SECURE) != 0;
}

int config_load(struct pinshim_config *cfg, config_lookup_fn lookup, void *context,
                bool secure_execution)
{
    config_set_defaults(cfg);
    /* The log level comes first so that PINSHIM_LOG=quiet silences the warnings
     * about the other values too. */
    const char *level = lookup(option_table[OPT_LOG].env_name, context);
    struct pinshim_config level_only;
    char ignored[8];
    log_set_level(level != NULL && parse_log(level, &level_only, ignored, sizeof(ignored))
                      ? level_only.log_level
                      : LOG_WARN);
    int bad = 0;
    /* The options that name files, set but ignored: "A, B" and "A=default, B=default". */
    char ignored_names[256] = "";
    char ignored_defaults[256] = "";
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct option_spec *spec = &option_table[i];
        const char *value = lookup(spec->env_name, context);
        if (value == NULL)
            continue;
        if (secure_execution && spec->names_file) {
            /* An empty value means the default anyway: nothing is ignored. */
            if (value[0] != '\0') {
                bool first = ignored_names[0] == '\0';
                append_text(ignored_names, sizeof(ignored_names), first ? "" : ", ");
                append_text(ignored_names, sizeof(ignored_names), spec->env_name);
                append_text(ignored_defaults, sizeof(ignored_defaults), first ? "" : ", ");
                append_text(ignored_defaults, sizeof(ignored_defaults), spec->env_name);
                append_text(ignored_defaults, sizeof(ignored_defaults), "=");
                append_text(ignored_defaults, sizeof(ignored_defaults), spec->default_text);
            }
            continue;
        }
        char why[96] = "";
        if (!spec->parse(value, cfg, why, sizeof(why))) {
            bad++;
            log_message(LOG_WARN, "%s=\"%.200s\" is not valid (%s); accepted: %s; using %s",
                        spec->env_name, value, why, spec->accepted, spec->default_text);
        }
    }
    if (ignored_names[0] != '\0')
        log_message(LOG_WARN,
                    "secure-execution mode (setuid, setgid or file capabilities): ignoring %s, "
                    "which name files or libraries; using %s",
                    ignored_names, ignored_defaults);
    return bad;
}

const struct option_spec *option_find_by_env(const char *env_name)
{
    for (int i = 0; i < OPT_COUNT; i++)
        if (strcmp(option_table[i].env_name, env_name) == 0)
            return &option_table[i];
    return NULL;
}

const struct option_spec *option_find_by_cli(const char *cli_name)
{
    for (int i = 0; i < OPT_COUNT; i++)
        if (strcmp(option_table[i].cli_name, cli_name) == 0)
            return &option_table[i];
    return NULL;
}

void config_format_value(const struct pinshim_config *cfg, enum option_id id, char *out,
                         size_t out_size)
{
    switch (id) {
    case OPT_REGISTER:
        copy_text(out, out_size, cfg->register_enabled ? "on" : "off");
        break;
    case OPT_MIN_BYTES:
        snprintf(out, out_size, "%llu", (unsigned long long)cfg->min_bytes);
        break;
    case OPT_FLAGS: {
        if (cfg->register_flags == 0) {
            copy_text(out, out_size, "default");
            break;
        }
        size_t used = 0;
        out[0] = '\0';
        for (size_t i = 0; i < sizeof(register_flag_names) / sizeof(*register_flag_names); i++) {
            if (!(cfg->register_flags & register_flag_names[i].value))
                continue;
            int n = snprintf(out + used, out_size - used, "%s%s", used ? "," : "",
                             register_flag_names[i].name);
            if (n < 0 || (size_t)n >= out_size - used)
                break;
            used += (size_t)n;
        }
        break;
    }
    case OPT_CUDART:
        copy_text(out, out_size, cfg->cudart[0] ? cfg->cudart : "search");
        break;
    case OPT_STATS:
        copy_text(out, out_size,
                  cfg->stats_mode == STATS_NONE   ? "0"
                  : cfg->stats_mode == STATS_TEXT ? "stderr"
                                                  : cfg->stats_path);
        break;
    case OPT_STATS_ALL:
        copy_text(out, out_size, cfg->stats_all ? "on" : "off");
        break;
    case OPT_LOG:
        copy_text(out, out_size, log_level_names[cfg->log_level]);
        break;
    case OPT_BLOCK_SIZE:
        copy_text(out, out_size, cfg->block_size_from_allocator ? "allocator" : "auto");
        break;
    case OPT_CONTEXT:
        copy_text(out, out_size, context_names[cfg->context_mode]);
        break;
    case OPT_VENDOR:
        copy_text(out, out_size, vendor_names[cfg->vendor]);
        break;
    case OPT_DEVICE:
        if (cfg->device < 0)
            copy_text(out, out_size, "thread");
        else
            snprintf(out, out_size, "%d", cfg->device);
        break;
    case OPT_ASYNC:
        copy_text(out, out_size, cfg->asynchronous ? "on" : "off");
        break;
    case OPT_MAX_REGISTRATION:
        snprintf(out, out_size, "%llu", (unsigned long long)cfg->max_registration_bytes);
        break;
    case OPT_ONFAULT:
        copy_text(out, out_size, onfault_names[cfg->onfault]);
        break;
    case OPT_FORK:
        copy_text(out, out_size, fork_names[cfg->fork_mode]);
        break;
    case OPT_FORK_WARN:
        snprintf(out, out_size, "%llu", (unsigned long long)cfg->fork_warn_bytes);
        break;
    case OPT_LIVE:
        copy_text(out, out_size,
                  cfg->live_mode == LIVE_AUTO  ? "auto"
                  : cfg->live_mode == LIVE_OFF ? "off"
                                               : cfg->live_directory);
        break;
    case OPT_NUMA:
        copy_text(out, out_size, cfg->numa ? "on" : "off");
        break;
    case OPT_NVTX:
        copy_text(out, out_size, cfg->nvtx ? "on" : "off");
        break;
    case OPT_HUGE_PAGES:
        copy_text(out, out_size, huge_pages_names[cfg->huge_pages]);
        break;
    case OPT_COUNT:
        copy_text(out, out_size, "");
        break;
    }
}

/* Said of every option marked names_file, in --help and the README's table. */
static const char names_file_note[] =
    " Ignored in secure-execution mode (setuid, setgid, file capabilities).";

static void write_all(int fd, const char *text)
{
    write_fully(fd, text, strlen(text));
}

/* Markdown cells may not hold a bare '|'. */
static void write_cell(int fd, const char *text)
{
    char buffer[512];
    size_t used = 0;
    for (const char *c = text; *c && used + 2 < sizeof(buffer); c++) {
        if (*c == '|')
            buffer[used++] = '\\';
        buffer[used++] = *c;
    }
    buffer[used] = '\0';
    write_all(fd, buffer);
}

void options_write_markdown(int fd)
{
    write_all(fd, "| variable | `pinshim` option | values | default | meaning |\n"
                  "|---|---|---|---|---|\n");
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct option_spec *spec = &option_table[i];
        char option[96];
        if (spec->cli_argument)
            snprintf(option, sizeof(option), "`--%s %s`", spec->cli_name, spec->cli_argument);
        else
            snprintf(option, sizeof(option), "`--%s`", spec->cli_name);
        if (spec->id == OPT_STATS)
            snprintf(option, sizeof(option), "`--stats[=%s]`", spec->cli_argument);
        write_all(fd, "| `");
        write_all(fd, spec->env_name);
        write_all(fd, "` | ");
        write_all(fd, option);
        write_all(fd, " | ");
        write_cell(fd, spec->accepted);
        write_all(fd, " | `");
        write_all(fd, spec->default_text);
        write_all(fd, "` | ");
        write_cell(fd, spec->help);
        if (spec->names_file)
            write_cell(fd, names_file_note);
        write_all(fd, " |\n");
    }
}

/* roff: a '-' is a hyphen unless escaped, and a line may not start with '.'
 * or '\''. */
static void write_roff_text(int fd, const char *text)
{
    char buffer[1024];
    size_t used = 0;
    for (const char *c = text; *c && used + 3 < sizeof(buffer); c++) {
        if (*c == '-' || *c == '\\')
            buffer[used++] = '\\';
        buffer[used++] = *c;
    }
    buffer[used] = '\0';
    write_all(fd, buffer);
}

void options_write_man(int fd)
{
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct option_spec *spec = &option_table[i];
        write_all(fd, ".TP\n.B ");
        write_all(fd, spec->env_name);
        write_all(fd, "\nOption:\n");
        if (spec->id == OPT_STATS) {
            write_all(fd, ".BR \\-\\-stats [=\\c\n.IR FILE ]\\c\n\\&.\n");
        } else if (spec->cli_argument != NULL) {
            write_all(fd, ".BI \\-\\-");
            write_roff_text(fd, spec->cli_name);
            write_all(fd, " \" ");
            write_all(fd, spec->cli_argument);
            write_all(fd, "\"\\c\n\\&.\n");
        } else {
            write_all(fd, ".BR \\-\\-");
            write_roff_text(fd, spec->cli_name);
            write_all(fd, " .\n");
        }
        write_all(fd, "Values: ");
        write_roff_text(fd, spec->accepted);
        write_all(fd, ".\nDefault:\n.BR ");
        write_roff_text(fd, spec->default_text);
        write_all(fd, " .\n.br\n");
        write_roff_text(fd, spec->help);
        write_all(fd, "\n");
        if (spec->names_file) {
            write_roff_text(fd, names_file_note + 1);
            write_all(fd, "\n");
        }
    }
}

void options_write_help(int fd)
{
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct option_spec *spec = &option_table[i];
        char line[1024];
        char option[96];
        if (spec->id == OPT_STATS)
            snprintf(option, sizeof(option), "--stats[=%s]", spec->cli_argument);
        else if (spec->cli_argument)
            snprintf(option, sizeof(option), "--%s %s", spec->cli_name, spec->cli_argument);
        else
            snprintf(option, sizeof(option), "--%s", spec->cli_name);
        snprintf(line, sizeof(line), "  %-22s %s%s\n  %-22s   env %s; values: %s; default %s\n",
                 option, spec->help, spec->names_file ? names_file_note : "", "", spec->env_name,
                 spec->accepted, spec->default_text);
        write_all(fd, line);
    }
}
