/* graphkernel's fixed shim over oneDNN's C API (backends/c/onednn.py builds it once per
   oneDNN version and compiler into the kernel cache, against the `onednn-devel` headers).

   A forward float32 convolution, NCHW in and out (our layout), weights reordered once into the
   primitive's preferred format by the caller's workspace. With G_BLOCKED the primitive works
   on oneDNN's preferred (blocked) activation formats, and each call reorders the input into a
   scratch buffer of the calling thread and the result back out of one. Primitives are made once per process
   per geometry (a table under a mutex) and never per call; generated kernels keep the handle
   (backends/c/c_window.py). Each calling thread has its own stream. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "oneapi/dnnl/dnnl.h"

/* The geometry a caller describes, in this order (onednn.py GEOMETRY). */
enum { G_N, G_C, G_H, G_W, G_O, G_KH, G_KW, G_GROUPS, G_SH, G_SW, G_DH, G_DW, G_PT, G_PB,
       G_PL, G_PR, G_OH, G_OW, G_BLOCKED, G_COUNT };

typedef struct gk_dnnl_conv {
  int64_t geometry[G_COUNT];
  dnnl_primitive_t conv;
  dnnl_primitive_t reorder;  /* user weights (goihw) -> the primitive's format */
  dnnl_primitive_t src_in, dst_out;  /* G_BLOCKED: NCHW -> the primitive's src, dst -> NCHW */
  dnnl_memory_desc_t src, user_weights, dst;  /* NCHW, goihw, NCHW */
  const_dnnl_memory_desc_t weights, conv_src, conv_dst;  /* owned by `pd` */
  size_t src_bytes, dst_bytes;  /* G_BLOCKED: the scratch of each */
  dnnl_primitive_desc_t pd;
  char impl[128];
  struct gk_dnnl_conv *next;
} gk_dnnl_conv;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static gk_dnnl_conv *table = NULL;
static dnnl_engine_t engine = NULL;
static dnnl_status_t engine_status = dnnl_success;
static pid_t engine_pid = 0;  /* the process whose runtime threads the engine uses */
static __thread dnnl_stream_t stream = NULL;
static __thread char *scratch = NULL;  /* G_BLOCKED's activations, grown as needed */
static __thread size_t scratch_bytes = 0;

static void note(char *err, int len, const char *what, dnnl_status_t status) {
  if (err != NULL && len > 0) snprintf(err, (size_t)len, "%s failed (dnnl_status %d)", what,
                                       (int)status);
}

#define TRY(call, what) do { dnnl_status_t s_ = (call); \
  if (s_ != dnnl_success) { note(err, errlen, what, s_); goto fail; } } while (0)

/* The engine, made once (under table_lock). */
static int have_engine(char *err, int errlen) {
  if (engine == NULL && engine_status == dnnl_success) {
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
    if (engine_status != dnnl_success) engine = NULL;
    engine_pid = getpid();
  }
  if (engine == NULL) note(err, errlen, "dnnl_engine_create(cpu)", engine_status);
  return engine != NULL;
}

