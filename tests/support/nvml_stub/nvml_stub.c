/* A stand-in for libnvidia-ml.so.1, for machines without an NVIDIA driver.
 *
 * The real pynvml module (nvidia-ml-py) loads it through ctypes exactly as it
 * loads the driver's library, so everything above the C boundary -- pynvml's
 * versioned entry points, its struct layouts, its two-call buffer protocols,
 * its error classes, and ddptop's use of all of them -- runs for real.  Only
 * the answers are made up, read from the text file named by DDPTOP_FAKE_NVML
 * (re-read whenever it changes, so a test can change a GPU mid-run):
 *
 *   init_error 9                  nvmlInit fails with this NVML return code
 *   driver 550.54.15              cuda 12040
 *   gpus 2
 *   gpu 0 name NVIDIA H100 80GB HBM3
 *   gpu 0 util 97 40              (gpu %, memory %)
 *   gpu 0 mem 85899345920 10737418240   (total, used bytes)
 *   gpu 0 power 312000 700000     (usage, enforced limit; milliwatts)
 *   gpu 0 temp 61                 gpu 0 sm 1980
 *   gpu 0 pcie 5 16 1200 3400     (gen, width, tx KB/s, rx KB/s)
 *   gpu 0 ecc 3                   gpu 0 retired 2
 *   gpu 0 retired_pending 1       gpu 0 remap 0 2 1 0 (rows: correctable, uncorrectable, pending, failure)
 *   gpu 0 throttle 0x44           gpu 0 cc 9 0
 *   gpu 0 bus 00000000:18:00.0
 *   gpu 0 pcie_max 5 16           (the link's maximum gen and width; default: as pcie)
 *   gpu 0 nvlink 0000:19:00.0 0000:19:00.0 switch   (per active NVLink: the bus id at its far end)
 *   gpu 0 nvlink_down 2           (links after the active ones that are not up)
 *   gpu 0 membus 5120 2619        (memory bus width in bits, max memory clock in MHz)
 *   gpu 0 fabric 3 0 2            (NVSwitch fabric: nvmlGpuFabricState_t, status, healthMask)
 *   gpu 0 pids 1234 5678          (compute processes on this GPU)
 *   gpu 0 uuid GPU-8f3c...        (default GPU-00000000-0000-0000-0000-00000000000<i>)
 *   gpu 0 mig MIG-ab12... MIG-cd34...   (the UUIDs of MIG devices on this GPU: nvmlDeviceGetHandleByUUID
 *                                 finds them, nvmlDeviceGetDeviceHandleFromMigDeviceHandle their GPU)
 *   gpu 0 unsupported nvmlDeviceGetPowerUsage nvmlDeviceGetTemperature
 *   gpu 0 lost                    (every call on it: NVML_ERROR_GPU_IS_LOST)
 *   gpu 0 xid 79 1                (an Xid critical error event, delivered once per sequence number)
 *   p2p 0 1 0 0 5                 (read, write, nvlink nvmlGpuP2PStatus_t)
 *   level 0 1 10                  (nvmlGpuTopologyLevel_t)
 *
 * With DDPTOP_FAKE_NVML_LOG set, every call appends its function name to that
 * file (what a test reads to see that a field is no longer asked for).
 * Built with -DOLD_DRIVER it lacks the entry points newer than driver ~470
 * (the _v3 process lists, nvmlDeviceGetCurrentClocksEventReasons,
 * nvmlDeviceGetGpuFabricInfoV), as an old
 * driver does.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXGPU 16
#define MAXPIDS 64
#define MAXMIG 7

enum {
    SUCCESS = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3,
    NOT_FOUND = 6, INSUFFICIENT_SIZE = 7, TIMEOUT = 10, GPU_IS_LOST = 15, UNKNOWN = 999
};

typedef struct {
    char name[96], uuid[96], bus[32], unsupported[1024], nvlink[18][32];
    unsigned util, mem_util, power, limit, temp, sm, gen, width, tx, rx, retired, max_gen, max_width;
    unsigned nlinks, nlinks_down, membus, memclock, retired_pending, remap[4];
    unsigned long long total, used, ecc, throttle;
    int cc_major, cc_minor, lost, npids, xid, xid_seq, registered, fabric, fabric_state, fabric_status;
    unsigned fabric_health;
    unsigned pids[MAXPIDS];
    char mig[MAXMIG][96];
    int nmig;
} dev_t_;

static dev_t_ devs[MAXGPU];
/* MIG device handles: migs[i][k] is MIG device k of GPU i */
typedef struct { int parent, k; } mig_t_;
static mig_t_ migs[MAXGPU][MAXMIG];
static int ngpus, init_error, initialised, cuda = 12040;
static int p2p[MAXGPU][MAXGPU][3], level[MAXGPU][MAXGPU];
static char driver[64] = "550.54.15";
static long long loaded_mtime = -1, loaded_size = -1;
static int delivered[256], ndelivered;

