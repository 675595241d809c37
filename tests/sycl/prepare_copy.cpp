// prepare_copy.cpp - what Intel's SYCL runtime (and the Unified Runtime
// beneath it) answers to prepare_for_device_copy / release_from_device_copy
// on mlock'ed host memory.  Host-only code: built with plain g++ against the
// headers shipped in the intel-sycl-rt wheel, linked to libsycl.so.8 (and
// libur_loader.so.0 for the "ur" mode).  No device compiler is involved.
//
//   prepare_copy sycl   queue{default_selector_v}; mlock 64 MiB;
//                       prepare_for_device_copy / release_from_device_copy
//                       through the queue overloads, then the context ones;
//                       munlock; free.
//   prepare_copy ur     the same through the UR C API directly:
//                       urLoaderInit, urAdapterGet(+GetInfo), urPlatformGet,
//                       urDeviceGet, urContextCreate, urUSMImportExp,
//                       urUSMReleaseExp (what the SYCL calls above call).
//
// Always exits 0 unless something unexpected (an allocation failure) happens;
// every outcome is printed on stdout, one "RESULT ..." line per call.
#include <sycl/sycl.hpp>
#include <ur_api.h>
#include <ur_print.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

static const size_t kSize = 64u << 20;

static const char *envs(const char *n)
{
    const char *v = getenv(n);
    return v ? v : "(unset)";
}

static std::string backend_name(sycl::backend b)
{
    std::ostringstream o;
    o << b;
    return o.str();
}

static void *lock_buffer()
{
    void *p = nullptr;
    int rc = posix_memalign(&p, 4096, kSize);
    if (rc != 0) {
        printf("RESULT posix_memalign: FAILED %s\n", strerror(rc));
        exit(2);
    }
    memset(p, 0x5a, kSize);
    errno = 0;
    rc = mlock(p, kSize);
    printf("RESULT mlock(%p, %zu): %d%s%s\n", p, kSize, rc, rc ? " errno=" : "",
           rc ? strerror(errno) : "");
    fflush(stdout);
    return p;
}

static void unlock_buffer(void *p)
{
    errno = 0;
    int rc = munlock(p, kSize);
    printf("RESULT munlock: %d%s%s\n", rc, rc ? " errno=" : "", rc ? strerror(errno) : "");
    free(p);
    printf("RESULT free: done\n");
    fflush(stdout);
}

template <class F> static void sycl_call(const char *what, F f)
{
    try {
        f();
        printf("RESULT %s: returned normally (success)\n", what);
    } catch (const sycl::exception &e) {
        printf("RESULT %s: sycl::exception code=%d (%s) what=\"%s\"\n", what, e.code().value(),
               e.code().message().c_str(), e.what());
    } catch (const std::exception &e) {
        printf("RESULT %s: std::exception what=\"%s\"\n", what, e.what());
    } catch (...) {
        printf("RESULT %s: unknown exception\n", what);
    }
    fflush(stdout);
}

static int run_sycl()
{
    namespace exp = sycl::ext::oneapi::experimental;
    std::vector<sycl::platform> plats;
    try {
        plats = sycl::platform::get_platforms();
    } catch (const sycl::exception &e) {
        printf("platforms: sycl::exception code=%d what=\"%s\"\n", e.code().value(), e.what());
    }
    printf("platforms: %zu\n", plats.size());
    for (auto &p : plats) {
        try {
            printf("  platform \"%s\" vendor \"%s\" version \"%s\" backend %s\n",
                   p.get_info<sycl::info::platform::name>().c_str(),
                   p.get_info<sycl::info::platform::vendor>().c_str(),
                   p.get_info<sycl::info::platform::version>().c_str(),
                   backend_name(p.get_backend()).c_str());
            for (auto &d : p.get_devices())
                printf("    device \"%s\" driver \"%s\"\n",
                       d.get_info<sycl::info::device::name>().c_str(),
                       d.get_info<sycl::info::device::driver_version>().c_str());
        } catch (const sycl::exception &e) {
            printf("    (query failed: %s)\n", e.what());
        }
    }
    fflush(stdout);

    sycl::queue *q = nullptr;
    try {
        q = new sycl::queue(sycl::default_selector_v);
        auto d = q->get_device();
        printf("queue: device \"%s\" platform \"%s\" backend %s\n",
               d.get_info<sycl::info::device::name>().c_str(),
               d.get_platform().get_info<sycl::info::platform::name>().c_str(),
               backend_name(q->get_backend()).c_str());
    } catch (const sycl::exception &e) {
        printf("queue: none: sycl::exception code=%d (%s) what=\"%s\"\n", e.code().value(),
               e.code().message().c_str(), e.what());
    }
    fflush(stdout);

    void *p = lock_buffer();
    if (q) {
        sycl_call("prepare_for_device_copy(ptr,64MiB,queue)",
                  [&] { exp::prepare_for_device_copy(p, kSize, *q); });
        sycl_call("release_from_device_copy(ptr,queue)",
                  [&] { exp::release_from_device_copy(p, *q); });
        sycl::context c = q->get_context();
        sycl_call("prepare_for_device_copy(ptr,64MiB,context)",
                  [&] { exp::prepare_for_device_copy(p, kSize, c); });
        sycl_call("release_from_device_copy(ptr,context)",
                  [&] { exp::release_from_device_copy(p, c); });
    } else {
        printf("RESULT prepare_for_device_copy: not called (no device)\n");
        printf("RESULT release_from_device_copy: not called (no device)\n");
    }
    unlock_buffer(p);
    delete q;
    printf("exit: 0\n");
    return 0;
}