static gk_dnnl_conv *make(const int64_t *g, char *err, int errlen) {
  gk_dnnl_conv *cv = calloc(1, sizeof *cv);
  dnnl_memory_desc_t any_weights = NULL, any_src = NULL, any_dst = NULL;
  dnnl_primitive_desc_t rpd = NULL, in_pd = NULL, out_pd = NULL;
  if (cv == NULL) { note(err, errlen, "calloc", dnnl_out_of_memory); return NULL; }
  memcpy(cv->geometry, g, sizeof cv->geometry);
  const int64_t groups = g[G_GROUPS];
  dnnl_dims_t src = {g[G_N], g[G_C], g[G_H], g[G_W]};
  dnnl_dims_t dst = {g[G_N], g[G_O], g[G_OH], g[G_OW]};
  dnnl_dims_t wts = {groups, g[G_O] / groups, g[G_C] / groups, g[G_KH], g[G_KW]};
  dnnl_dims_t strides = {g[G_SH], g[G_SW]};
  dnnl_dims_t dilates = {g[G_DH] - 1, g[G_DW] - 1};  /* oneDNN counts dilation from 0 */
  dnnl_dims_t pad_l = {g[G_PT], g[G_PL]}, pad_r = {g[G_PB], g[G_PR]};
  TRY(dnnl_memory_desc_create_with_tag(&cv->src, 4, src, dnnl_f32, dnnl_nchw), "src desc");
  TRY(dnnl_memory_desc_create_with_tag(&cv->dst, 4, dst, dnnl_f32, dnnl_nchw), "dst desc");
  TRY(dnnl_memory_desc_create_with_tag(&cv->user_weights, 5, wts, dnnl_f32, dnnl_goihw),
      "weights desc");
  TRY(dnnl_memory_desc_create_with_tag(&any_weights, 5, wts, dnnl_f32, dnnl_format_tag_any),
      "weights desc (any)");
  const int blocked = g[G_BLOCKED] != 0;
  if (blocked) {
    TRY(dnnl_memory_desc_create_with_tag(&any_src, 4, src, dnnl_f32, dnnl_format_tag_any),
        "src desc (any)");
    TRY(dnnl_memory_desc_create_with_tag(&any_dst, 4, dst, dnnl_f32, dnnl_format_tag_any),
        "dst desc (any)");
  }
  TRY(dnnl_convolution_forward_primitive_desc_create(
          &cv->pd, engine, dnnl_forward_inference, dnnl_convolution_direct,
          blocked ? any_src : cv->src, any_weights, NULL, blocked ? any_dst : cv->dst, strides,
          dilates, pad_l, pad_r, NULL),
      "convolution primitive descriptor");
  cv->weights = dnnl_primitive_desc_query_md(cv->pd, dnnl_query_weights_md, 0);
  cv->conv_src = dnnl_primitive_desc_query_md(cv->pd, dnnl_query_src_md, 0);
  cv->conv_dst = dnnl_primitive_desc_query_md(cv->pd, dnnl_query_dst_md, 0);
  if (blocked) {
    TRY(dnnl_reorder_primitive_desc_create(&in_pd, cv->src, engine, cv->conv_src, engine, NULL),
        "src reorder descriptor");
    TRY(dnnl_primitive_create(&cv->src_in, in_pd), "src reorder primitive");
    TRY(dnnl_reorder_primitive_desc_create(&out_pd, cv->conv_dst, engine, cv->dst, engine,
                                           NULL), "dst reorder descriptor");
    TRY(dnnl_primitive_create(&cv->dst_out, out_pd), "dst reorder primitive");
    /* 64-byte multiples: the dst scratch follows the src scratch, aligned */
    cv->src_bytes = (dnnl_memory_desc_get_size(cv->conv_src) + 63) & ~(size_t)63;
    cv->dst_bytes = (dnnl_memory_desc_get_size(cv->conv_dst) + 63) & ~(size_t)63;
  }
  TRY(dnnl_primitive_create(&cv->conv, cv->pd), "convolution primitive");
  TRY(dnnl_reorder_primitive_desc_create(&rpd, cv->user_weights, engine, cv->weights, engine,
                                         NULL), "weights reorder descriptor");
  TRY(dnnl_primitive_create(&cv->reorder, rpd), "weights reorder primitive");
  dnnl_primitive_desc_destroy(rpd);
  if (in_pd != NULL) dnnl_primitive_desc_destroy(in_pd);
  if (out_pd != NULL) dnnl_primitive_desc_destroy(out_pd);
  dnnl_memory_desc_destroy(any_weights);
  if (any_src != NULL) dnnl_memory_desc_destroy(any_src);
  if (any_dst != NULL) dnnl_memory_desc_destroy(any_dst);
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(cv->pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
      impl != NULL)
    snprintf(cv->impl, sizeof cv->impl, "%s", impl);
  return cv;
fail:
  if (rpd != NULL) dnnl_primitive_desc_destroy(rpd);
  if (in_pd != NULL) dnnl_primitive_desc_destroy(in_pd);
  if (out_pd != NULL) dnnl_primitive_desc_destroy(out_pd);
  if (any_weights != NULL) dnnl_memory_desc_destroy(any_weights);
  if (any_src != NULL) dnnl_memory_desc_destroy(any_src);
  if (any_dst != NULL) dnnl_memory_desc_destroy(any_dst);
  if (cv->src_in != NULL) dnnl_primitive_destroy(cv->src_in);
  if (cv->dst_out != NULL) dnnl_primitive_destroy(cv->dst_out);
  if (cv->reorder != NULL) dnnl_primitive_destroy(cv->reorder);
  if (cv->conv != NULL) dnnl_primitive_destroy(cv->conv);
  if (cv->pd != NULL) dnnl_primitive_desc_destroy(cv->pd);
  if (cv->src != NULL) dnnl_memory_desc_destroy(cv->src);
  if (cv->dst != NULL) dnnl_memory_desc_destroy(cv->dst);
  if (cv->user_weights != NULL) dnnl_memory_desc_destroy(cv->user_weights);
  free(cv);
  return NULL;
}

/* The primitive for this geometry (G_COUNT numbers), made on its first request; NULL with the
   reason in err when oneDNN cannot make it. */