static void trace(const char *fn) {
    const char *path = getenv("DDPTOP_FAKE_NVML_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%s\n", fn); fclose(f); }
}

static void defaults(void) {
    memset(devs, 0, sizeof devs);
    memset(level, 0, sizeof level);
    ngpus = 0; init_error = 0; cuda = 12040;
    strcpy(driver, "550.54.15");
    for (int i = 0; i < MAXGPU; i++) {
        dev_t_ *d = &devs[i];
        snprintf(d->name, sizeof d->name, "NVIDIA H100 80GB HBM3");
        snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012d", i);
        snprintf(d->bus, sizeof d->bus, "00000000:%02X:00.0", 0x18 + i);
        d->total = 85899345920ULL; d->power = 100000; d->limit = 700000;
        d->temp = 40; d->sm = 1980; d->gen = 5; d->width = 16;
        d->cc_major = 9; d->membus = 5120; d->memclock = 2619;
        for (int j = 0; j < MAXGPU; j++) {
            p2p[i][j][0] = p2p[i][j][1] = 0; p2p[i][j][2] = 5;
            level[i][j] = 10;
        }
    }
}

/* (Re)read the config when it changed; 0 when there is none. */
static int load(void) {
    const char *path = getenv("DDPTOP_FAKE_NVML");
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    long long mt = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    if (mt == loaded_mtime && st.st_size == loaded_size) return 1;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int registered[MAXGPU]; /* not configuration: what nvmlDeviceRegisterEvents did */
    for (int i = 0; i < MAXGPU; i++) registered[i] = devs[i].registered;
    defaults();
    for (int i = 0; i < MAXGPU; i++) devs[i].registered = registered[i];
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        int i, j, a, b, c, n;
        char key[64];
        if (sscanf(line, "init_error %d", &a) == 1) init_error = a;
        else if (sscanf(line, "driver %63s", driver) == 1) {}
        else if (sscanf(line, "cuda %d", &a) == 1) cuda = a;
        else if (sscanf(line, "gpus %d", &a) == 1) ngpus = a < MAXGPU ? a : MAXGPU;
        else if (sscanf(line, "p2p %d %d %d %d %d", &i, &j, &a, &b, &c) == 5 && i < MAXGPU && j < MAXGPU) {
            p2p[i][j][0] = p2p[j][i][0] = a; p2p[i][j][1] = p2p[j][i][1] = b; p2p[i][j][2] = p2p[j][i][2] = c;
        } else if (sscanf(line, "level %d %d %d", &i, &j, &a) == 3 && i < MAXGPU && j < MAXGPU) {
            level[i][j] = level[j][i] = a;
        } else if (sscanf(line, "gpu %d %63s %n", &i, key, &n) == 2 && i >= 0 && i < MAXGPU) {
            dev_t_ *d = &devs[i];
            const char *v = line + n;
            if (!strcmp(key, "name")) snprintf(d->name, sizeof d->name, "%s", v);
            else if (!strcmp(key, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", v);
            else if (!strcmp(key, "bus")) snprintf(d->bus, sizeof d->bus, "%s", v);
            else if (!strcmp(key, "util")) sscanf(v, "%u %u", &d->util, &d->mem_util);
            else if (!strcmp(key, "mem")) sscanf(v, "%llu %llu", &d->total, &d->used);
            else if (!strcmp(key, "power")) sscanf(v, "%u %u", &d->power, &d->limit);
            else if (!strcmp(key, "temp")) sscanf(v, "%u", &d->temp);
            else if (!strcmp(key, "sm")) sscanf(v, "%u", &d->sm);
            else if (!strcmp(key, "pcie")) sscanf(v, "%u %u %u %u", &d->gen, &d->width, &d->tx, &d->rx);
            else if (!strcmp(key, "pcie_max")) sscanf(v, "%u %u", &d->max_gen, &d->max_width);
            else if (!strcmp(key, "retired_pending")) sscanf(v, "%u", &d->retired_pending);
            else if (!strcmp(key, "remap")) sscanf(v, "%u %u %u %u", &d->remap[0], &d->remap[1], &d->remap[2], &d->remap[3]);
            else if (!strcmp(key, "nvlink_down")) sscanf(v, "%u", &d->nlinks_down);
            else if (!strcmp(key, "membus")) sscanf(v, "%u %u", &d->membus, &d->memclock);
            else if (!strcmp(key, "fabric"))
                d->fabric = sscanf(v, "%d %d %u", &d->fabric_state, &d->fabric_status, &d->fabric_health) >= 1;
            else if (!strcmp(key, "nvlink")) {
                int off = 0, k;
                char far[32];
                d->nlinks = 0;
                while (d->nlinks < 18 && sscanf(v + off, "%31s%n", far, &k) == 1) {
                    /* "switch": a bus id that is no GPU's */
                    snprintf(d->nvlink[d->nlinks++], 32, "%s", strcmp(far, "switch") ? far : "00000000:C1:00.0");
                    off += k;
                }
            }
            else if (!strcmp(key, "ecc")) sscanf(v, "%llu", &d->ecc);
            else if (!strcmp(key, "retired")) sscanf(v, "%u", &d->retired);
            else if (!strcmp(key, "throttle")) d->throttle = strtoull(v, NULL, 0);
            else if (!strcmp(key, "cc")) sscanf(v, "%d %d", &d->cc_major, &d->cc_minor);
            else if (!strcmp(key, "lost")) d->lost = 1;
            else if (!strcmp(key, "xid")) sscanf(v, "%d %d", &d->xid, &d->xid_seq);
            else if (!strcmp(key, "unsupported")) snprintf(d->unsupported, sizeof d->unsupported, " %s ", v);
            else if (!strcmp(key, "mig")) {
                int off = 0, k;
                d->nmig = 0;
                while (d->nmig < MAXMIG && sscanf(v + off, "%95s%n", d->mig[d->nmig], &k) == 1) {
                    d->nmig++;
                    off += k;
                }
            }
            else if (!strcmp(key, "pids")) {
                char *s = (char *)v, *end;
                d->npids = 0;
                for (unsigned long p = strtoul(s, &end, 10); end != s && d->npids < MAXPIDS; p = strtoul(s, &end, 10)) {
                    d->pids[d->npids++] = (unsigned)p;
                    s = end;
                }
            }
        }
    }
    fclose(f);
    loaded_mtime = mt; loaded_size = st.st_size;
    return 1;
}

/* The common preamble of a per-device call. */
static int check(void *h, const char *fn) {
    trace(fn);
    if (!initialised) return UNINITIALIZED;
    load();
    dev_t_ *d = (dev_t_ *)h;
    if (d < devs || d >= devs + ngpus) return INVALID_ARGUMENT;
    if (d->lost) return GPU_IS_LOST;
    char needle[160];
    snprintf(needle, sizeof needle, " %s ", fn);
    if (strstr(d->unsupported, needle)) return NOT_SUPPORTED;
    return SUCCESS;
}

#define DEVCALL(h) do { int _r = check((h), __func__); if (_r) return _r; } while (0)

EXPORT int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    trace(__func__);
    if (!load()) return 12; /* no config: as if there were no library */
    if (init_error) return init_error;
    initialised = 1;
    return SUCCESS;
}
EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlInit(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlShutdown(void) { trace(__func__); initialised = 0; return SUCCESS; }

EXPORT const char *nvmlErrorString(int r) {
    switch (r) {
    case SUCCESS: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case NOT_SUPPORTED: return "Not Supported";
    case GPU_IS_LOST: return "GPU is lost";
    case NOT_FOUND: return "Not Found";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

EXPORT int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    snprintf(buf, len, "%s", driver);
    return SUCCESS;
}
EXPORT int nvmlSystemGetCudaDriverVersion(int *v) { trace(__func__); *v = cuda; return SUCCESS; }
EXPORT int nvmlSystemGetCudaDriverVersion_v2(int *v) { trace(__func__); *v = cuda; return SUCCESS; }

EXPORT int nvmlDeviceGetCount_v2(unsigned *n) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    load();
    *n = (unsigned)ngpus;
    return SUCCESS;
}
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    if (i >= (unsigned)ngpus) return INVALID_ARGUMENT;
    *h = &devs[i];
    return devs[i].lost ? GPU_IS_LOST : SUCCESS;
}

