/* src/backend/cpu/head.h — GPT-2's vocabulary head on the CPU with a padded row
 * stride: the logits of a row are V wide but ld (>= V; GPT-2 uses V rounded up
 * to a multiple of 128) apart, so one (B, ld) buffer holds the logits and then,
 * written over them, their gradient. Columns [V, ld) are never read or
 * written. The same arithmetic as fsdp_linear_* and fsdp_softmax_xent, so the
 * results are bitwise theirs. Internal (layers.c); not installed. */
#ifndef FSDP_BACKEND_CPU_HEAD_H
#define FSDP_BACKEND_CPU_HEAD_H

/* logits (B,V; rows ld apart) = inp (B,C) @ wte^T, wte (V,C). */
void nn_head_forward(float *logits, int ld, const float *inp, const float *wte, int B, int C,
                     int V);
/* dinp (B,C) += dlogits @ wte; dwte (V,C) += dlogits^T @ inp; dinp may be NULL. */
void nn_head_backward(float *dinp, float *dwte, const float *dlogits, int ld, const float *inp,
                      const float *wte, int B, int C, int V);
/* The summed cross-entropy of the B rows against targets, each row's also in
 * losses (B; may be NULL); with grad, each row is overwritten by (softmax -
 * onehot) * scale (a target outside [0,V): a NaN loss and a NaN row, as
 * fsdp_softmax_xent). */
double nn_xent_inplace(float *logits, int ld, double *losses, const int *targets, int B, int V,
                       float scale, int grad);

#endif