gk_dnnl_conv *gk_dnnl_conv_get(const int64_t *geometry, char *err, int errlen) {
  pthread_mutex_lock(&table_lock);
  gk_dnnl_conv *cv = table;
  while (cv != NULL && memcmp(cv->geometry, geometry, sizeof cv->geometry) != 0) cv = cv->next;
  if (cv == NULL && have_engine(err, errlen)) {
    cv = make(geometry, err, errlen);
    if (cv != NULL) { cv->next = table; table = cv; }
  }
  pthread_mutex_unlock(&table_lock);
  return cv;
}

int64_t gk_dnnl_conv_weights_bytes(const gk_dnnl_conv *cv) {
  return (int64_t)dnnl_memory_desc_get_size(cv->weights);
}

const char *gk_dnnl_conv_impl(const gk_dnnl_conv *cv) { return cv->impl; }

static dnnl_status_t my_stream(void) {
  if (stream != NULL) return dnnl_success;
  return dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
}

/* Run `prim` on memories over the given pointers (wrapped per call: a few microseconds).
   GK_DNNL_FORKED in a forked child: the runtime's threads (TBB's, SYCL's) stayed in the
   parent, and a call would wait for them forever. */
enum { GK_DNNL_FORKED = -2 };
static int execute(dnnl_primitive_t prim, int n, const int *kinds,
                   const_dnnl_memory_desc_t *descs, void **data) {
  if (getpid() != engine_pid) {
    static int told = 0;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_ACQ_REL))
      fprintf(stderr, "graphkernel: oneDNN's threads do not survive fork(): this child "
                      "process runs graphkernel's own convolution kernels\n");
    return GK_DNNL_FORKED;
  }
  dnnl_memory_t mem[3] = {NULL, NULL, NULL};
  dnnl_exec_arg_t args[3];
  dnnl_status_t s = my_stream();
  for (int i = 0; i < n && s == dnnl_success; ++i) {
    s = dnnl_memory_create(&mem[i], descs[i], engine, data[i]);
    args[i].arg = kinds[i];
    args[i].memory = mem[i];
  }
  if (s == dnnl_success) s = dnnl_primitive_execute(prim, stream, n, args);
  /* the memories go below: the stream must be done with them */
  if (s == dnnl_success) s = dnnl_stream_wait(stream);
  for (int i = 0; i < n; ++i)
    if (mem[i] != NULL) dnnl_memory_destroy(mem[i]);
  return (int)s;
}

/* Reorder weights [O][C/groups][KH][KW] into `packed` (gk_dnnl_conv_weights_bytes). */
int gk_dnnl_conv_pack(gk_dnnl_conv *cv, const float *weights, void *packed) {
  const int kinds[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
  const_dnnl_memory_desc_t descs[2] = {cv->user_weights, cv->weights};
  void *data[2] = {(void *)weights, packed};
  return execute(cv->reorder, 2, kinds, descs, data);
}

/* The convolution of x (NCHW) with packed weights into out (NCHW); 0 on success. */
int gk_dnnl_conv_run(gk_dnnl_conv *cv, const float *x, const void *packed, float *out) {
  const int kinds[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  if (cv->src_in == NULL) {
    const_dnnl_memory_desc_t descs[3] = {cv->src, cv->weights, cv->dst};
    void *data[3] = {(void *)x, (void *)packed, out};
    return execute(cv->conv, 3, kinds, descs, data);
  }
  const size_t need = cv->src_bytes + cv->dst_bytes;
  if (scratch_bytes < need) {
    free(scratch);
    scratch = aligned_alloc(64, need);
    scratch_bytes = scratch != NULL ? need : 0;
    if (scratch == NULL) return (int)dnnl_out_of_memory;
  }
  char *bsrc = scratch, *bdst = scratch + cv->src_bytes;
  const int moves[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
  const_dnnl_memory_desc_t in_descs[2] = {cv->src, cv->conv_src};
  void *in_data[2] = {(void *)x, bsrc};
  const_dnnl_memory_desc_t descs[3] = {cv->conv_src, cv->weights, cv->conv_dst};
  void *data[3] = {bsrc, (void *)packed, bdst};
  const_dnnl_memory_desc_t out_descs[2] = {cv->conv_dst, cv->dst};
  void *out_data[2] = {bdst, out};
  int s = execute(cv->src_in, 2, moves, in_descs, in_data);
  if (s == 0) s = execute(cv->conv, 3, kinds, descs, data);
  if (s == 0) s = execute(cv->dst_out, 2, moves, out_descs, out_data);
  return s;
}
