/* bench/bench_kernels.c — fsdp-bench --kernel-profile: each kernel class's
 * time on the compute stream (fsdp/profile.h; CUDA events on a GPU, the host
 * clock on the CPU), next to what the class should cost (FLOPs and bytes,
 * fsdp_gpt2_kernel_costs or fsdp_llama_kernel_costs) and the device's peaks:
 * calls, ms and share of the step, achieved TF/s and GB/s, and the fraction
 * of the peak of the resource that bounds the class (the bf16 matrix-product
 * peak fsdp-bench measured, and HBM bandwidth from a datasheet table by device
 * name). Rank 0's times; the classes the model has (run or costed) only. */
#include <string.h>

#include "fsdp_bench.h"

void bench_products(const lm_t *lm, fsdp_stream_t s, fsdp_dtype_t dt, int rows, char *buf,
                    size_t n) {
  buf[0] = '\0';
  if (lm->kind != LM_GPT2) return;
  const int C = lm->gpt->n_embd, bias = FSDP_PRODUCT_BIAS;
  const struct { const char *name; int C, OC, flags; } layer[] = {
      {"qkv", C, 3 * C, bias}, {"attn proj", C, C, bias},
      {"fc", C, 4 * C, bias | FSDP_PRODUCT_GELU}, {"fc proj", 4 * C, C, bias | FSDP_PRODUCT_DGELU}};
  size_t k = 0;
  for (size_t i = 0; i < sizeof layer / sizeof layer[0] && k < n; i++) {
    char impl[320];
    if (fsdp_cuda_product_impl(s, dt, rows, layer[i].C, layer[i].OC, layer[i].flags, impl,
                               sizeof impl) != FSDP_SUCCESS) {
      snprintf(buf, n, "unknown: %s", fsdp_last_error());
      return;
    }
    const int w = snprintf(buf + k, n - k, "%s%s: %s", i ? "; " : "", layer[i].name, impl);
    k = w < 0 ? n : k + (size_t)w;
  }
}

int bench_kernels_collect(fsdp_engine_t eng, const lm_t *lm, int B, int T, int steps,
                          bench_result_t *r) {
  fsdp_kclass_time_t t[FSDP_KC_COUNT];
  if (r->kc_steps == 0) {
    const fsdp_config_t *c = fsdp_engine_config(eng);
    /* a GPU computes in bf16 with 16-bit parameters, else in fp32 */
    fsdp_dtype_t act = c->device == FSDP_DEVICE_CUDA && c->param_dtype == FSDP_BF16 ? FSDP_BF16
                                                                                    : FSDP_F32;
    BENCH_TRY(lm_kernel_costs(lm, B, T, c->grad_accum, act, r->kc_cost, FSDP_KC_COUNT));
    lm_layout_t y;
    lm_layout(lm, &y);
    r->hbm_bytes_per_s = c->device == FSDP_DEVICE_CUDA
                             ? bench_cuda_hbm(r->device_name, sizeof r->device_name) : 0.0;
    if (c->device != FSDP_DEVICE_CUDA) {
      snprintf(r->device_name, sizeof r->device_name, "cpu");
    } else {
      BENCH_TRY(fsdp_cuda_attention_impl(fsdp_engine_stream(eng), act, B, T, y.n_embd, y.n_head,
                                         y.n_kv_head, r->attention, sizeof r->attention));
      bench_products(lm, fsdp_engine_stream(eng), act, B * T, r->products, sizeof r->products);
    }
  }
  BENCH_TRY(fsdp_engine_profile_read(eng, t, FSDP_KC_COUNT));
  BENCH_TRY(fsdp_engine_profile(eng, 0));
  for (int k = 0; k < FSDP_KC_COUNT; k++) {
    r->kc[k].calls += t[k].calls;
    r->kc[k].seconds += t[k].seconds;
  }
  r->kc_steps += steps;
  return FSDP_SUCCESS;
}

/* A class the model has: its kernels ran, or it declares a cost. */
static int kc_listed(const bench_result_t *r, int k) {
  return r->kc[k].calls > 0 || r->kc_cost[k].flops > 0 || r->kc_cost[k].bytes > 0;
}

typedef struct {
  double calls, ms, share, tflops, gbps, of_peak; /* per step; of_peak < 0: peak unknown */
  const char *bound;
} kc_row_t;

static kc_row_t kc_row(const bench_result_t *r, int k) {
  const double steps = r->kc_steps, s = r->kc[k].seconds / steps;
  const double peak = r->peak_flops / (r->replicas * r->shard_size), hbm = r->hbm_bytes_per_s;
  const fsdp_kclass_cost_t *c = &r->kc_cost[k];
  kc_row_t w = {.calls = r->kc[k].calls / steps, .ms = s * 1e3,
                .share = r->step_s.median > 0 ? s / r->step_s.median : 0.0,
                .tflops = s > 0 ? c->flops / s / 1e12 : 0.0,
                .gbps = s > 0 ? c->bytes / s / 1e9 : 0.0, .of_peak = -1.0};
  /* the bound: the larger of the two floors, or what the class does at all */
  int compute = peak > 0 && hbm > 0 ? c->flops / peak >= c->bytes / hbm : c->flops > 0;
  w.bound = compute ? "compute" : "memory";
  if (compute && peak > 0) w.of_peak = w.tflops * 1e12 / peak;
  if (!compute && hbm > 0) w.of_peak = w.gbps * 1e9 / hbm;
  return w;
}

