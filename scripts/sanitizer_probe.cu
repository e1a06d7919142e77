// sanitizer_probe.cu: two shapes of RingKernel's persistent-kernel tests, each on a
// ten-line kernel with no RingKernel code in it, to tell what compute-sanitizer makes of
// them. scripts/gpu-sanitize.sh builds and runs it (nvcc), without and under memcheck.
//
//   late-alloc: a running kernel reads device memory that the host allocated (and
//     filled, and synchronised) after the kernel's launch, its address handed over
//     through mapped host memory. Correct CUDA; memcheck reports the read as out of
//     bounds when the allocation is newer than the launch ("early-alloc", the same
//     program with the allocation made first, is clean: H100, driver 580, 2026-11-27).
//     RingKernel's K2K routes point one running kernel at the inbox of a kernel
//     launched after it.
//   two-kernels: a kernel waits for a flag that a second kernel, launched on another
//     stream while it runs, sets. It finishes without the tool and under memcheck alike
//     (same machine): two live kernels alone do not stall the tool. The probe gives up
//     after 5 s and says so.
//   end-beside: a short kernel finishes on one stream while a kernel on another stream
//     keeps running (until the host releases it, 3 s later). The host waits for the
//     short kernel's stream, first by polling it (cudaStreamQuery), then by
//     cudaStreamSynchronize, and reports how long each took. Without the tool both
//     return at once (0.1 ms); under memcheck neither returns before the other kernel
//     ends (3000 ms; H100, driver 580, 2026-11-27). This is RingKernel's terminate: one
//     persistent kernel ends while others run on, so a test that does so cannot finish
//     under the tool.
//
// Usage: sanitizer_probe late-alloc|early-alloc|two-kernels|end-beside; exit 0 when the
// kernel finished and read the right value (end-beside: when both waits returned before
// the running kernel was released), 1 otherwise.
#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>
#include <cuda_runtime.h>

#define CHECK(x)                                                              \
    do {                                                                      \
        cudaError_t e = (x);                                                  \
        if (e != cudaSuccess) {                                               \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e));               \
            return 1;                                                         \
        }                                                                     \
    } while (0)

struct Mailbox {
    unsigned long long ptr;  // device address to read, 0 until published
    int value;               // what the kernel read
    int done;
};

__global__ void reader(volatile Mailbox* box) {
    unsigned long long p;
    while ((p = box->ptr) == 0) {
    }
    box->value = *(const volatile int*)p;
    __threadfence_system();
    box->done = 1;
}

__global__ void waiter(volatile int* flag, volatile Mailbox* box) {
    while (*flag == 0) {
    }
    box->value = 42;
    __threadfence_system();
    box->done = 1;
}

__global__ void setter(volatile int* flag) { *flag = 1; }

__global__ void spinner(volatile Mailbox* box) {
    while (box->ptr == 0) {
    }
    box->done = 1;
}

__global__ void noop() {}

static bool wait_done(volatile Mailbox* box, double seconds) {
    auto t0 = std::chrono::steady_clock::now();
    while (!box->done) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    Mailbox* box;
    CHECK(cudaHostAlloc((void**)&box, sizeof(Mailbox), cudaHostAllocMapped));
    std::memset(box, 0, sizeof(Mailbox));
    Mailbox* dbox;
    CHECK(cudaHostGetDevicePointer((void**)&dbox, box, 0));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    const int want = 0x5eed;
    bool ok = false;
    if (!std::strcmp(mode, "late-alloc") || !std::strcmp(mode, "early-alloc")) {
        const bool late = mode[0] == 'l';
        int* mem = nullptr;
        if (!late) {
            CHECK(cudaMalloc((void**)&mem, 4096));
            CHECK(cudaMemcpy(mem, &want, sizeof want, cudaMemcpyHostToDevice));
        }
        reader<<<1, 1, 0, s1>>>(dbox);
        CHECK(cudaGetLastError());
        if (late) {
            CHECK(cudaMalloc((void**)&mem, 4096));
            CHECK(cudaMemcpyAsync(mem, &want, sizeof want, cudaMemcpyHostToDevice, s2));
            CHECK(cudaStreamSynchronize(s2));
        }
        *(volatile unsigned long long*)&box->ptr = (unsigned long long)mem;
        ok = wait_done(box, 5.0) && box->value == want;
        std::printf("%s: kernel %s, read %#x (want %#x)\n", mode, box->done ? "finished" : "did not finish",
                    box->value, want);
        if (ok) CHECK(cudaStreamSynchronize(s1));
    } else if (!std::strcmp(mode, "two-kernels")) {
        int* flag;
        CHECK(cudaMalloc((void**)&flag, sizeof(int)));
        // One launch of setter first: with lazy module loading (CUDA's default) a kernel's
        // first launch loads it, which waits for the kernels running, here the waiter,
        // for ever (RingKernel loads its modules before launching persistent kernels).
        setter<<<1, 1, 0, s2>>>(flag);
        CHECK(cudaGetLastError());
        CHECK(cudaMemset(flag, 0, sizeof(int)));
        CHECK(cudaDeviceSynchronize());  // the zero lands before either kernel runs
        waiter<<<1, 1, 0, s1>>>(flag, dbox);
        CHECK(cudaGetLastError());
        setter<<<1, 1, 0, s2>>>(flag);
        CHECK(cudaGetLastError());
        ok = wait_done(box, 5.0) && box->value == 42;
        std::printf("two-kernels: the waiting kernel %s\n",
                    box->done ? "saw the second kernel's flag" : "never saw the flag within 5 s (launches serialised)");
        if (ok) CHECK(cudaDeviceSynchronize());
    } else if (!std::strcmp(mode, "end-beside")) {
        noop<<<1, 1, 0, s2>>>();  // loaded before anything runs (see two-kernels)
        CHECK(cudaDeviceSynchronize());
        spinner<<<1, 1, 0, s1>>>(dbox);
        CHECK(cudaGetLastError());
        noop<<<1, 1, 0, s2>>>();
        CHECK(cudaGetLastError());
        using clk = std::chrono::steady_clock;
        const auto t0 = clk::now();
        auto ms = [&] { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); };
        const double release_ms = 3000.0;
        std::thread release([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds((int)release_ms));
            *(volatile unsigned long long*)&box->ptr = 1;
        });
        cudaError_t q;
        while ((q = cudaStreamQuery(s2)) == cudaErrorNotReady) {
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        const double query_ms = ms();
        CHECK(q);
        CHECK(cudaStreamSynchronize(s2));
        const double sync_ms = ms();
        release.join();
        CHECK(cudaStreamSynchronize(s1));
        ok = query_ms < release_ms && sync_ms < release_ms;
        std::printf("end-beside: the short kernel's stream polled idle after %.1f ms, synchronised after %.1f ms; "
                    "the other kernel was released at %.0f ms\n", query_ms, sync_ms, release_ms);
    } else {
        std::printf("usage: sanitizer_probe late-alloc|early-alloc|two-kernels|end-beside\n");
        return 2;
    }
    // A kernel left spinning is abandoned: the process exits without waiting for it.
    std::fflush(stdout);
    if (!ok) std::_Exit(1);
    return 0;
}
