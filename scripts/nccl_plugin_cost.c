/*
 * The tf_otel NCCL profiler plugin's own CPU cost per collective, without NCCL or a GPU: the
 * calls NCCL 2.28 makes for one collective (as seen on an H100, docs/guides/NCCL.md), in a loop.
 *
 *   gcc -O2 -std=c11 -Itf_otel/nccl/plugin -o /tmp/nccl_plugin_cost scripts/nccl_plugin_cost.c -ldl
 *   TF_OTEL_NCCL_RING_DIR=/tmp /tmp/nccl_plugin_cost tf_otel/nccl/plugin/libnccl-profiler-tf_otel.so
 *
 * Per collective, in the order NCCL 2.28.9 made them on an H100 (the first ring record of each
 * collective has no child yet): Coll start, Coll stop (ring write 1), 2 ProxyOp + 2 KernelCh
 * starts (children of the Coll), KernelCh stop states with GPU timers, child stops (ring write 2
 * at the last). Also prints what one clock_gettime(CLOCK_REALTIME) costs here: the plugin reads
 * the clock at every start and stop.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [COLLECTIVES]\n", argv[0]);
    return 2;
  }
  long n = argc > 2 ? atol(argv[2]) : 1000000;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const tfo_profiler_v5_t *p = (const tfo_profiler_v5_t *)dlsym(lib, "ncclProfiler_v5");
  if (!p) {
    fprintf(stderr, "no ncclProfiler_v5\n");
    return 1;
  }
  void *ctx = NULL;
  int mask = 0;
  p->init(&ctx, 0x1234abcdULL, &mask, "bench", 2, 2, 0, NULL);
  if (!ctx) {
    fprintf(stderr, "init gave no context (ring not created?)\n");
    return 1;
  }
  tfo_descr_v5_t coll, child;
  memset(&coll, 0, sizeof coll);
  coll.type = TFO_PROFILE_COLL;
  coll.coll.func = "AllReduce";
  coll.coll.datatype = "ncclFloat32";
  coll.coll.algo = "RING";
  coll.coll.proto = "LL";
  coll.coll.count = 1024;
  coll.coll.nChannels = 2;
  coll.coll.nWarps = 16;
  tfo_state_args_v4_t st;
  memset(&st, 0, sizeof st);
  double best = 1e9;
  for (int round = 0; round < 5; round++) {
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
      void *hc = NULL, *hk[4] = {0};
      coll.coll.seqNumber = (uint64_t)i;
      p->startEvent(ctx, &hc, &coll);
      p->stopEvent(hc);
      for (int c = 0; c < 4; c++) {
        memset(&child, 0, sizeof child);
        child.parentObj = hc;
        if (c < 2) {
          child.type = TFO_PROFILE_PROXY_OP;
          child.proxyOp.pid = getpid();
          child.proxyOp.channelId = (uint8_t)c;
        } else {
          child.type = TFO_PROFILE_KERNEL_CH;
          child.kernelCh.channelId = (uint8_t)(c - 2);
          child.kernelCh.pTimer = 1000 + (uint64_t)i;
        }
        p->startEvent(ctx, &hk[c], &child);
      }
      for (int c = 0; c < 4; c++) {
        if (c >= 2) {
          st.kernelCh.pTimer = 5000 + (uint64_t)i;
          p->recordEventState(hk[c], TFO_STATE_KERNEL_CH_STOP, &st);
        }
        p->stopEvent(hk[c]);
      }
    }
    double dt = (now_s() - t0) / (double)n;
    if (dt < best) best = dt;
    printf("round %d: %.1f ns per collective (9 calls, 2 ring records)\n", round, dt * 1e9);
  }
  printf("best: %.1f ns per collective\n", best * 1e9);
  struct timespec ts;
  double t0 = now_s();
  for (long i = 0; i < n; i++) clock_gettime(CLOCK_REALTIME, &ts);
  printf("clock_gettime(CLOCK_REALTIME): %.1f ns\n", (now_s() - t0) / (double)n * 1e9);
  p->finalize(ctx);
  return 0;
}
