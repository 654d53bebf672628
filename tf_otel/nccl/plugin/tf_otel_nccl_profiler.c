/*
 * tf_otel NCCL profiler plugin: NCCL collective events -> a bounded shared-memory ring.
 *
 * Build: scripts/build_nccl_plugin.sh  ->  tf_otel/nccl/plugin/libnccl-profiler-tf_otel.so
 * Use:   NCCL_PROFILER_PLUGIN=/path/to/libnccl-profiler-tf_otel.so  (NCCL >= 2.23)
 *
 * Every Coll event becomes one fixed-size record in /dev/shm/tf_otel_nccl_<pid>
 * (TF_OTEL_NCCL_RING_DIR overrides the folder, TF_OTEL_NCCL_RING_RECORDS the capacity).
 * tf_otel/nccl/ring.py reads it. Times are CLOCK_REALTIME ns (time.time_ns()).
 *
 * Timing: NCCL stops a Coll event when it is enqueued. Its ProxyOp / KernelCh child events
 * (activated unless TF_OTEL_NCCL_CHILD_EVENTS=0) tell when it really ends: the coll is
 * reference-counted and written each time its count drops to zero, so a record may be written
 * again with a later end; the reader keeps the latest per (commHash, func, seqNumber, rank):
 * NCCL numbers collectives per communicator and type (comm->seqNumber[func]).
 *
 * Never blocks NCCL: fixed pools, no allocation after init, full pools drop (counted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"
#include "tf_otel_nccl_ring.h"

#define TFO_EXPORT __attribute__((visibility("default")))
#define COLL_SLOTS 1024
#define CHILD_SLOTS 4096
#define KIND_COLL 1
#define KIND_CHILD 2

typedef struct tfo_ctx tfo_ctx;

typedef struct {
  int kind;                 /* KIND_COLL */
  int valid;                /* rec describes a collective (set under lock) */
  int refs;                 /* 1 (until enqueued) + running children; under lock */
  int lock;                 /* atomic spin lock around rec */
  tfo_ctx *ctx;
  tfo_coll_record rec;
} coll_slot;

typedef struct {
  int kind; /* KIND_CHILD */
  int in_use;
  coll_slot *parent;
} child_slot;

struct tfo_ctx {
  uint64_t comm_hash; /* v4/v5: from init; v1..v3: from each coll descriptor */
  int have_comm_hash;
  int rank;
  int nranks;
  int version;
  unsigned coll_next;  /* atomic */
  unsigned child_next; /* atomic */
  coll_slot colls[COLL_SLOTS];
  child_slot children[CHILD_SLOTS];
};

/* ---- the process-wide ring ---- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tfo_ring_header *g_ring = NULL;
static size_t g_ring_bytes = 0;
static pid_t g_ring_pid = 0;
static int g_contexts = 0;
static char g_ring_path[512];

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void copy_str(char *dst, size_t n, const char *src) {
  if (!src) {
    dst[0] = 0;
    return;
  }
  strncpy(dst, src, n - 1);
  dst[n - 1] = 0;
}

static void ring_drop(void) {
  if (g_ring) __atomic_fetch_add(&g_ring->dropped, 1, __ATOMIC_RELAXED);
}

/* Open (or re-use) this process's ring; g_mu held. 0 on success. */
static int ring_open_locked(void) {
  pid_t pid = getpid();
  if (g_ring && g_ring_pid == pid) return 0;
  if (g_ring && g_ring_pid != pid) { /* forked child: never write into the parent's ring */
    munmap(g_ring, g_ring_bytes);
    g_ring = NULL;
  }
  const char *dir = getenv("TF_OTEL_NCCL_RING_DIR");
  if (!dir || !*dir) dir = "/dev/shm";
  long cap = TFO_RING_DEFAULT_RECORDS;
  const char *c = getenv("TF_OTEL_NCCL_RING_RECORDS");
  if (c && *c) cap = strtol(c, NULL, 10);
  if (cap < TFO_RING_MIN_RECORDS) cap = TFO_RING_MIN_RECORDS;
  if (cap > TFO_RING_MAX_RECORDS) cap = TFO_RING_MAX_RECORDS;
  snprintf(g_ring_path, sizeof(g_ring_path), "%s/tf_otel_nccl_%d", dir, (int)pid);
  size_t bytes = sizeof(tfo_ring_header) + (size_t)cap * sizeof(tfo_coll_record);
  int fd = open(g_ring_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    close(fd);
    unlink(g_ring_path);
    return -1;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink(g_ring_path);
    return -1;
  }
  tfo_ring_header *h = (tfo_ring_header *)p;
  memset(h, 0, sizeof(*h));
  h->version = TFO_RING_VERSION;
  h->header_size = sizeof(tfo_ring_header);
  h->record_size = sizeof(tfo_coll_record);
  h->capacity = (uint32_t)cap;
  h->pid = (int32_t)pid;
  h->created_ns = now_ns();
  __atomic_thread_fence(__ATOMIC_RELEASE);
  memcpy(h->magic, TFO_RING_MAGIC, 8); /* last: a reader sees a complete header or none */
  g_ring = h;
  g_ring_bytes = bytes;
  g_ring_pid = pid;
  return 0;
}