void bench_print_kernels(const bench_opts_t *o, const bench_result_t *r) {
  if (!r->kc_steps) return;
  const double peak = r->peak_flops / (r->replicas * r->shard_size);
  const double ranks = r->replicas * r->shard_size;
  printf("\nkernel classes (--kernel-profile, rank 0, per step; %s on the compute stream; "
         "FLOPs and bytes as fsdp_%s_kernel_costs declares them)\n",
         o->cfg.device == FSDP_DEVICE_CUDA ? "CUDA events" : "host clock", o->model);
  char hbm[64] = "n/a (not in bench_cuda.c's table)";
  if (r->hbm_bytes_per_s > 0)
    snprintf(hbm, sizeof hbm, "%.2f TB/s (datasheet)", r->hbm_bytes_per_s / 1e12);
  /* one line: check_bench.py finds the table's rows by their offset */
  printf("device %s: matrix-product peak %.3f TF/s (measured: the peak: line), HBM %s%s%s\n",
         r->device_name, peak / 1e12, hbm, r->attention[0] ? "; attention: " : "", r->attention);
  printf("%-30s %8s %9s %7s %10s %9s %8s %8s %-7s %7s\n", "class", "calls", "ms", "share",
         "GFLOP", "GB", "TF/s", "GB/s", "bound", "of peak");
  double ms = 0, flops = 0, bytes = 0;
  for (int k = 0; k < FSDP_KC_COUNT; k++) {
    if (!kc_listed(r, k)) continue;
    kc_row_t w = kc_row(r, k);
    char frac[16] = "n/a";
    if (w.of_peak >= 0) snprintf(frac, sizeof frac, "%.1f%%", 100 * w.of_peak);
    printf("%-30s %8.1f %9.3f %6.1f%% %10.3f %9.4f %8.2f %8.1f %-7s %7s\n",
           fsdp_kclass_name((fsdp_kclass_t)k), w.calls, w.ms, 100 * w.share,
           r->kc_cost[k].flops / 1e9, r->kc_cost[k].bytes / 1e9, w.tflops, w.gbps, w.bound, frac);
    ms += w.ms, flops += r->kc_cost[k].flops, bytes += r->kc_cost[k].bytes;
  }
  const double step_ms = r->step_s.median * 1e3;
  printf("%-30s %8s %9.3f %6.1f%% %10.3f %9.4f\n", "all classes", "", ms,
         step_ms > 0 ? 100 * ms / step_ms : 0.0, flops / 1e9, bytes / 1e9);
  printf("%-30s %8s %9.3f %6.1f%%   (launch gaps, host work, waits for communication)\n",
         "other", "", step_ms - ms, step_ms > 0 ? 100 * (step_ms - ms) / step_ms : 0.0);
  const double model = r->flops_per_token * r->tokens_per_step / ranks;
  printf("step %.3f ms, MFU %.2f%%: model FLOPs (the MFU numerator) %.4g per rank step, the "
         "classes' %.4g (+ scores recomputed in attention backward, - bias and norm "
         "parameters, which multiply nothing)\n", step_ms, 100 * r->mfu.median, model, flops);
  if (r->products[0]) printf("block products: %s\n", r->products);
}

void bench_kernels_json(FILE *f, const bench_opts_t *o, const bench_result_t *r) {
  if (!r->kc_steps) return;
  const fsdp_gpt2_config_t *g = &o->gpt;
  const fsdp_llama_config_t *l = &o->llama;
  if (!strcmp(o->model, "llama"))
    fprintf(f, ",\"llama\":{\"n_layer\":%d,\"n_head\":%d,\"n_kv_head\":%d,\"n_embd\":%d,"
            "\"ffn_hidden\":%d,\"vocab_size\":%d,\"tied\":%d}", l->n_layer, l->n_head,
            l->n_kv_head, l->n_embd, l->ffn_hidden, l->vocab_size, l->tie_embeddings);
  else
    fprintf(f, ",\"gpt2\":{\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"block_size\":%d,"
            "\"vocab_size\":%d}", g->n_layer, g->n_head, g->n_embd, g->block_size, g->vocab_size);
  if (r->attention[0]) { /* what ran attention on the GPU (fsdp_cuda_attention_impl) */
    fprintf(f, ",\"attention\":");
    bench_json_string(f, r->attention);
  }
  fprintf(f, ",\"device_name\":\"%s\",\"hbm_bytes_per_s\":%.6g,\"kernels\":[", r->device_name,
          r->hbm_bytes_per_s);
  for (int k = 0, first = 1; k < FSDP_KC_COUNT; k++) {
    if (!kc_listed(r, k)) continue;
    kc_row_t w = kc_row(r, k);
    fprintf(f, "%s{\"class\":\"%s\",\"calls_per_step\":%.6g,\"ms_per_step\":%.6g,"
            "\"share\":%.6g,\"flops\":%.17g,\"bytes\":%.17g,\"tflops\":%.6g,\"gbps\":%.6g,"
            "\"bound\":\"%s\",\"of_peak\":%.6g}", first ? "" : ",",
            fsdp_kclass_name((fsdp_kclass_t)k), w.calls, w.ms, w.share, r->kc_cost[k].flops,
            r->kc_cost[k].bytes, w.tflops, w.gbps, w.bound, w.of_peak);
    first = 0;
  }
  fprintf(f, "]");
}
