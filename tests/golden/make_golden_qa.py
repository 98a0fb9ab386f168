#!/usr/bin/env python3
"""Golden data for task = qa: BertForQuestionAnswering and RobertaForQuestionAnswering.

Usage:  python3 tests/golden/make_golden_qa.py OUTDIR        (tests/golden/data)

Writes OUTDIR/bert_qa and OUTDIR/roberta_qa exactly as make_golden.py writes its cases
(config.json, model.safetensors, golden.safetensors, meta.json; same optimizer, schedule,
3 steps, checks and 3 MiB budget for the whole OUTDIR), through make_golden.run_case. For
these cases:
  labels  int32 [B, 2]: each row's start and end position as given to HF (start_positions,
          end_positions), before HF's clamp to [0, T]: some rows answer (start <= end in the
          context), some are unanswerable (0, 0: the [CLS] token), one start is past T and
          one end is exactly T (both ignored, ignore_index = T), one end is negative
          (clamped to 0);
  logits  float32 [B, T, 2]: start_logits and end_logits stacked on the last axis, which
          is the layout of tunegraph's qa_outputs product ([B*T, 2]);
  loss    HF's (CE(start) + CE(end)) / 2; padding positions take part in the softmax.
Only the new cases are written; the others in OUTDIR are left as they are.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402  (sets the offline environment before importing torch)

import torch  # noqa: E402
import transformers  # noqa: E402

# Start and end per row; T = 16. Row 2's start is past T and row 3's end is T (ignored);
# row 4's end is negative (HF clamps it to 0).
POSITIONS = [[3, 5], [0, 0], [20, 9], [7, 16], [4, -3]]


def case_bert_qa():
    from transformers import BertConfig, BertForQuestionAnswering
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                hidden_act="gelu", layer_norm_eps=1e-12, num_labels=2, pad_token_id=0,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg = BertConfig(**want)
    B, T, lengths = 5, 16, [16, 11, 7, 13, 9]
    gen = torch.Generator().manual_seed(5005)
    ids = mg.make_ids(gen, B, T, lengths, 1, cfg.vocab_size, cfg.pad_token_id)
    mask = mg.make_lengths_mask(B, T, lengths)
    tt = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):   # the context: the second half of the real tokens
        tt[b, n // 2:n] = 1
    labels = torch.tensor(POSITIONS, dtype=torch.long)
    return dict(cls=BertForQuestionAnswering, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="qa", input_ids=ids, mask=mask, token_type_ids=tt, labels=labels,
                pos_module=lambda m: m.bert.embeddings.position_embeddings,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


def case_roberta_qa():
    from transformers import RobertaConfig, RobertaForQuestionAnswering
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=42, type_vocab_size=1,
                pad_token_id=1, layer_norm_eps=1e-5, num_labels=2,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg = RobertaConfig(hidden_act="gelu", bos_token_id=0, eos_token_id=2, **want)
    B, T, lengths = 5, 16, [9, 16, 5, 14, 12]
    gen = torch.Generator().manual_seed(6006)
    ids = mg.make_ids(gen, B, T, lengths, 2, cfg.vocab_size, cfg.pad_token_id)
    mask = mg.make_lengths_mask(B, T, lengths)
    tt = torch.zeros(B, T, dtype=torch.long)
    labels = torch.tensor(POSITIONS, dtype=torch.long)
    pad = cfg.pad_token_id
    nonpad = (ids != pad).long()
    expected_pos = torch.cumsum(nonpad, dim=1) * nonpad + pad   # create_position_ids_from_input_ids
    return dict(cls=RobertaForQuestionAnswering, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="qa", input_ids=ids, mask=mask, token_type_ids=tt, labels=labels,
                pos_module=lambda m: m.roberta.embeddings.position_embeddings,
                expected_pos=expected_pos)


CASES = [("bert_qa", case_bert_qa), ("roberta_qa", case_roberta_qa)]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    for name, make in CASES:
        mg.run_case(name, make, outdir)
    total = mg.dir_bytes(outdir)
    print("total size of %s: %d bytes" % (outdir, total))
    mg.check(total < mg.MAX_OUTDIR_BYTES, "OUTDIR is %d bytes, over the 3 MiB budget" % total)
    print("OK")


if __name__ == "__main__":
    main()