/* Append one record (copy of *src) to the ring; overwrites the oldest when full. */
static void ring_write(const tfo_coll_record *src) {
  tfo_ring_header *h = g_ring;
  if (!h) return;
  uint64_t idx = __atomic_fetch_add(&h->write_index, 1, __ATOMIC_ACQ_REL);
  tfo_coll_record *dst = tfo_ring_records(h) + (idx % h->capacity);
  __atomic_store_n(&dst->commit, 0, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  memcpy((char *)dst + sizeof(uint64_t), (const char *)src + sizeof(uint64_t),
         sizeof(tfo_coll_record) - sizeof(uint64_t));
  __atomic_store_n(&dst->commit, idx + 1, __ATOMIC_RELEASE);
}

static void slot_lock(coll_slot *s) {
  while (__atomic_test_and_set(&s->lock, __ATOMIC_ACQUIRE)) {
  }
}
static void slot_unlock(coll_slot *s) { __atomic_clear(&s->lock, __ATOMIC_RELEASE); }

/* Drop one reference; at zero the coll is (re)written. The slot keeps its data so that child
 * events starting after the enqueue still find it; it is reused COLL_SLOTS collectives later. */
static void coll_release(coll_slot *s, uint64_t t) {
  slot_lock(s);
  if (s->rec.end_ns < t) s->rec.end_ns = t;
  if (s->refs > 0 && --s->refs == 0) ring_write(&s->rec);
  slot_unlock(s);
}

/* ---- the version-independent core ---- */
typedef struct {
  uint64_t type;
  void *parent;
  int rank;
  /* coll */
  int have_comm_hash;
  uint64_t comm_hash;
  uint64_t seq;
  const char *func, *dtype, *algo, *proto, *op;
  size_t count, traffic_bytes;
  int root;
  uint8_t nchannels, nwarps;
  /* children */
  int foreign; /* proxyOp from another process (PXN): parent pointer is not ours */
  uint64_t ptimer;
} tfo_event;

static const char *child_events_env(void) { return getenv("TF_OTEL_NCCL_CHILD_EVENTS"); }

static int activation_mask(int version) {
  int mask = TFO_PROFILE_COLL;
  const char *e = child_events_env();
  if (e && e[0] == '0') return mask;
  mask |= TFO_PROFILE_PROXY_OP;
  if (version >= 3) mask |= TFO_PROFILE_KERNEL_CH;
  return mask;
}

static ncclResult_t core_init(void **context, int *mask, int version, int have_hash,
                              uint64_t hash, int nranks, int rank) {
  *context = NULL;
  if (mask) *mask = 0;
  pthread_mutex_lock(&g_mu);
  int ok = ring_open_locked() == 0;
  if (ok) g_contexts++;
  pthread_mutex_unlock(&g_mu);
  if (!ok) return ncclSuccess; /* no ring: stay loaded but ask for no events */
  tfo_ctx *ctx = (tfo_ctx *)calloc(1, sizeof(tfo_ctx));
  if (!ctx) {
    pthread_mutex_lock(&g_mu);
    g_contexts--;
    pthread_mutex_unlock(&g_mu);
    return ncclSuccess;
  }
  ctx->version = version;
  ctx->have_comm_hash = have_hash;
  ctx->comm_hash = hash;
  ctx->nranks = nranks;
  ctx->rank = rank;
  for (int i = 0; i < COLL_SLOTS; i++) ctx->colls[i].kind = KIND_COLL;
  for (int i = 0; i < CHILD_SLOTS; i++) ctx->children[i].kind = KIND_CHILD;
  if (g_ring && version > (int)g_ring->api_version) g_ring->api_version = (uint32_t)version;
  *context = ctx;
  if (mask) *mask = activation_mask(version);
  return ncclSuccess;
}

static coll_slot *as_coll(tfo_ctx *ctx, void *p) {
  if (!p || !ctx) return NULL;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)&ctx->colls[0];
  uintptr_t hi = (uintptr_t)&ctx->colls[COLL_SLOTS];
  if (a < lo || a >= hi || (a - lo) % sizeof(coll_slot) != 0) return NULL;
  return (coll_slot *)p;
}

