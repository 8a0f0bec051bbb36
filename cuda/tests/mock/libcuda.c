/* A stand-in for the CUDA driver (libcuda.so.1) for tests on machines
 * without a GPU. "Device memory" is host memory, page-aligned; every device
 * range a call names is checked against the live allocations, so a copy
 * out of bounds, a double free or a stale pointer fails as
 * CUDA_ERROR_INVALID_VALUE instead of passing. It proves barlink's calls,
 * bounds and error paths, never speed or real device behaviour.
 *
 * Built by the tests with: cc -shared -fPIC -o libcuda-mock.so libcuda.c
 *   -DMOCK_NO_DEVICE   cuInit answers CUDA_ERROR_NO_DEVICE
 *   -DMOCK_DRIVER_MISMATCH  cuInit answers CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
 *                      (a GPU is there, but the library and kernel driver
 *                      disagree: a fault, not an absent GPU)
 *   -DMOCK_DMA_BUF     the device exports dma-bufs (a file descriptor of
 *                      /dev/null stands in), for whole host pages only
 *   -DMOCK_FLIP_READS  every 5th device-to-host copy of 64 bytes or more
 *                      flips one bit of what it delivers (a bad path that
 *                      the validator must catch)
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef uint64_t CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
    SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
    NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
    NOT_SUPPORTED = 801, SYSTEM_DRIVER_MISMATCH = 803,
};

/* Device allocations start on a host page, as the real driver's large ones do. */
static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

