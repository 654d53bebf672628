/*
 * The tf_otel NCCL ring: one mmap'd file per process, read by tf_otel/nccl/ring.py.
 * Little-endian, fixed layout; any change bumps TFO_RING_VERSION (and ring.py).
 *
 *   header (128 bytes) | capacity x record (192 bytes)
 *
 * A writer claims index i = write_index++ and fills record i % capacity, setting commit to 0
 * first and to i + 1 last; a reader accepts a record only if commit == i + 1 before and after
 * copying it. Old records are overwritten (the reader counts what it missed); events that
 * could not be recorded at all (full pools) are counted in `dropped`.
 */
#ifndef TF_OTEL_NCCL_RING_H_
#define TF_OTEL_NCCL_RING_H_

#include <stdint.h>

#define TFO_RING_MAGIC "TFOTNCL1"
#define TFO_RING_VERSION 1
#define TFO_RING_DEFAULT_RECORDS 16384
#define TFO_RING_MIN_RECORDS 64
#define TFO_RING_MAX_RECORDS (1 << 20)

#define TFO_FLAG_CHILD_TIMING 1 /* end_ns comes from ProxyOp / KernelCh events */
#define TFO_FLAG_FLUSHED 2      /* written at finalize with children still running */

typedef struct {
  char magic[8];           /* 0   "TFOTNCL1", written last */
  uint32_t version;        /* 8 */
  uint32_t header_size;    /* 12 */
  uint32_t record_size;    /* 16 */
  uint32_t capacity;       /* 20  records */
  uint64_t write_index;    /* 24  records ever claimed */
  uint64_t dropped;        /* 32  events not recorded */
  int32_t pid;             /* 40 */
  uint32_t api_version;    /* 44  highest ncclProfiler_vN NCCL initialised */
  uint64_t created_ns;     /* 48  CLOCK_REALTIME */
  uint8_t reserved[72];    /* 56 .. 128 */
} tfo_ring_header;

typedef struct {
  uint64_t commit;         /* 0   index + 1 when complete, 0 while written */
  uint64_t comm_hash;      /* 8 */
  uint64_t seq;            /* 16  seqNumber within the communicator */
  uint64_t start_ns;       /* 24  Coll startEvent */
  uint64_t enqueued_ns;    /* 32  Coll stopEvent (= enqueued) */
  uint64_t end_ns;         /* 40  last stop among the coll and its children */
  uint64_t count;          /* 48  elements */
  uint64_t bytes;          /* 56  trafficBytes (v1/v2), else 0: reader uses count x size */
  uint64_t gpu_start;      /* 64  first KernelCh GPU timer (v4+), 0 if none */
  uint64_t gpu_end;        /* 72  last KernelCh stop GPU timer (v4+), 0 if none */
  int32_t rank;            /* 80  rank in the communicator */
  int32_t nranks;          /* 84  (v4+, else 0) */
  int32_t root;            /* 88 */
  uint16_t nchildren;      /* 92 */
  uint8_t nchannels;       /* 94 */
  uint8_t nwarps;          /* 95 */
  uint8_t api_version;     /* 96 */
  uint8_t flags;           /* 97 */
  uint8_t reserved[6];     /* 98 */
  char func[20];           /* 104 */
  char dtype[20];          /* 124 */
  char algo[20];           /* 144 */
  char proto[12];          /* 164 */
  char op[12];             /* 176  (v1 only) */
  uint8_t tail[4];         /* 188 .. 192 */
} tfo_coll_record;

_Static_assert(sizeof(tfo_ring_header) == 128, "ring header layout");
_Static_assert(sizeof(tfo_coll_record) == 192, "ring record layout");

static inline tfo_coll_record *tfo_ring_records(tfo_ring_header *h) {
  return (tfo_coll_record *)((char *)h + sizeof(tfo_ring_header));
}

#endif /* TF_OTEL_NCCL_RING_H_ */