static void start_coll(tfo_ctx *ctx, void **handle, const tfo_event *e) {
  coll_slot *s = NULL;
  for (int tries = 0; tries < 8 && !s; tries++) { /* a slot whose coll is fully written */
    unsigned i = __atomic_fetch_add(&ctx->coll_next, 1, __ATOMIC_RELAXED) % COLL_SLOTS;
    slot_lock(&ctx->colls[i]);
    if (ctx->colls[i].refs == 0)
      s = &ctx->colls[i]; /* stays locked */
    else
      slot_unlock(&ctx->colls[i]);
  }
  if (!s) {
    ring_drop();
    return;
  }
  tfo_coll_record *r = &s->rec;
  memset(r, 0, sizeof(*r));
  r->comm_hash = e->have_comm_hash ? e->comm_hash : ctx->comm_hash;
  r->seq = e->seq;
  r->start_ns = now_ns();
  r->count = e->count;
  r->bytes = e->traffic_bytes;
  r->rank = e->rank;
  r->nranks = ctx->nranks;
  r->root = e->root;
  r->nchannels = e->nchannels;
  r->nwarps = e->nwarps;
  r->api_version = (uint8_t)ctx->version;
  copy_str(r->func, sizeof(r->func), e->func);
  copy_str(r->dtype, sizeof(r->dtype), e->dtype);
  copy_str(r->algo, sizeof(r->algo), e->algo);
  copy_str(r->proto, sizeof(r->proto), e->proto);
  copy_str(r->op, sizeof(r->op), e->op);
  s->ctx = ctx;
  s->refs = 1;
  s->valid = 1;
  slot_unlock(s);
  *handle = s;
}

static void start_child(tfo_ctx *ctx, void **handle, const tfo_event *e) {
  coll_slot *parent = e->foreign ? NULL : as_coll(ctx, e->parent);
  if (!parent) return;
  child_slot *c = NULL;
  for (int tries = 0; tries < 8 && !c; tries++) {
    unsigned i = __atomic_fetch_add(&ctx->child_next, 1, __ATOMIC_RELAXED) % CHILD_SLOTS;
    int expect = 0;
    if (__atomic_compare_exchange_n(&ctx->children[i].in_use, &expect, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED))
      c = &ctx->children[i];
  }
  if (!c) {
    ring_drop();
    return;
  }
  slot_lock(parent);
  if (!parent->valid) {
    slot_unlock(parent);
    __atomic_store_n(&c->in_use, 0, __ATOMIC_RELEASE);
    return;
  }
  parent->refs++;
  parent->rec.nchildren++;
  parent->rec.flags |= TFO_FLAG_CHILD_TIMING;
  if (e->type == TFO_PROFILE_KERNEL_CH && e->ptimer &&
      (parent->rec.gpu_start == 0 || e->ptimer < parent->rec.gpu_start))
    parent->rec.gpu_start = e->ptimer;
  slot_unlock(parent);
  c->parent = parent;
  *handle = c;
}

