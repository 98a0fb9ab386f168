#!/usr/bin/env python3
"""The value tests/test_compiler_fingerprint_value.c pins (FIXED_FINGERPRINT), computed apart
from compiler/fingerprint.c: the fixed model config and job of that test, encoded field by
field as the fingerprint documents (little-endian; each string's bytes up to its NUL after
their 32-bit count), then xxh64 with seed 0. Run it after adding a job field to both (pip
package xxhash)."""
import struct

import xxhash

out = bytearray()


def i32(v): out.extend(struct.pack("<i", v))
def u32(v): out.extend(struct.pack("<I", v))
def f32(v): out.extend(struct.pack("<f", v))
def u64(v): out.extend(struct.pack("<Q", v))


def text(s):
    e = s.encode()  # a string counts up to its NUL, without it
    u32(len(e))
    out.extend(e)


text("1.2.3")
# The model config.
text("src/config.json"); text("w.safetensors")
for v in (1, 30522, 64, 2, 4, 256, 512, 2, 0, 1): i32(v)
for v in (1e-12, 0.02, 0.1, 0.25, 0.5, 0.75): f32(v)
for v in (2, 1, 2, 8192): i32(v)  # kv_heads, tie_word_embeddings, rope_type, rope_original_max_positions
for v in (500000.0, 32.0, 1.0, 4.0): f32(v)  # rope_theta, factor, low_freq_factor, high_freq_factor
# The job, in tg_job_fingerprint's order.
text("dir/j.job"); text("tiny-bert")
for v in (1, 3, 8, 48, 1, 0, 2, 1, 0, 1, 1, 2, 1, 1): i32(v)  # task .. optimizer
for v in (2e-3, 0.9, 0.999, 1e-8, 0.01, 0.95): f32(v)  # lr, betas, eps, weight_decay, beta3
for v in (1, 7, 1, 100, 3): i32(v)  # no_prox, warmup_steps, lr_schedule, steps, epochs
f32(1.0); u64(0x0123456789ABCDEF); i32(-1); i32(10)
text("train.jsonl"); text("eval.jsonl"); text("bert.embeddings.*")
i32(50); i32(3); text("ckpt")
i32(3)
for v in (16, 32, 48, 0, 0, 0, 0, 0): i32(v)  # bucket_seq[TG_MAX_BUCKETS]
for v in (2, 1, 7): i32(v)  # last_batch, skip_nonfinite, max_skipped_steps
f32(0.2); i32(103); i32(2)
for v in (0, 101, -1, -1, -1): i32(v)  # special_ids
i32(4)  # grad_accumulation
for v in (1024.0, 4.0, 0.25): f32(v)  # loss_scale_init, growth_factor, backoff
i32(100)  # loss_scale_growth_interval
i32(5); i32(17); f32(-2.5)  # qa_n_best, qa_max_answer_length, qa_null_threshold
i32(0)  # share_grad_memory
i32(1)  # recompute
u64(3 << 30)  # memory_limit
i32(1)  # optimizer_state
i32(7)  # grad_bucket_mb
i32(16); f32(32.0); f32(0.05); text("q_proj,v_proj")  # lora_r, lora_alpha, lora_dropout, lora_targets
f32(2.5)  # gpu_hour_price
KEY_LINES = 64
u32(KEY_LINES)
for k in range(KEY_LINES): i32(k * 3 - 5)
print(f"{len(out)} bytes: 0x{xxhash.xxh64(bytes(out), seed=0).intdigest():016x}")
