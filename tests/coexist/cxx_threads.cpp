// Eight std::threads that grow vectors (operator new/delete through the
// allocator) while they lock and unlock aligned buffers: 40 posix_memalign
// buffers each, locked, unlocked and freed, and 40 buffers from aligned
// operator new[], locked and deleted while still locked. Prints per-thread
// checksums of the data, which do not depend on where anything was allocated.
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <thread>
#include <vector>

namespace
{

constexpr int kThreads = 8;
constexpr int kRounds = 40;
constexpr std::size_t kAlignment = 4096;

struct ThreadResult {
    std::uint64_t vector_sum = 0;
    std::uint64_t buffer_sum = 0;
    int failures = 0;
};

std::uint32_t next_random(std::uint32_t &state)
{
    state = state * 1664525u + 1013904223u;
    return state >> 8;
}

std::uint64_t fill_and_sum(unsigned char *data, std::size_t size, std::uint32_t seed)
{
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < size; i += 512) {
        data[i] = static_cast<unsigned char>(seed + i / 512);
        sum += data[i];
    }
    return sum;
}

void work(int index, ThreadResult &result)
{
    std::uint32_t state = 12345u + static_cast<std::uint32_t>(index);
    for (int round = 0; round < kRounds; round++) {
        std::vector<std::uint32_t> values;
        std::size_t count = 1000 + next_random(state) % 20000;
        for (std::size_t i = 0; i < count; i++)
            values.push_back(next_random(state) % 1000);
        for (std::uint32_t value : values)
            result.vector_sum += value;

        std::size_t size = (64 + next_random(state) % 960) * 1024;
        void *memory = nullptr;
        if (posix_memalign(&memory, kAlignment, size) != 0) {
            result.failures++;
            continue;
        }
        auto *buffer = static_cast<unsigned char *>(memory);
        if (mlock(buffer, size) != 0)
            result.failures++;
        result.buffer_sum += fill_and_sum(buffer, size, state);
        if (munlock(buffer, size) != 0)
            result.failures++;
        free(buffer);

        std::size_t aligned_size = (64 + next_random(state) % 960) * 1024;
        auto *aligned = static_cast<unsigned char *>(
            ::operator new[](aligned_size, std::align_val_t(kAlignment)));
        if (mlock(aligned, aligned_size) != 0)
            result.failures++;
        result.buffer_sum += fill_and_sum(aligned, aligned_size, state);
        // Deleted while locked: the kernel drops the lock with the memory.
        ::operator delete[](aligned, std::align_val_t(kAlignment));
    }
}

} // namespace

int main()
{
    std::vector<ThreadResult> results(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; i++)
        threads.emplace_back(work, i, std::ref(results[static_cast<std::size_t>(i)]));
    for (auto &thread : threads)
        thread.join();
    int failures = 0;
    for (int i = 0; i < kThreads; i++) {
        const ThreadResult &result = results[static_cast<std::size_t>(i)];
        std::printf("thread %d vectors %llu buffers %llu\n", i,
                    static_cast<unsigned long long>(result.vector_sum),
                    static_cast<unsigned long long>(result.buffer_sum));
        failures += result.failures;
    }
    if (failures != 0)
        std::fprintf(stderr, "%d lock calls failed: %s\n", failures, std::strerror(errno));
    return failures == 0 ? 0 : 1;
}