static ncclResult_t core_start(void *context, void **handle, const tfo_event *e) {
  if (handle) *handle = NULL;
  tfo_ctx *ctx = (tfo_ctx *)context;
  if (!ctx || !handle || !e) return ncclSuccess;
  if (e->type == TFO_PROFILE_COLL)
    start_coll(ctx, handle, e);
  else if (e->type == TFO_PROFILE_PROXY_OP || e->type == TFO_PROFILE_KERNEL_CH)
    start_child(ctx, handle, e);
  return ncclSuccess; /* other types (groups, API events, p2p): no handle */
}

static ncclResult_t tfo_stop(void *handle) {
  if (!handle) return ncclSuccess;
  uint64_t t = now_ns();
  int kind = *(int *)handle;
  if (kind == KIND_COLL) {
    coll_slot *s = (coll_slot *)handle;
    slot_lock(s);
    s->rec.enqueued_ns = t;
    slot_unlock(s);
    coll_release(s, t);
  } else if (kind == KIND_CHILD) {
    child_slot *c = (child_slot *)handle;
    coll_slot *p = c->parent;
    c->parent = NULL;
    __atomic_store_n(&c->in_use, 0, __ATOMIC_RELEASE);
    if (p) coll_release(p, t);
  }
  return ncclSuccess;
}

static ncclResult_t record_state_v4(void *handle, int state, tfo_state_args_v4_t *args) {
  if (!handle || state != TFO_STATE_KERNEL_CH_STOP || !args) return ncclSuccess;
  if (*(int *)handle != KIND_CHILD) return ncclSuccess;
  coll_slot *p = ((child_slot *)handle)->parent;
  if (!p) return ncclSuccess;
  slot_lock(p);
  if (args->kernelCh.pTimer > p->rec.gpu_end) p->rec.gpu_end = args->kernelCh.pTimer;
  slot_unlock(p);
  return ncclSuccess;
}

static ncclResult_t record_state_v1(void *handle, int state, tfo_state_args_v1_t *args) {
  (void)handle;
  (void)state;
  (void)args;
  return ncclSuccess;
}

static ncclResult_t tfo_finalize(void *context) {
  tfo_ctx *ctx = (tfo_ctx *)context;
  if (!ctx) return ncclSuccess;
  /* flush collectives whose children never stopped (communicator torn down mid-flight) */
  for (int i = 0; i < COLL_SLOTS; i++) {
    coll_slot *s = &ctx->colls[i];
    slot_lock(s);
    if (s->valid && s->refs > 0) {
      s->rec.flags |= TFO_FLAG_FLUSHED;
      ring_write(&s->rec);
    }
    s->refs = 0;
    s->valid = 0;
    slot_unlock(s);
  }
  free(ctx);
  pthread_mutex_lock(&g_mu);
  if (--g_contexts <= 0 && g_ring) { /* the file stays for the reader, which unlinks it */
    munmap(g_ring, g_ring_bytes);
    g_ring = NULL;
    g_contexts = 0;
  }
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}

/* ---- v1: enum codes -> names (ncclFunc_t, ncclDataType_t, ncclRedOp_t, NCCL_ALGO/PROTO) ---- */
static const char *pick(const char *const *names, size_t n, unsigned v) {
  return v < n ? names[v] : "unknown";
}
static const char *const V1_FUNCS[] = {"Broadcast", "Reduce",   "AllGather", "ReduceScatter",
                                       "AllReduce", "SendRecv", "Send",      "Recv"};