#define D ((dev_t_ *)h)

EXPORT int nvmlDeviceGetName(void *h, char *buf, unsigned len) { DEVCALL(h); snprintf(buf, len, "%s", D->name); return 0; }
static mig_t_ *as_mig(void *h) {
    mig_t_ *m = (mig_t_ *)h;
    return (m >= &migs[0][0] && m < &migs[0][0] + MAXGPU * MAXMIG) ? m : NULL;
}
EXPORT int nvmlDeviceGetUUID(void *h, char *buf, unsigned len) {
    mig_t_ *m = as_mig(h);
    if (m) { /* a MIG device's own UUID */
        trace(__func__);
        if (!initialised) return UNINITIALIZED;
        snprintf(buf, len, "%s", devs[m->parent].mig[m->k]);
        return 0;
    }
    DEVCALL(h);
    snprintf(buf, len, "%s", D->uuid);
    return 0;
}
/* NVML takes a whole UUID, a GPU's or a MIG device's (CUDA_VISIBLE_DEVICES also takes a leading part) */
EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    load();
    if (!uuid) return INVALID_ARGUMENT;
    for (int i = 0; i < ngpus; i++) {
        if (!strcmp(devs[i].uuid, uuid)) { *h = &devs[i]; return devs[i].lost ? GPU_IS_LOST : SUCCESS; }
        for (int k = 0; k < devs[i].nmig; k++)
            if (!strcmp(devs[i].mig[k], uuid)) {
                migs[i][k].parent = i; migs[i][k].k = k;
                *h = &migs[i][k];
                return SUCCESS;
            }
    }
    return NOT_FOUND;
}
EXPORT int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *mig, void **h) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    mig_t_ *m = as_mig(mig);
    if (!m) return INVALID_ARGUMENT;
    *h = &devs[m->parent];
    return SUCCESS;
}

