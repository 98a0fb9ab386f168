/* The closed set of operations a plan may contain.
 *
 * This enum is the contract between the compiler and every executor: each table
 * indexed by it (compiler/op_table.c: name, shape check, FLOPs, backward rule,
 * gradient contract; runtime/cpu_ops.c: CPU reference forward) is followed by a
 * static assertion on TG_OP_COUNT, so an op cannot be added without filling every
 * table.
 *
 * Conventions: tensors are row-major and contiguous; "[B,T,D]" lists dims outermost
 * first. An op reads in[0..] and writes out[0..]; unused slots hold -1. Integer
 * parameters live in op.i[], float parameters in op.f[]. "(+=)" marks an output
 * the op accumulates into (parameter gradients); every other output is overwritten.
 * Parameter gradients start the backward unset: the first op to write each one
 * overwrites it where the op has that form (TG_OP_MATMUL's i[6] = 0, TG_OP_BIAS_GRAD's
 * i[2] = 1, the LayerNorm backwards' i[3] = 1), and TG_OP_ZERO clears the rest (embedding tables, which are
 * scattered into, and any gradient nothing writes) first (compiler/grad_writes.c).
 */
#ifndef TUNEGRAPH_OPS_H
#define TUNEGRAPH_OPS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tg_op_kind {
    /* out0 = 0 over its whole extent. */
    TG_OP_ZERO,
    /* out0 = f[0] (every element). Seeds the loss gradient. */
    TG_OP_FILL,
    /* in0 ids int32 [N], in1 table [V,D] -> out0 [N,D]; out0[n] = table[ids[n]].
     * i[0]=N, i[1]=V, i[2]=D, i[3]=padding index (-1: none) whose row, as in
     * nn.Embedding(padding_idx), receives no gradient and starts at zero. */
    TG_OP_EMBEDDING,
    /* in0 ids int32 [N], in1 dout [N,D] -> out0 dtable [V,D] (+=). Rows are summed in
     * index order per table row, so the result does not depend on thread timing. Rows
     * whose id equals i[3] (the padding index, -1: none) contribute nothing.
     * i[0]=N, i[1]=V, i[2]=D, i[3]=padding index. */
    TG_OP_EMBEDDING_BWD,
    /* in0 a, in1 b -> out0 = a + b, all of i[0] elements. */
    TG_OP_ADD,
    /* Batched row-major matrix product with optional bias:
     *   out0[b] = f[0] * op(in0[b]) @ op(in1[b]) (+ in2 broadcast over rows) (+ out0[b] if i[6])
     * op(A) is A [M,K], or A^T when i[3] (A stored [K,M]); op(B) is B [K,N], or B^T when
     * i[4] (B stored [N,K]). in2 (optional) is a bias [N]. Batches are contiguous.
     * Optional out1 (present iff i[7] != 0), fp32, overwritten, the sums over k of one
     * operand (not scaled by f[0]):
     *   i[7] = 1: out1 [M], out1[m] = sum_k op(in0)[m,k]; requires i[3] (A stored [K,M], so
     *             these are the column sums of the stored A);
     *   i[7] = 2: out1 [N], out1[n] = sum_k op(in1)[k,n]; requires !i[4] (B stored [K,N]).
     * Only with batch 1 and no in2. It is a linear layer's bias gradient fused into its
     * weight-gradient product, dC being the summed operand: dW = dC^T X (nn.Linear, weight
     * [out,in]) has dC as A, i[7] = 1; dW = X^T dC (GPT-2 Conv1D, weight [in,out]) has dC
     * as B, i[7] = 2. The compiler emits it only where the bias gradient has no other
     * contribution, so writing it equals TG_OP_BIAS_GRAD's += into the zeroed gradient.
     * Optional activation epilogue i[8] (TG_MATMUL_ACT_*), the tanh GELU of TG_OP_GELU with
     * i[1] = TG_GELU_TANH (the same float expressions, so the same values as the separate
     * ops). With P = f[0] * op(in0) @ op(in1) (+ in2):
     *   i[8] = 1 (GELU): out0 = gelu(P), out2 = P (the pre-activation, which the backward
     *             reads); in2 optional;
     *   i[8] = 2 (GELU backward): out0 = P * gelu'(in3), in3 = the forward's pre-activation;
     *             no in2. This is TG_OP_GELU_BWD of the product: the product is the
     *             gradient of the GELU's output, out0 the gradient of its input.
     * Only with batch 1, no accumulate (i[6]) and no bias gradient (i[7]); out2 (i[8] = 1)
     * and in3 (i[8] = 2) hold M*N elements, like out0. The compiler emits it only for
     * models whose activation is the tanh form (job key fuse_gelu).
     * i[0]=M, i[1]=N, i[2]=K, i[3]=transA, i[4]=transB, i[5]=batch, i[6]=accumulate (out0
     * only), i[7]=bias gradient (0 none, 1 of A, 2 of B), i[8]=activation (0 none, 1 GELU,
     * 2 GELU backward). */
    TG_OP_MATMUL,
    /* in0 dout [M,N] -> out0 dbias [N] (+=), the column sums. i[0]=M, i[1]=N, i[2]=1:
     * out0 is overwritten instead (its first writer). Where the weight-gradient product
     * can take it, TG_OP_MATMUL's i[7] computes this instead. */
    TG_OP_BIAS_GRAD,
    /* in0 x [M,D], in1 gamma [D], in2 beta [D] -> out0 y [M,D], out1 mean [M],
     * out2 rstd [M] (biased variance, as torch). i[0]=M, i[1]=D, f[0]=eps. */
    TG_OP_LAYERNORM,
    /* in0 dy [M,D], in1 x, in2 gamma, in3 mean, in4 rstd -> out0 dx [M,D],
     * out1 dgamma [D] (+=), out2 dbeta [D] (+=). i[0]=M, i[1]=D, i[3]=1: dgamma and dbeta
     * are overwritten instead (the compiler sets it where the op writes them first). */
    TG_OP_LAYERNORM_BWD,
    /* in0 x -> out0 gelu(x), i[0] elements. i[1]=TG_GELU_ERF or TG_GELU_TANH. */
    TG_OP_GELU,
    /* in0 dy, in1 x -> out0 dx = dy * gelu'(x). i[0] elements, i[1] as TG_OP_GELU.
     * Optional out1 [i[2]] (present iff i[2] > 0), fp32, written: the column sums of dx as
     * stored, dx viewed as [i[0] / i[2], i[2]]: the bias gradient of the linear layer
     * whose output the GELU reads, summed where dx is made instead of read again (TG_OP_
     * MATMUL's i[7] otherwise). The compiler emits it only where the bias gradient has no
     * other contribution (job key fuse_bias_grad). */
    TG_OP_GELU_BWD,
    /* in0 x -> out0 tanh(x), i[0] elements. */
    TG_OP_TANH,
    /* in0 dy, in1 y (the forward output) -> out0 dx = dy * (1 - y^2), i[0] elements. */
    TG_OP_TANH_BWD,
    /* Softmax with the attention-probability dropout fused in:
     * in0 scores [B,H,T,T], in1 key mask float [B,T] (1 keep, 0 masked; optional), in2 step
     * counter (optimizer state, float [1]; optional) -> out0 probs P [B,H,T,T]
     * = softmax_k(f[0] * scores) over kept keys (and k <= q when causal); masked keys get
     * probability 0 (a row with no kept key is all 0); out1 (optional) dropped probs
     * D [B,H,T,T] = P * keep / (1 - p), with exactly TG_OP_DROPOUT's mask and value:
     * keep = uniform(seed, step, key=i[4], element) >= p, element = the flat index in
     * [B,H,T,T], kept value = P * (1 / (1 - p)) in float, from the float P (before any
     * bf16 rounding of the stored P). D = P when p == 0 or in eval mode. in2 is required
     * when out1 is present and p > 0.
     * i[0]=B, i[1]=H, i[2]=T, i[3]=causal, i[4]=dropout stream key, f[0]=scale, f[1]=p. */
    TG_OP_ATTN_SOFTMAX,
    /* in0 dD (gradient of the forward's out1, or of P when the forward has no dropout),
     * in1 P, in2 step counter (optional) -> out0 dscores = f[0] * P * (dP - sum_k(dP * P)),
     * where dP = dD * keep / (1 - p) with the forward's mask (same seed, step, key=i[4],
     * f[1]=p, value dD * (1 / (1 - p)) in float), or dP = dD when in2 is absent, p == 0 or
     * in eval mode. i[0]=B, i[1]=H, i[2]=T, i[4]=key, f[0]=scale, f[1]=p (i[3] as the
     * forward, unused). */
    TG_OP_ATTN_SOFTMAX_BWD,
    /* Fused attention (scores, softmax, attention dropout and the PV product in one op; the
     * [B,H,T,T] tensors are never stored). Q, K and V are read in the [B*T, H*Dh] layout
     * the projections write, head h in columns h*Dh .. h*Dh+Dh-1:
     *   i[5] = 1 (packed): in0 qkv [B*T, 3*H*Dh], Q = columns 0..D-1, K = D..2D-1,
     *          V = 2D..3D-1 (D = H*Dh, GPT-2's c_attn); in1, in2 unused;
     *   i[5] = 0: in0 q, in1 k, in2 v, each [B*T, H*Dh].
     * in3 key mask float [B,T] (optional; 1 keep, 0 masked), in4 step counter (float [1];
     * required when f[1] > 0) -> out0 O [B*T, H*Dh], out1 LSE float [B,H,T], out2 (present
     * when f[1] > 0) the dropout keep bits int32 [B,H,T,W], W = ceil(T/32): bit k % 32 of
     * word [b,h,q,k/32] is 1 iff key k takes part in row q (kept, see below) and keep_k
     * (keep_k = 1 in eval mode); every other bit, to the end of the last word, is 0. The
     * backward reads the mask from these bits instead of drawing it again.
     * For each (b, h, query q): s_k = f[0] * dot(Q[b,q,h], K[b,k,h]) over kept keys k (mask
     * != 0, and k <= q when i[3] causal); P_k = exp(s_k - LSE) with LSE = log sum_k exp(s_k)
     * (computed as max + log of the sum of exp(s - max)); D_k = P_k * keep_k * (1 / (1 - p))
     * with keep_k = uniform(seed, step, key=i[4], e) >= p and e = ((b*H + h)*T + q)*T + k,
     * exactly TG_OP_ATTN_SOFTMAX's mask (D = P when p == 0 or in eval mode);
     * O[b,q,h] = sum_k D_k V[b,k,h]. A row with no kept key has O = 0 and LSE = 0.
     * i[0]=B, i[1]=H, i[2]=T, i[3]=causal, i[4]=dropout stream key, i[5]=packed, i[6]=Dh,
     * f[0]=scale, f[1]=p. The compiler emits it only for Dh <= 128, the CUDA kernel's limit
     * (compiler/model_build.h); the CPU reference takes any Dh. */
    TG_OP_ATTENTION,
    /* Backward of TG_OP_ATTENTION: in0 dO [B*T, H*Dh], in1 O, in2 LSE, in3 key mask
     * (optional), in4 the forward's keep bits (its out2; present when f[1] > 0; keep_qk is
     * its bit), in5 q (or qkv when packed), in6 k,
     * in7 v (unpacked only) -> out0 dq (or dqkv [B*T, 3*H*Dh] when packed), out1 dk, out2 dv
     * (unpacked only), out3 delta float [B,H,T] = sum_d dO[b,q,h,d] * O[b,q,h,d] (written;
     * the kernels' row term). With P recomputed as the forward from Q, K and LSE, keep from
     * the bits and D = P * keep * (1 / (1 - p)):
     * dD_qk = dot(dO_q, V_k); dS_qk = f[0] * P_qk * (dD_qk * keep_qk * (1 / (1 - p)) - delta_q)
     * (keep factor 1 without dropout); dQ_q = sum_k dS_qk K_k; dK_k = sum_q dS_qk Q_q;
     * dV_k = sum_q D_qk dO_q; masked pairs contribute nothing. All outputs are overwritten.
     * Same parameters as the forward. */
    TG_OP_ATTENTION_BWD,
    /* in0 x, in1 step counter (optimizer state, float [1]) -> out0 y = x * keep / (1 - p).
     * keep = uniform(seed, step, key=i[1], element) >= p, from the counter-based Philox
     * stream in kernels/philox.h, so the backward (the same op on the gradient, same key)
     * regenerates the mask. Identity when the executor runs in eval mode.
     * i[0] elements, i[1] stream key, f[0]=p. */
    TG_OP_DROPOUT,
    /* in0 x [B*T, P*H*Dh] -> out0..out(P-1), each [B,H,T,Dh]: part p of the columns,
     * split into heads. i[0]=B, i[1]=T, i[2]=H, i[3]=Dh, i[4]=P (1..3). */
    TG_OP_HEADS_SPLIT,
    /* Inverse of TG_OP_HEADS_SPLIT: in0..in(P-1) [B,H,T,Dh] -> out0 [B*T, P*H*Dh].
     * Same parameters. */
    TG_OP_HEADS_MERGE,
    /* in0 x [B,T,D], in1 ids int32 [B,T] -> out0 [B,D], the row of one token per sequence:
     * i[3]=TG_SELECT_FIRST (token 0) or TG_SELECT_LAST_NON_PAD (the largest t with
     * ids[b,t] != i[4], 0 if none, as HF GPT2ForSequenceClassification).
     * i[0]=B, i[1]=T, i[2]=D, i[4]=pad id. */
    TG_OP_SELECT_TOKEN,
    /* in0 dout [B,D], in1 ids -> out0 dx [B,T,D]: dout at the selected rows, 0 elsewhere.
     * Same parameters as TG_OP_SELECT_TOKEN. */
    TG_OP_SELECT_TOKEN_BWD,
    /* in0 logits [N,C], in1 labels int32 [N] -> out0 loss [1] = mean over rows whose
     * label != -100 of -log softmax(logits)[label] (0 when no row counts). When i[2] > 0
     * only the first i[2] columns are classes: rows are padded to C for aligned matrix
     * products (a vocabulary rounded up), and the padding takes no part in the softmax.
     * i[0]=N, i[1]=C, i[2]=classes (0: C). */
    TG_OP_CROSS_ENTROPY,
    /* in0 dloss [1], in1 logits, in2 labels -> out0 dlogits [N,C]
     * = dloss * (softmax - onehot) / n_valid on counted rows, 0 on ignored rows and on
     * padding columns. Same parameters as TG_OP_CROSS_ENTROPY. */
    TG_OP_CROSS_ENTROPY_BWD,
    /* Learning-rate schedule, on the device in later executors so a captured step never
     * changes: in0 step counter [1] (updates completed), in1 total steps [1]
     * -> out0 lr [1] = f[0] * linear warmup over i[0] steps then linear decay to 0 at
     * total steps (HF get_linear_schedule_with_warmup), out1 step counter, incremented. */
    TG_OP_SCHEDULE,
    /* in0 all gradients (the grads pool as one tensor) -> out0 [1] their global L2 norm.
     * i[0] = element count. */
    TG_OP_GRAD_NORM,
    /* One AdamW update of every parameter (torch.optim.AdamW semantics, decoupled decay):
     * in0 all grads, in1 lr [1], in2 step counter [1] (already incremented, the bias-
     * correction t), in3 grad norm [1] -> out0 all params, out1 all m, out2 all v, in place,
     * and (bf16 plans) out3 the bf16 copies of all parameters, refreshed in the same pass.
     * Gradients are scaled by min(1, f[4] / (norm + 1e-6)) when f[4] > 0 (torch
     * clip_grad_norm_). Parameters flagged TG_TENSOR_NO_DECAY skip weight decay.
     * i[0] = parameter element count (FLOPs), f[0]=beta1, f[1]=beta2, f[2]=eps,
     * f[3]=weight decay, f[4]=max grad norm. ZeRO-1 (i[1] = S > 0): replica r updates
     * only the parameter elements [r*S, min(i[0], (r+1)*S)) (and their bf16 copies), whose
     * m and v are elements [0, S) of out1 and out2 (S-element tensors): the replicas'
     * slices together cover every parameter once, and TG_OP_ALL_GATHER then shares them. */
    TG_OP_ADAMW,
    /* The residual connection and its LayerNorm as one op (a hidden dropout, the residual
     * add and the LayerNorm of a transformer block, with nothing stored in between):
     * in0 x [M,D] (the branch output), in1 residual r [M,D], in2 gamma [D], in3 beta [D],
     * in4 step counter (float [1]; required when f[1] > 0) -> out0 y [M,D] = LayerNorm(s)
     * (as TG_OP_LAYERNORM, over s as stored), out1 s [M,D] = dropout(x) + r (the residual
     * stream), out2 mean [M], out3 rstd [M] (fp32). dropout(x) is exactly TG_OP_DROPOUT's
     * on the flat [M,D] element index e = m*D + d: x * (1 / (1 - p)) in float where
     * uniform(seed, step, key=i[2], e) >= p, else 0; x itself when p == 0 or in eval mode.
     * i[0]=M, i[1]=D, i[2]=dropout stream key, f[0]=eps, f[1]=p. */
    TG_OP_RESIDUAL_LAYERNORM,
    /* Backward of TG_OP_RESIDUAL_LAYERNORM: in0 dy [M,D], in1 s, in2 gamma, in3 mean,
     * in4 rstd, in5 ds_extra [M,D] (optional: the gradient s has from its other readers),
     * in6 step counter (required when f[1] > 0) -> out0 ds [M,D] = LayerNorm backward of dy
     * (TG_OP_LAYERNORM_BWD's dx) + ds_extra, which is also the residual's gradient;
     * out1 dx [M,D] = TG_OP_DROPOUT of ds as stored (same key, step and elements as the
     * forward; ds itself when p == 0 or in eval mode); out2 dgamma [D] (+=), out3 dbeta
     * [D] (+=). Same parameters as the forward, and i[3] as TG_OP_LAYERNORM_BWD's. */
    TG_OP_RESIDUAL_LAYERNORM_BWD,
    /* Data parallelism: in0 x -> out0, the same tensor (in place), = the sum of x over the
     * job's data_parallel replicas (runtime/comm.h), the same on every replica. The loss
     * gradient is seeded with 1 / data_parallel, so the sum is the mean of the replicas'
     * gradients, each of its own batch's mean loss (as PyTorch DDP). The compiler sums the gradient buffer in buckets (views), each
     * right after the last backward op that writes into it (compiler/grad_buckets.c).
     * i[0] = element count. */
    TG_OP_ALL_REDUCE,
    /* ZeRO-1: in0 x -> out0, the same tensor (in place, fp32 or bf16, N*S elements for the
     * job's N = data_parallel replicas), where replica r's elements [r*S, (r+1)*S) are
     * copied to every replica, so all hold what each updated of the parameters (or of
     * their bf16 copies). i[0] = S, the elements per replica. */
    TG_OP_ALL_GATHER,
    TG_OP_COUNT
} tg_op_kind;

enum { TG_GELU_ERF = 0, TG_GELU_TANH = 1 };
/* TG_OP_MATMUL's activation epilogue, i[8]. */
enum { TG_MATMUL_ACT_NONE = 0, TG_MATMUL_ACT_GELU = 1, TG_MATMUL_ACT_GELU_BWD = 2 };
enum { TG_SELECT_FIRST = 0, TG_SELECT_LAST_NON_PAD = 1 };

/* The label value that excludes a row from the loss (HF / torch ignore_index). */
#define TG_IGNORE_INDEX (-100)
/* In an LM batch handed to a training step: a row whose first label is this has the rest
 * of its labels derived by the step from its ids and mask (labels[t] = ids[t + 1] while
 * token t + 1 is real, else TG_IGNORE_INDEX), so the host need not write them. */
#define TG_LABELS_FROM_IDS (-2147483647 - 1)

#ifdef __cplusplus
}
#endif
#endif