static const char *const V1_TYPES[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32",
                                       "ncclInt64",   "ncclUint64",  "ncclFloat16", "ncclFloat32",
                                       "ncclFloat64", "ncclBfloat16"};
static const char *const V1_OPS[] = {"Sum", "Prod", "Max", "Min", "Avg"};
static const char *const V1_ALGOS[] = {"Tree", "Ring",     "CollNetDirect", "CollNetChain",
                                       "NVLS", "NVLSTree", "PAT"};
static const char *const V1_PROTOS[] = {"LL", "LL128", "Simple"};
#define N(a) (sizeof(a) / sizeof((a)[0]))

static ncclResult_t init_v1(void **context, int *mask) {
  return core_init(context, mask, 1, 0, 0, 0, -1);
}
static ncclResult_t init_v2(void **context, int *mask) {
  return core_init(context, mask, 2, 0, 0, 0, -1);
}
static ncclResult_t init_v3(void **context, int *mask) {
  return core_init(context, mask, 3, 0, 0, 0, -1);
}
static ncclResult_t init_v4(void **context, int *mask, const char *name, uint64_t hash,
                            int nNodes, int nranks, int rank, tfo_nccl_logger_t logfn) {
  (void)name;
  (void)nNodes;
  (void)logfn;
  return core_init(context, mask, 4, 1, hash, nranks, rank);
}
static ncclResult_t init_v5(void **context, uint64_t commId, int *mask, const char *name,
                            int nNodes, int nranks, int rank, tfo_nccl_logger_t logfn) {
  (void)name;
  (void)nNodes;
  (void)logfn;
  return core_init(context, mask, 5, 1, commId, nranks, rank);
}

#define COMMON_HEAD(d)    \
  tfo_event e;            \
  memset(&e, 0, sizeof e); \
  e.type = (d)->type;     \
  e.parent = (d)->parentObj; \
  e.rank = (d)->rank;

#define PROXY_FOREIGN(d) \
  if (e.type == TFO_PROFILE_PROXY_OP) e.foreign = (d)->proxyOp.pid != getpid();

static ncclResult_t start_v1(void *ctx, void **h, tfo_descr_v1_t *d) {
  if (!d) return core_start(ctx, h, NULL);
  COMMON_HEAD(d)
  PROXY_FOREIGN(d)
  if (e.type == TFO_PROFILE_COLL) {
    e.have_comm_hash = 1;
    e.comm_hash = d->coll.commHash;
    e.seq = d->coll.seqNumber;
    e.func = pick(V1_FUNCS, N(V1_FUNCS), d->coll.func);
    e.dtype = pick(V1_TYPES, N(V1_TYPES), d->coll.datatype);
    e.op = pick(V1_OPS, N(V1_OPS), d->coll.op);
    e.algo = pick(V1_ALGOS, N(V1_ALGOS), d->coll.algo);
    e.proto = pick(V1_PROTOS, N(V1_PROTOS), d->coll.proto);
    e.count = d->coll.count;
    e.traffic_bytes = d->coll.trafficBytes;
    e.root = d->coll.root;
    e.nchannels = d->coll.nMaxChannels;
    e.nwarps = d->coll.nWarps;
  }
  return core_start(ctx, h, &e);
}

static ncclResult_t start_v2(void *ctx, void **h, tfo_descr_v2_t *d) {
  if (!d) return core_start(ctx, h, NULL);
  COMMON_HEAD(d)
  PROXY_FOREIGN(d)
  if (e.type == TFO_PROFILE_COLL) {
    e.have_comm_hash = 1;
    e.comm_hash = d->coll.commHash;
    e.seq = d->coll.seqNumber;
    e.func = d->coll.func;
    e.dtype = d->coll.datatype;
    e.algo = d->coll.algo;
    e.proto = d->coll.proto;
    e.count = d->coll.count;
    e.traffic_bytes = d->coll.trafficBytes;
    e.root = d->coll.root;
    e.nchannels = d->coll.nMaxChannels;
    e.nwarps = d->coll.nWarps;
  }
  return core_start(ctx, h, &e);
}