typedef struct { unsigned long long total, free, used; } mem_t;
EXPORT int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    DEVCALL(h);
    m->total = D->total; m->used = D->used; m->free = D->total - D->used;
    return 0;
}
EXPORT int nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *v) { DEVCALL(h); *v = D->limit; return 0; }
EXPORT int nvmlDeviceGetPowerUsage(void *h, unsigned *v) { DEVCALL(h); *v = D->power; return 0; }

typedef struct { unsigned gpu, memory; } util_t;
EXPORT int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { DEVCALL(h); u->gpu = D->util; u->memory = D->mem_util; return 0; }
EXPORT int nvmlDeviceGetTemperature(void *h, int sensor, unsigned *v) {
    DEVCALL(h);
    if (sensor != 0) return INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU */
    *v = D->temp;
    return 0;
}
EXPORT int nvmlDeviceGetClockInfo(void *h, int type, unsigned *v) {
    DEVCALL(h);
    if (type != 1) return INVALID_ARGUMENT; /* NVML_CLOCK_SM */
    *v = D->sm;
    return 0;
}
EXPORT int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { DEVCALL(h); *v = D->gen; return 0; }
EXPORT int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { DEVCALL(h); *v = D->width; return 0; }
EXPORT int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *v) { DEVCALL(h); *v = D->max_gen ? D->max_gen : D->gen; return 0; }
EXPORT int nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *v) { DEVCALL(h); *v = D->max_width ? D->max_width : D->width; return 0; }
EXPORT int nvmlDeviceGetMemoryBusWidth(void *h, unsigned *v) { DEVCALL(h); *v = D->membus; return 0; }
EXPORT int nvmlDeviceGetMaxClockInfo(void *h, int type, unsigned *v) {
    DEVCALL(h);
    if (type == 2) *v = D->memclock; /* NVML_CLOCK_MEM */
    else if (type == 1) *v = D->sm;
    else return INVALID_ARGUMENT;
    return 0;
}
EXPORT int nvmlDeviceGetNvLinkState(void *h, unsigned link, int *active) {
    DEVCALL(h);
    if (!D->nlinks && !D->nlinks_down) return NOT_SUPPORTED;
    if (link >= D->nlinks + D->nlinks_down) return INVALID_ARGUMENT;
    *active = link < D->nlinks;
    return 0;
}
EXPORT int nvmlDeviceGetPcieThroughput(void *h, int counter, unsigned *v) {
    DEVCALL(h);
    if (counter != 0 && counter != 1) return INVALID_ARGUMENT;
    *v = counter == 0 ? D->tx : D->rx;
    return 0;
}
EXPORT int nvmlDeviceGetTotalEccErrors(void *h, int type, int counter, unsigned long long *v) {
    DEVCALL(h);
    if (type != 1 || counter != 0) return INVALID_ARGUMENT; /* uncorrected, volatile */
    *v = D->ecc;
    return 0;
}
EXPORT int nvmlDeviceGetRetiredPages(void *h, int cause, unsigned *count, unsigned long long *addrs) {
    DEVCALL(h);
    (void)cause;
    if (addrs == NULL || *count < D->retired) {
        *count = D->retired;
        return D->retired ? INSUFFICIENT_SIZE : SUCCESS;
    }
    for (unsigned i = 0; i < D->retired; i++) addrs[i] = 0x1000ULL * (i + 1);
    *count = D->retired;
    return 0;
}
EXPORT int nvmlDeviceGetRetiredPagesPendingStatus(void *h, int *v) { DEVCALL(h); *v = D->retired_pending ? 1 : 0; return 0; }
EXPORT int nvmlDeviceGetRemappedRows(void *h, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failure) {
    DEVCALL(h);
    *corr = D->remap[0]; *unc = D->remap[1]; *pending = D->remap[2]; *failure = D->remap[3];
    return 0;
}
#ifndef OLD_DRIVER
/* nvmlGpuFabricInfo_v2_t as nvml.h lays it out: the state is one byte */
typedef struct {
    unsigned version;
    unsigned char clusterUuid[16];
    int status;
    unsigned cliqueId;
    unsigned char state;
    unsigned char pad[3];
    unsigned healthMask;
} fabric_v2_t;
EXPORT int nvmlDeviceGetGpuFabricInfoV(void *h, fabric_v2_t *info) {
    DEVCALL(h);
    if (info->version != 0x02000024) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    if (!D->fabric) return NOT_SUPPORTED;
    memset(info->clusterUuid, 0x11, sizeof info->clusterUuid);
    info->status = D->fabric_status;
    info->cliqueId = 1;
    info->state = (unsigned char)D->fabric_state;
    memset(info->pad, 0xAB, sizeof info->pad); /* padding is not zero on a real driver either */
    info->healthMask = D->fabric_health;
    return 0;
}
EXPORT int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *v) { DEVCALL(h); *v = D->throttle; return 0; }
#endif
EXPORT int nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *v) { DEVCALL(h); *v = D->throttle; return 0; }

typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
static int procs(void *h, unsigned *count, proc_t *out, int graphics) {
    unsigned n = graphics ? 0 : (unsigned)D->npids;
    if (out == NULL || *count < n) {
        *count = n;
        return n ? INSUFFICIENT_SIZE : SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        out[i].pid = D->pids[i]; out[i].used = 1ULL << 30; out[i].gi = out[i].ci = 0xFFFFFFFF;
    }
    *count = n;
    return 0;
}
#ifndef OLD_DRIVER
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *c, proc_t *p) { DEVCALL(h); return procs(h, c, p, 0); }
EXPORT int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *c, proc_t *p) { DEVCALL(h); return procs(h, c, p, 1); }
#endif
EXPORT int nvmlDeviceGetComputeRunningProcesses_v2(void *h, unsigned *c, proc_t *p) { DEVCALL(h); return procs(h, c, p, 0); }
EXPORT int nvmlDeviceGetGraphicsRunningProcesses_v2(void *h, unsigned *c, proc_t *p) { DEVCALL(h); return procs(h, c, p, 1); }

EXPORT int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    DEVCALL(h);
    *major = D->cc_major; *minor = D->cc_minor;
    return 0;
}

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;
EXPORT int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) {
    DEVCALL(h);
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", D->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", D->bus + (strlen(D->bus) > 12 ? 4 : 0));
    p->pciDeviceId = 0x233010DE;
    return 0;
}