#define MAX_ALLOCATIONS 4096
static struct { uintptr_t base; size_t len; int host; } table[MAX_ALLOCATIONS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static int primary_retains;
static __thread CUcontext current;
static char primary_context;

static int track(void *p, size_t len, int host) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        if (table[i].base == 0) {
            table[i].base = (uintptr_t)p; table[i].len = len; table[i].host = host;
            pthread_mutex_unlock(&lock);
            return 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

static int untrack(uintptr_t p, int host) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        if (table[i].base == p && table[i].host == host) {
            table[i].base = 0;
            pthread_mutex_unlock(&lock);
            return 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

/* Whether [p, p+len) lies inside one live device allocation. */
static int inside(CUdeviceptr p, size_t len) {
    int ok = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        if (table[i].base && !table[i].host && p >= table[i].base &&
            p + len >= p && p + len <= table[i].base + table[i].len) {
            ok = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

#define NEED_INIT() do { if (!initialised) return NOT_INITIALIZED; } while (0)
#define NEED_CONTEXT() do { NEED_INIT(); if (current != &primary_context) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned flags) {
#if defined(MOCK_NO_DEVICE)
    (void)flags;
    return NO_DEVICE;
#elif defined(MOCK_DRIVER_MISMATCH)
    (void)flags;
    return SYSTEM_DRIVER_MISMATCH;
#else
    if (flags != 0) return INVALID_VALUE;
    initialised = 1;
    return SUCCESS;
#endif
}

CUresult cuDriverGetVersion(int *v) { *v = 12040; return SUCCESS; }

CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case SUCCESS: *s = "CUDA_SUCCESS"; return SUCCESS;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return SUCCESS;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return SUCCESS;
    case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return SUCCESS;
    case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return SUCCESS;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return SUCCESS;
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return SUCCESS;
    case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return SUCCESS;
    case SYSTEM_DRIVER_MISMATCH: *s = "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"; return SUCCESS;
    default: *s = 0; return INVALID_VALUE;
    }
}

CUresult cuGetErrorString(CUresult e, const char **s) {
    switch (e) {
    case INVALID_VALUE: *s = "invalid argument"; return SUCCESS;
    case NO_DEVICE: *s = "no CUDA-capable device is detected"; return SUCCESS;
    case NOT_SUPPORTED: *s = "operation not supported"; return SUCCESS;
    case INVALID_CONTEXT: *s = "invalid device context"; return SUCCESS;
    default: return cuGetErrorName(e, s);
    }
}

CUresult cuDeviceGetCount(int *n) { NEED_INIT(); *n = 1; return SUCCESS; }

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT();
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    snprintf(name, (size_t)len, "barlink mock GPU");
    return SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    snprintf(id, (size_t)len, "0000:0A:00.0");
    return SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    *bytes = (size_t)1 << 30;
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    switch (attribute) {
    case 40: *v = 2; return SUCCESS;  /* copy engines */
    case 41: *v = 1; return SUCCESS;  /* unified addressing */
    case 75: *v = 9; return SUCCESS;  /* compute capability 9.0 */
    case 76: *v = 0; return SUCCESS;
    case 99: *v = 1; return SUCCESS;  /* host register */
    case 116: *v = 0; return SUCCESS; /* GPUDirect RDMA */
#ifdef MOCK_DMA_BUF
    case 124: *v = 1; return SUCCESS; /* dma-buf, as on data-center boards */
#else
    case 124: *v = 0; return SUCCESS; /* dma-buf, as on GeForce */
#endif
    default: return INVALID_VALUE;
    }
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    __atomic_add_fetch(&primary_retains, 1, __ATOMIC_SEQ_CST);
    *c = &primary_context;
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (d != 0) return INVALID_DEVICE;
    if (__atomic_sub_fetch(&primary_retains, 1, __ATOMIC_SEQ_CST) < 0) return INVALID_CONTEXT;
    return SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (c != 0 && c != &primary_context) return INVALID_CONTEXT;
    current = c;
    return SUCCESS;
}

CUresult cuCtxSynchronize(void) { NEED_CONTEXT(); return SUCCESS; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t len) {
    NEED_CONTEXT();
    if (len == 0) return INVALID_VALUE;
    void *m = 0;
    if (posix_memalign(&m, page(), len) != 0) return OUT_OF_MEMORY;
    if (!track(m, len, 0)) { free(m); return OUT_OF_MEMORY; }
    *p = (CUdeviceptr)(uintptr_t)m;
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CONTEXT();
    if (!untrack((uintptr_t)p, 0)) return INVALID_VALUE;
    free((void *)(uintptr_t)p);
    return SUCCESS;
}

CUresult cuMemAllocHost_v2(void **p, size_t len) {
    NEED_CONTEXT();
    void *m = malloc(len);
    if (!m) return OUT_OF_MEMORY;
    if (!track(m, len, 1)) { free(m); return OUT_OF_MEMORY; }
    *p = m;
    return SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    NEED_CONTEXT();
    if (!untrack((uintptr_t)p, 1)) return INVALID_VALUE;
    free(p);
    return SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr to, const void *from, size_t len) {
    NEED_CONTEXT();
    if (!inside(to, len)) return INVALID_VALUE;
    memcpy((void *)(uintptr_t)to, from, len);
    return SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *to, CUdeviceptr from, size_t len) {
    NEED_CONTEXT();
    if (!inside(from, len)) return INVALID_VALUE;
    memcpy(to, (const void *)(uintptr_t)from, len);
#ifdef MOCK_FLIP_READS
    static unsigned long reads;
    if (len >= 64 && __atomic_add_fetch(&reads, 1, __ATOMIC_SEQ_CST) % 5 == 0)
        ((unsigned char *)to)[len / 2] ^= 0x10;
#endif
    return SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr to, CUdeviceptr from, size_t len) {
    NEED_CONTEXT();
    if (!inside(to, len) || !inside(from, len)) return INVALID_VALUE;
    memmove((void *)(uintptr_t)to, (const void *)(uintptr_t)from, len);
    return SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr to, unsigned char value, size_t len) {
    NEED_CONTEXT();
    if (!inside(to, len)) return INVALID_VALUE;
    memset((void *)(uintptr_t)to, value, len);
    return SUCCESS;
}

/* IPC between processes cannot be faked with malloc: refused, as a driver
 * without IPC support (or a container without /dev/nvidia-caps) answers. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    NEED_CONTEXT();
    (void)h;
    if (!inside(p, 1)) return INVALID_VALUE;
    return NOT_SUPPORTED;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
    NEED_CONTEXT();
    (void)p; (void)h; (void)flags;
    return NOT_SUPPORTED;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_CONTEXT(); (void)p; return INVALID_VALUE; }

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t len, int type,
                                       unsigned long long flags) {
    NEED_CONTEXT();
    if (!inside(p, len)) return INVALID_VALUE;
#ifdef MOCK_DMA_BUF
    /* The real driver takes whole host pages, type 1 (a dma-buf fd), no flags. */
    if (p % page() != 0 || len % page() != 0 || type != 1 || flags != 0) return INVALID_VALUE;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return OUT_OF_MEMORY;
    *(int *)handle = fd;
    return SUCCESS;
#else
    (void)handle; (void)type; (void)flags;
    return NOT_SUPPORTED;
#endif
}

/* For leak checks: device and host allocations still live. */
int barlink_mock_cuda_live_allocations(void) {
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCATIONS; i++) n += table[i].base != 0;
    pthread_mutex_unlock(&lock);
    return n;
}