static ncclResult_t start_v3(void *ctx, void **h, tfo_descr_v3_t *d) {
  if (!d) return core_start(ctx, h, NULL);
  COMMON_HEAD(d)
  PROXY_FOREIGN(d)
  if (e.type == TFO_PROFILE_COLL) {
    e.have_comm_hash = 1;
    e.comm_hash = d->coll.commHash;
    e.seq = d->coll.seqNumber;
    e.func = d->coll.func;
    e.dtype = d->coll.datatype;
    e.algo = d->coll.algo;
    e.proto = d->coll.proto;
    e.count = d->coll.count;
    e.root = d->coll.root;
    e.nchannels = d->coll.nMaxChannels;
    e.nwarps = d->coll.nWarps;
  }
  return core_start(ctx, h, &e);
}

static ncclResult_t start_v4(void *ctx, void **h, tfo_descr_v4_t *d) {
  if (!d) return core_start(ctx, h, NULL);
  COMMON_HEAD(d)
  PROXY_FOREIGN(d)
  if (e.type == TFO_PROFILE_COLL) {
    e.seq = d->coll.seqNumber;
    e.func = d->coll.func;
    e.dtype = d->coll.datatype;
    e.algo = d->coll.algo;
    e.proto = d->coll.proto;
    e.count = d->coll.count;
    e.root = d->coll.root;
    e.nchannels = d->coll.nChannels;
    e.nwarps = d->coll.nWarps;
  } else if (e.type == TFO_PROFILE_KERNEL_CH) {
    e.ptimer = d->kernelCh.pTimer;
  }
  return core_start(ctx, h, &e);
}

static ncclResult_t start_v5(void *ctx, void **h, tfo_descr_v5_t *d) {
  if (!d) return core_start(ctx, h, NULL);
  COMMON_HEAD(d)
  PROXY_FOREIGN(d)
  if (e.type == TFO_PROFILE_COLL) {
    e.seq = d->coll.seqNumber;
    e.func = d->coll.func;
    e.dtype = d->coll.datatype;
    e.algo = d->coll.algo;
    e.proto = d->coll.proto;
    e.count = d->coll.count;
    e.root = d->coll.root;
    e.nchannels = d->coll.nChannels;
    e.nwarps = d->coll.nWarps;
  } else if (e.type == TFO_PROFILE_KERNEL_CH) {
    e.ptimer = d->kernelCh.pTimer;
  }
  return core_start(ctx, h, &e);
}

TFO_EXPORT const tfo_profiler_v1_t ncclProfiler_v1 = {"tf_otel", init_v1, start_v1, tfo_stop,
                                                      record_state_v1, tfo_finalize};
TFO_EXPORT const tfo_profiler_v2_t ncclProfiler_v2 = {"tf_otel", init_v2, start_v2, tfo_stop,
                                                      record_state_v1, tfo_finalize};
TFO_EXPORT const tfo_profiler_v3_t ncclProfiler_v3 = {"tf_otel", init_v3, start_v3, tfo_stop,
                                                      record_state_v1, tfo_finalize};
TFO_EXPORT const tfo_profiler_v4_t ncclProfiler_v4 = {"tf_otel", init_v4, start_v4, tfo_stop,
                                                      record_state_v4, tfo_finalize};
TFO_EXPORT const tfo_profiler_v5_t ncclProfiler_v5 = {"tf_otel", init_v5, start_v5, tfo_stop,
                                                      record_state_v4, tfo_finalize};

/* For tf_otel and tests: the ring file this process writes ("" before the first init). */
TFO_EXPORT const char *tf_otel_nccl_ring_path(void) { return g_ring_path; }
