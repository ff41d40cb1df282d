/* cuda_loader.c -- libgddr-client's side of the CUDA plugin (cuda_api.h).
 *
 * Every CUDA entry point of kernels/ is defined here as a forwarder to the
 * plugin libgddr-cuda.so, which is loaded on first use. The client library
 * itself links no CUDA library, so a host without the CUDA toolkit runs any
 * trainer that hands it host memory.
 *
 * When the plugin is loaded:
 *   - gddr_cuda_available() and every forwarder load it on first call (the
 *     caller wants CUDA);
 *   - gddr_cuda_is_device_ptr() does not, as long as the process has not
 *     loaded the NVIDIA driver (libcuda.so.1) itself: device memory cannot
 *     exist in such a process, so every pointer is host memory and nothing
 *     is loaded. A trainer that uses CUDA has the driver loaded; then the
 *     plugin is loaded and asked.
 * Loading first checks that the driver library exists (dlopen of
 * libcuda.so.1), so a CPU-only host never loads cudart, then looks for the
 * plugin, in this order:
 *   1. next to the object that holds this code (libgddr-client.so, or the
 *      executable that linked libgddr-client.a), found with dladdr;
 *   2. the folder gddr/ there (the Debian package libgddr-client0-cuda puts
 *      it in /usr/lib/<multiarch>/gddr/: a plugin without a SONAME does not
 *      belong in the library folder itself);
 *   3. ../lib/ from there (an executable in PREFIX/bin, the plugin in
 *      PREFIX/lib, also build/bin and build/lib);
 *   4. the file named by $GDDR_CUDA_PLUGIN;
 *   5. libgddr-cuda.so through the default loader path (LD_LIBRARY_PATH,
 *      ld.so.cache).
 * The first that loads and has the right ABI wins. When none does, the
 * reason for each is kept: gddr_cuda_available() returns it, and every
 * forwarder answers GDDR_ENOTSUP with it in gddr_cuda_errmsg(). If device
 * memory is then handed to the library anyway, gddr_cuda_is_device_ptr()
 * still recognises it through the driver's cuPointerGetAttribute, so the
 * step refuses it with that reason instead of reading it as host memory.
 *
 * A build without nvcc (and the CPU-only copy of the library in the daemon
 * and the tools) never searches: the reason is "built without CUDA".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "gddr_base.h"

#define DRIVER "libcuda.so.1"

static _Atomic(const gddr_cuda_api *) api;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int searched;             /* under lock */
static char why_not[1024];       /* under lock; final once searched and api is NULL */
static void *plugin_handle;
static char plugin_file[PATH_MAX];

/* The message of this thread's last failed CUDA call. */
static __thread char errbuf[1024];

const char *gddr_cuda_errmsg(void)
{
    return errbuf;
}

static void appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Opens one candidate; on failure appends why to `why`. Under lock. */
static const gddr_cuda_api *try_open(const char *path, int must_exist, char *why, size_t len)
{
    if (must_exist && access(path, F_OK) != 0) {
        appendf(why, len, "%s%s: not found", why[0] ? "; " : "", path);
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        appendf(why, len, "%s%s", why[0] ? "; " : "", e ? e : path);
        return NULL;
    }
    gddr_cuda_entry_fn entry;
    void *sym = dlsym(h, GDDR_CUDA_ENTRY);
    memcpy(&entry, &sym, sizeof entry);
    const gddr_cuda_api *t = sym ? entry() : NULL;
    if (!t || t->abi != GDDR_CUDA_ABI || t->size != sizeof *t) {
        if (!sym)
            appendf(why, len, "%s%s: not a GDDR CUDA plugin (no %s)", why[0] ? "; " : "", path,
                    GDDR_CUDA_ENTRY);
        else
            appendf(why, len, "%s%s: plugin ABI %u (%u bytes), this library needs %u (%zu bytes)",
                    why[0] ? "; " : "", path, t ? t->abi : 0, t ? t->size : 0, GDDR_CUDA_ABI,
                    sizeof *t);
        dlclose(h);
        return NULL;
    }
    plugin_handle = h;
    snprintf(plugin_file, sizeof plugin_file, "%s", path);
    atomic_store_explicit(&api, t, memory_order_release);
    return t;
}

