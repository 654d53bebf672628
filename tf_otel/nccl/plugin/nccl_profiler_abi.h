/*
 * The NCCL profiler plugin ABI (ncclProfiler_v1 .. ncclProfiler_v5), declared for tf_otel.
 *
 * Written from the documented structure in the NCCL repository (ext-profiler/README.md and
 * ext-profiler/example/nccl/profiler_vN.h): same members, same order, so the same layout.
 * v1: NCCL 2.23, v2: 2.24, v3: 2.25, v4: 2.26/2.27, v5: 2.28+ (newer NCCL still loads v5).
 * When nccl.h is on the include path (TF_OTEL_WITH_NCCL_H) its ncclResult_t is used and the
 * values below are checked against it at compile time.
 */
#ifndef TF_OTEL_NCCL_PROFILER_ABI_H_
#define TF_OTEL_NCCL_PROFILER_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef TF_OTEL_WITH_NCCL_H
#include <nccl.h>
_Static_assert(ncclSuccess == 0, "ncclSuccess");
_Static_assert(ncclInternalError == 3, "ncclInternalError");
#else
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
#endif

/* NCCL's logger callback (level is the ncclDebugLogLevel enum). */
typedef void (*tfo_nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

/* Event type bits (the same values in every version). */
enum {
  TFO_PROFILE_GROUP = 1 << 0,
  TFO_PROFILE_COLL = 1 << 1,
  TFO_PROFILE_P2P = 1 << 2,
  TFO_PROFILE_PROXY_OP = 1 << 3,
  TFO_PROFILE_PROXY_STEP = 1 << 4,
  TFO_PROFILE_PROXY_CTRL = 1 << 5,
  TFO_PROFILE_KERNEL_CH = 1 << 6, /* v3+ */
  TFO_PROFILE_NET_PLUGIN = 1 << 7,
  TFO_PROFILE_GROUP_API = 1 << 8, /* v5+ */
  TFO_PROFILE_COLL_API = 1 << 9,
  TFO_PROFILE_P2P_API = 1 << 10,
  TFO_PROFILE_KERNEL_LAUNCH = 1 << 11,
};

/* ncclProfilerEventState_vN_t is an int-sized enum; only this value is used here (v4+). */
#define TFO_STATE_KERNEL_CH_STOP 22

/* The proxyOp / proxyStep members, identical in v1..v5. */
struct tfo_proxy_op {
  pid_t pid;
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
};

/* ---- v1 (NCCL 2.23): enums as integers ---- */
typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      const char *name;
      uint64_t commHash;
      uint64_t seqNumber;
      uint8_t func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      uint8_t datatype;
      uint32_t op;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      uint8_t algo;
      uint8_t proto;
      int isCollnet;
      int isNvls;
    } coll;
    struct {
      const char *name;
      uint64_t commHash;
      uint8_t func;
      void *buff;
      uint8_t datatype;
      size_t count;
      int peer;
    } p2p;
    struct tfo_proxy_op proxyOp;
    struct {
      int step;
    } proxyStep;
  };
} tfo_descr_v1_t;

/* ---- v2 (NCCL 2.24): strings, trafficBytes ---- */
typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      const char *name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *name;
      uint64_t commHash;
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
    } p2p;
    struct tfo_proxy_op proxyOp;
    struct {
      int step;
    } proxyStep;
  };
} tfo_descr_v2_t;

/* ---- v3 (NCCL 2.25): no trafficBytes, kernelCh events ---- */
typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      const char *name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *name;
      uint64_t commHash;
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
    } p2p;
    struct tfo_proxy_op proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} tfo_descr_v3_t;

/* ---- v4 (NCCL 2.26): commHash moves to init, kernelCh carries a GPU timer ---- */
typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct tfo_proxy_op proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} tfo_descr_v4_t;

/* ---- v5 (NCCL 2.28): 64-bit type, API events ---- */
typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      int graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      int root;
      void *stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void *stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
      void *parentGroup;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void *parentGroup;
    } p2p;
    struct tfo_proxy_op proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} tfo_descr_v5_t;

/* State arguments: v1..v3 share one layout, v4/v5 another. Only kernelCh.pTimer is read. */
typedef union {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} tfo_state_args_v1_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void *data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} tfo_state_args_v4_t;

/* The exported structs NCCL looks up by name (ncclProfiler_vN). */
typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, int *eActivationMask);
  ncclResult_t (*startEvent)(void *context, void **eHandle, tfo_descr_v1_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, int eState, tfo_state_args_v1_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} tfo_profiler_v1_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, int *eActivationMask);
  ncclResult_t (*startEvent)(void *context, void **eHandle, tfo_descr_v2_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, int eState, tfo_state_args_v1_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} tfo_profiler_v2_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, int *eActivationMask);
  ncclResult_t (*startEvent)(void *context, void **eHandle, tfo_descr_v3_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, int eState, tfo_state_args_v1_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} tfo_profiler_v3_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, int *eActivationMask, const char *commName,
                       uint64_t commHash, int nNodes, int nranks, int rank,
                       tfo_nccl_logger_t logfn);
  ncclResult_t (*startEvent)(void *context, void **eHandle, tfo_descr_v4_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, int eState, tfo_state_args_v4_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} tfo_profiler_v4_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                       const char *commName, int nNodes, int nranks, int rank,
                       tfo_nccl_logger_t logfn);
  ncclResult_t (*startEvent)(void *context, void **eHandle, tfo_descr_v5_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, int eState, tfo_state_args_v4_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} tfo_profiler_v5_t;

#endif /* TF_OTEL_NCCL_PROFILER_ABI_H_ */