static std::string urs(ur_result_t r)
{
    std::ostringstream o;
    o << r;
    return o.str();
}

static int run_ur()
{
    ur_result_t r = urLoaderInit(0, nullptr);
    printf("RESULT urLoaderInit: %s\n", urs(r).c_str());
    if (r != UR_RESULT_SUCCESS)
        return 0;
    uint32_t na = 0;
    r = urAdapterGet(0, nullptr, &na);
    printf("urAdapterGet: %s, %u adapter(s)\n", urs(r).c_str(), na);
    std::vector<ur_adapter_handle_t> ads(na);
    if (na)
        urAdapterGet(na, ads.data(), nullptr);

    struct Dev {
        ur_adapter_handle_t a;
        ur_device_handle_t d;
        std::string label;
    };
    std::vector<Dev> devs;
    for (uint32_t i = 0; i < na; i++) {
        ur_backend_t be = UR_BACKEND_UNKNOWN;
        uint32_t ver = 0;
        ur_result_t rb = urAdapterGetInfo(ads[i], UR_ADAPTER_INFO_BACKEND, sizeof be, &be, nullptr);
        ur_result_t rv =
            urAdapterGetInfo(ads[i], UR_ADAPTER_INFO_VERSION, sizeof ver, &ver, nullptr);
        std::ostringstream bo;
        bo << be;
        uint32_t np = 0;
        ur_result_t rp = urPlatformGet(ads[i], 0, nullptr, &np);
        printf("  adapter %u: backend %s (%s) adapter-version %u (%s); "
               "urPlatformGet: %s, %u platform(s)\n",
               i, bo.str().c_str(), urs(rb).c_str(), ver, urs(rv).c_str(), urs(rp).c_str(), np);
        std::vector<ur_platform_handle_t> ps(np);
        if (np)
            urPlatformGet(ads[i], np, ps.data(), nullptr);
        for (uint32_t j = 0; j < np; j++) {
            char name[256] = "?", pver[256] = "?";
            urPlatformGetInfo(ps[j], UR_PLATFORM_INFO_NAME, sizeof name, name, nullptr);
            urPlatformGetInfo(ps[j], UR_PLATFORM_INFO_VERSION, sizeof pver, pver, nullptr);
            uint32_t nd = 0;
            ur_result_t rd = urDeviceGet(ps[j], UR_DEVICE_TYPE_ALL, 0, nullptr, &nd);
            printf("    platform \"%s\" version \"%s\"; urDeviceGet: %s, %u device(s)\n", name,
                   pver, urs(rd).c_str(), nd);
            std::vector<ur_device_handle_t> ds(nd);
            if (nd)
                urDeviceGet(ps[j], UR_DEVICE_TYPE_ALL, nd, ds.data(), nullptr);
            for (uint32_t k = 0; k < nd; k++) {
                char dn[256] = "?";
                urDeviceGetInfo(ds[k], UR_DEVICE_INFO_NAME, sizeof dn, dn, nullptr);
                printf("      device \"%s\"\n", dn);
                if (k == 0)
                    devs.push_back({ads[i], ds[k], bo.str() + " / " + dn});
            }
        }
    }
    fflush(stdout);

    void *p = lock_buffer();
    if (devs.empty())
        printf("RESULT urUSMImportExp: not called (no device)\n");
    for (auto &d : devs) {
        ur_context_handle_t ctx = nullptr;
        r = urContextCreate(1, &d.d, nullptr, &ctx);
        printf("RESULT [%s] urContextCreate: %s\n", d.label.c_str(), urs(r).c_str());
        if (r != UR_RESULT_SUCCESS)
            continue;
        r = urUSMImportExp(ctx, p, kSize);
        printf("RESULT [%s] urUSMImportExp(ptr,64MiB): %s\n", d.label.c_str(), urs(r).c_str());
        r = urUSMReleaseExp(ctx, p);
        printf("RESULT [%s] urUSMReleaseExp(ptr): %s\n", d.label.c_str(), urs(r).c_str());
        urContextRelease(ctx);
        fflush(stdout);
    }
    unlock_buffer(p);
    for (auto a : ads)
        urAdapterRelease(a);
    r = urLoaderTearDown();
    printf("urLoaderTearDown: %s\n", urs(r).c_str());
    printf("exit: 0\n");
    return 0;
}

static void maybe_sleep()
{
    // PREPARE_COPY_SLEEP=N: sleep N seconds before returning from main (to
    // tell a race with exit from a plain failure).
    const char *s = getenv("PREPARE_COPY_SLEEP");
    if (s && atoi(s) > 0) {
        printf("sleeping %d s before exit\n", atoi(s));
        fflush(stdout);
        sleep(atoi(s));
    }
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "sycl";
    printf("prepare_copy mode=%s ONEAPI_DEVICE_SELECTOR=%s LD_PRELOAD=%s "
           "ZE_ENABLE_NULL_DRIVER=%s ZE_ENABLE_ALT_DRIVERS=%s\n",
           mode.c_str(), envs("ONEAPI_DEVICE_SELECTOR"), envs("LD_PRELOAD"),
           envs("ZE_ENABLE_NULL_DRIVER"), envs("ZE_ENABLE_ALT_DRIVERS"));
    fflush(stdout);
    int rc = mode == "ur" ? run_ur() : run_sycl();
    maybe_sleep();
    fflush(stdout);
    return rc;
}