#ifdef GDDR_HAVE_CUDA
/* The folder of the object this code is linked into. */
static int self_dir(char *dir, size_t len)
{
    Dl_info info;
    struct link_map *lm = NULL;
    const char *file = NULL;
    char exe[PATH_MAX];
    if (dladdr1((void *)&gddr_cuda_available, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm &&
        lm->l_name && lm->l_name[0])
        file = lm->l_name;
    if (!file) { /* the main program: its l_name is "" */
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (k <= 0)
            return 0;
        exe[k] = 0;
        file = exe;
    }
    const char *slash = strrchr(file, '/');
    if (!slash)
        return 0;
    snprintf(dir, len, "%.*s", (int)(slash - file), file);
    return 1;
}

static void search(void)
{
    why_not[0] = 0;
    void *drv = dlopen(DRIVER, RTLD_LAZY | RTLD_LOCAL);
    if (!drv) {
        const char *e = dlerror();
        snprintf(why_not, sizeof why_not, "no NVIDIA driver (%s)", e ? e : DRIVER " not found");
        return;
    }
    char tried[sizeof why_not] = "";
    char dir[PATH_MAX], path[PATH_MAX + 64];
    if (self_dir(dir, sizeof dir)) {
        snprintf(path, sizeof path, "%s/%s", dir, GDDR_CUDA_PLUGIN_FILE);
        if (try_open(path, 1, tried, sizeof tried))
            return;
        snprintf(path, sizeof path, "%s/gddr/%s", dir, GDDR_CUDA_PLUGIN_FILE);
        if (try_open(path, 1, tried, sizeof tried))
            return;
        snprintf(path, sizeof path, "%s/../lib/%s", dir, GDDR_CUDA_PLUGIN_FILE);
        if (try_open(path, 1, tried, sizeof tried))
            return;
    }
    const char *env = getenv("GDDR_CUDA_PLUGIN");
    if (env && env[0]) {
        if (try_open(env, 1, tried, sizeof tried))
            return;
    } else {
        appendf(tried, sizeof tried, "%sGDDR_CUDA_PLUGIN not set", tried[0] ? "; " : "");
    }
    if (try_open(GDDR_CUDA_PLUGIN_FILE, 0, tried, sizeof tried))
        return;
    snprintf(why_not, sizeof why_not, "CUDA plugin %s not loaded (%s)", GDDR_CUDA_PLUGIN_FILE,
             tried);
    dlclose(drv);
}
#else
static void search(void)
{
    snprintf(why_not, sizeof why_not, "built without CUDA (no nvcc at build time)");
}
#endif

/* The plugin, loaded now if it was never tried; NULL (reason in errbuf) if
 * it cannot be. */
static const gddr_cuda_api *plugin(void)
{
    const gddr_cuda_api *a = atomic_load_explicit(&api, memory_order_acquire);
    if (a)
        return a;
    pthread_mutex_lock(&lock);
    if (!searched) {
        searched = 1;
        search();
    }
    a = atomic_load_explicit(&api, memory_order_acquire);
    if (!a)
        snprintf(errbuf, sizeof errbuf, "%s", why_not);
    pthread_mutex_unlock(&lock);
    return a;
}

/* After a failed plugin call: its own message, or at least which call. */
static void take_error(const gddr_cuda_api *a, const char *name, int rc)
{
    if (a->take_error(errbuf, sizeof errbuf) == 0)
        snprintf(errbuf, sizeof errbuf, "%s: %s", name, gddr_strerror(rc));
}

#define FORWARD(name, params, args, prologue)                                                 \
    int name params                                                                           \
    {                                                                                         \
        prologue const gddr_cuda_api *a_ = plugin();                                          \
        if (!a_)                                                                              \
            return GDDR_ENOTSUP;                                                              \
        const int rc_ = a_->name args;                                                        \
        if (rc_ != GDDR_OK)                                                                   \
            take_error(a_, #name, rc_);                                                       \
        return rc_;                                                                           \
    }
GDDR_CUDA_CALLS(FORWARD)
#undef FORWARD

int gddr_cuda_available(char *why, size_t whylen)
{
    const gddr_cuda_api *a = plugin();
    if (!a) {
        if (why && whylen)
            snprintf(why, whylen, "%s", errbuf);
        return 0;
    }
    return a->available(why, whylen);
}

void gddr_cuda_ctx_destroy(gddr_cuda_ctx **ctx)
{
    const gddr_cuda_api *a = atomic_load_explicit(&api, memory_order_acquire);
    if (a)
        a->ctx_destroy(ctx);
    else if (ctx)
        *ctx = NULL; /* no plugin: no context was ever created */
}

void *gddr_cuda_ctx_stream(gddr_cuda_ctx *ctx)
{
    const gddr_cuda_api *a = atomic_load_explicit(&api, memory_order_acquire);
    return a ? a->ctx_stream(ctx) : NULL;
}

/* The driver's own answer, for a process that has it loaded but no plugin:
 * cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) ==
 * CU_MEMORYTYPE_DEVICE. The enums are the driver API's stable values. */
typedef int (*cu_pointer_get_attribute_fn)(void *data, int attribute, unsigned long long ptr);
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2

static int driver_says_device(void *drv, const void *p)
{
    cu_pointer_get_attribute_fn fn;
    void *sym = dlsym(drv, "cuPointerGetAttribute");
    if (!sym)
        return 0;
    memcpy(&fn, &sym, sizeof fn);
    unsigned int type = 0;
    return fn(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)p) == 0 &&
           type == CU_MEMORYTYPE_DEVICE;
}

static int is_driver(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcuda.so", 10) != 0)
        return 0;
    *(int *)found = 1;
    return 1;
}

/* Whether the process has the NVIDIA driver mapped, from the loader's own
 * list: no system call. dlopen(RTLD_NOLOAD) of a name that is not loaded
 * searches the disk first (ld.so.cache mapped and unmapped, four failed
 * opens), and the unmap's TLB shootdown interrupts every core running the
 * process's threads: asked once a step, that cost a loopback 1 MiB step
 * about a quarter of its time (docs/performance.md, "A dlopen every step"). */
static int driver_loaded(void)
{
    int found = 0;
    dl_iterate_phdr(is_driver, &found);
    return found;
}

int gddr_cuda_is_device_ptr(const void *p)
{
    if (!p)
        return 0;
    const gddr_cuda_api *a = atomic_load_explicit(&api, memory_order_acquire);
    if (a)
        return a->is_device_ptr(p);
    if (!driver_loaded())
        return 0; /* this process never loaded the driver: no device memory exists */
    void *drv = dlopen(DRIVER, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!drv)
        return 0; /* a libcuda.so* is mapped, but not the driver's soname */
    a = plugin();
    int dev = a ? a->is_device_ptr(p) : driver_says_device(drv, p);
    dlclose(drv);
    return dev;
}

int gddr__cuda_plugin_load(const char *path, char *why, size_t whylen)
{
    char msg[sizeof why_not] = "";
    int rc = GDDR_OK;
    pthread_mutex_lock(&lock);
    const gddr_cuda_api *a = atomic_load_explicit(&api, memory_order_acquire);
    if (a) {
        if (!path || strcmp(path, plugin_file) != 0) {
            snprintf(msg, sizeof msg, "another CUDA plugin is loaded (%.900s)", plugin_file);
            rc = GDDR_ESTATE;
        }
    } else if (!path || !try_open(path, 1, msg, sizeof msg)) {
        rc = GDDR_ENOTSUP;
    } else {
        searched = 1;
    }
    pthread_mutex_unlock(&lock);
    if (why && whylen)
        snprintf(why, whylen, "%s", msg);
    return rc;
}

const char *gddr__cuda_plugin_path(void)
{
    return atomic_load_explicit(&api, memory_order_acquire) ? plugin_file : NULL;
}

void *gddr__cuda_plugin_handle(void)
{
    return atomic_load_explicit(&api, memory_order_acquire) ? plugin_handle : NULL;
}