EXPORT int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned link, pci_t *p) {
    DEVCALL(h);
    if (link >= D->nlinks) return INVALID_ARGUMENT;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", D->nvlink[link]);
    return 0;
}

EXPORT int nvmlDeviceGetP2PStatus(void *h1, void *h2, int index, int *status) {
    int r = check(h1, __func__);
    if (r) return r;
    if ((r = check(h2, __func__))) return r;
    if (index < 0 || index > 6) return INVALID_ARGUMENT;
    int i = (int)((dev_t_ *)h1 - devs), j = (int)((dev_t_ *)h2 - devs);
    *status = index <= 2 ? p2p[i][j][index] : 5;
    return 0;
}
EXPORT int nvmlDeviceGetTopologyCommonAncestor(void *h1, void *h2, int *lvl) {
    int r = check(h1, __func__);
    if (r) return r;
    if ((r = check(h2, __func__))) return r;
    *lvl = level[(dev_t_ *)h1 - devs][(dev_t_ *)h2 - devs];
    return 0;
}

/* events: one global set is enough for a stand-in */
static int event_set_token;
EXPORT int nvmlEventSetCreate(void **set) {
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    *set = &event_set_token;
    return 0;
}
EXPORT int nvmlEventSetFree(void *set) { (void)set; trace(__func__); return 0; }
EXPORT int nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    DEVCALL(h);
    if (set != &event_set_token) return INVALID_ARGUMENT;
    if (!(types & 0x8ULL)) return NOT_SUPPORTED;
    D->registered = 1;
    return 0;
}

typedef struct { void *device; unsigned long long type, data; unsigned gi, ci; } event_t;
EXPORT int nvmlEventSetWait_v2(void *set, event_t *ev, unsigned timeout_ms) {
    (void)timeout_ms;
    trace(__func__);
    if (!initialised) return UNINITIALIZED;
    if (set != &event_set_token) return INVALID_ARGUMENT;
    load();
    for (int i = 0; i < ngpus; i++) {
        dev_t_ *d = &devs[i];
        if (!d->registered || !d->xid) continue;
        int seen = 0;
        for (int k = 0; k < ndelivered; k++) seen |= delivered[k] == d->xid_seq * MAXGPU + i;
        if (seen || ndelivered >= 256) continue;
        delivered[ndelivered++] = d->xid_seq * MAXGPU + i;
        ev->device = d; ev->type = 0x8ULL; ev->data = (unsigned long long)d->xid;
        ev->gi = ev->ci = 0xFFFFFFFF;
        return 0;
    }
    return TIMEOUT;
}
