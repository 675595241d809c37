/* nvtx_recorder: an NVTX tool of the tests' own (a test double of Nsight
 * Systems' injection library, never shipped). NVTX loads it through its
 * documented interface: NVTX_INJECTION64_PATH names it, NVTX calls its
 * InitializeInjectionNvtx2, and it asks NVTX's export table for the core2
 * callbacks (domains and push/pop ranges), which it fills with its own.
 * Every domain created, range pushed and range popped becomes one line in
 * the file NVTX_RECORDER_LOG names (appended with write(2), no allocation):
 *
 *   load <pid>
 *   domain <name>
 *   push <domain> <tid> <message>
 *   pop <domain> <tid>
 */
#include <nvtx3/nvToolsExt.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DOMAINS 16

struct recorded_domain {
    char name[64];
};

static struct recorded_domain domains[MAX_DOMAINS];
static int domain_count;
static int log_fd = -1;

static void record(const char *line)
{
    if (log_fd >= 0) {
        ssize_t ignored = write(log_fd, line, strlen(line));
        (void)ignored;
    }
}

static const char *domain_name(nvtxDomainHandle_t domain)
{
    struct recorded_domain *recorded = (struct recorded_domain *)domain;
    return recorded != NULL ? recorded->name : "(default)";
}

static nvtxDomainHandle_t create_domain(const char *name)
{
    int index = __atomic_fetch_add(&domain_count, 1, __ATOMIC_RELAXED);
    if (index >= MAX_DOMAINS)
        return NULL;
    snprintf(domains[index].name, sizeof(domains[index].name), "%s", name);
    char line[128];
    snprintf(line, sizeof(line), "domain %s\n", name);
    record(line);
    return (nvtxDomainHandle_t)&domains[index];
}

static int push_range(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attributes)
{
    char line[320];
    const char *message = attributes != NULL && attributes->messageType == NVTX_MESSAGE_TYPE_ASCII
                              ? attributes->message.ascii
                              : "(no ascii message)";
    snprintf(line, sizeof(line), "push %s %ld %s\n", domain_name(domain), (long)syscall(SYS_gettid),
             message);
    record(line);
    return 0;
}

static int pop_range(nvtxDomainHandle_t domain)
{
    char line[128];
    snprintf(line, sizeof(line), "pop %s %ld\n", domain_name(domain), (long)syscall(SYS_gettid));
    record(line);
    return 0;
}

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    const char *path = getenv("NVTX_RECORDER_LOG");
    if (path != NULL)
        log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    char line[64];
    snprintf(line, sizeof(line), "load %ld\n", (long)getpid());
    record(line);
    const NvtxExportTableCallbacks *callbacks =
        (const NvtxExportTableCallbacks *)get_export_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (callbacks == NULL ||
        !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
        size <= NVTX_CBID_CORE2_DomainRangePop)
        return 0;
    *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)create_domain;
    *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push_range;
    *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop_range;
    return 1;
}
