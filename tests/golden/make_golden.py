#!/usr/bin/env python3
"""Generate HF-transformers golden data for tunegraph's CPU fp32 reference executor.

Usage:  python3 tests/golden/make_golden.py OUTDIR [CASE...]

For each case (bert_classify, gpt2_lm, gpt2_classify, roberta_classify, bert_mlm,
roberta_mlm; all of them when none is named) writes
  OUTDIR/<case>/config.json          real HF config (config.save_pretrained)
  OUTDIR/<case>/model.safetensors    initial random weights (state dict, tied copies dropped)
  OUTDIR/<case>/golden.safetensors   inputs, logits, loss, grads, weights after 3 AdamW steps
  OUTDIR/<case>/meta.json            hyperparameters, versions, parameter names in order
See tests/golden/README.md for the exact key names and conventions.

Needs torch, transformers (5.x; 4.4x should also work), safetensors, numpy.  CPU only,
float32, eager attention, all dropout 0, deterministic.  Fails loudly (AssertionError /
RuntimeError, non-zero exit) if anything does not look as expected.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # the device machine has no network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn.functional as F

from mlm_masks import mlm_mask

import transformers
from safetensors.torch import save_file, load_file

# ----------------------------------------------------------------------------------------
# Fixed hyperparameters (shared by all cases)
# ----------------------------------------------------------------------------------------
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
WARMUP_STEPS = 1
TOTAL_STEPS = 4          # scheduler horizon; only NUM_STEPS are actually taken
NUM_STEPS = 3
MAX_GRAD_NORM = 1.0
NO_DECAY_RULE = ('weight_decay 0 for parameters whose name ends with "bias" or contains '
                 '"LayerNorm", "ln_", "layer_norm" or "layernorm", or is model.norm.weight (Llama\'s '
                 'RMSNorms); weight_decay 0.01 for all others')
MAX_OUTDIR_BYTES = 6 * 1024 * 1024


def no_decay(name):
    return (name.endswith("bias") or ("LayerNorm" in name) or ("ln_" in name) or ("layer_norm" in name)
            or ("layernorm" in name) or name == "model.norm.weight")


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------
def fail(msg):
    raise RuntimeError("make_golden: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def f32(t):
    return t.detach().to(torch.float32).cpu().clone().contiguous()


def i32(t):
    return t.detach().to(torch.int32).cpu().clone().contiguous()


def set_eager(config):
    """Ask for eager attention on a config, whatever the transformers version calls it."""
    try:
        config._attn_implementation = "eager"
    except Exception:
        pass
    try:
        if getattr(config, "_attn_implementation_internal", "eager") != "eager":
            config._attn_implementation_internal = "eager"
    except Exception:
        pass


def check_config(config, want):
    """The config must really hold the values we asked for (fail loudly on API drift)."""
    for k, v in want.items():
        got = getattr(config, k, "<missing>")
        check(got == v, "config.%s is %r, wanted %r" % (k, got, v))


def build_model(cls, config):
    set_eager(config)
    model = None
    try:
        torch.manual_seed(0)
        model = cls(config, attn_implementation="eager")  # some versions accept it
    except Exception:
        model = None
    if model is None:
        torch.manual_seed(0)   # same RNG state whichever constructor call worked
        model = cls(config)
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")
        except Exception as e:  # not fatal: checked below
            print("  note: set_attn_implementation('eager') raised %r" % (e,))
    impl = getattr(model.config, "_attn_implementation", None)
    check(impl in ("eager", None), "attention implementation is %r, wanted 'eager'" % (impl,))
    # Every sub-config (if any) must be eager too.
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None:
            ci = getattr(c, "_attn_implementation", None)
            check(ci in ("eager", None), "module %s has attn impl %r" % (type(m).__name__, ci))
    print("  attention implementation:", impl)
    return model


def check_dropout_zero(model):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout):
            check(m.p == 0.0, "dropout %s has p=%r (must be 0)" % (name, m.p))


def embedding_padding_idx(model):
    """{param name: padding_idx} for nn.Embedding modules that have one (their grad row is 0)."""
    out = {}
    for mname, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
            out[mname + ".weight"] = int(m.padding_idx)
    return out


def weights_state_dict(model, param_names):
    """The tensors HF would save/load: state dict minus tied duplicates; must equal params."""
    sd = model.state_dict()
    params = dict(model.named_parameters())
    ptr_to_name = {p.data_ptr(): n for n, p in params.items()}
    out, tied = {}, {}
    for k, v in sd.items():
        if k in params:
            out[k] = v
        elif v.data_ptr() in ptr_to_name and v.shape == params[ptr_to_name[v.data_ptr()]].shape:
            tied[k] = ptr_to_name[v.data_ptr()]
        else:
            fail("state_dict key %r is neither a parameter nor a tied copy (persistent buffer?)" % k)
    check(set(out) == set(param_names),
          "state-dict keys (minus tied) != named_parameters: missing %s extra %s"
          % (sorted(set(param_names) - set(out)), sorted(set(out) - set(param_names))))
    for k, v in out.items():
        check(v.dtype == torch.float32, "%s is %s, not float32" % (k, v.dtype))
    return {k: f32(out[k]) for k in param_names}, tied


class PositionCapture:
    """Forward hook on the position-embedding module: records the position ids HF used."""

    def __init__(self, module, arg=0, kwarg="input"):
        self.ids = None
        self.arg, self.kwarg = arg, kwarg   # Llama's rotary module: forward(x, position_ids)
        try:
            self.h = module.register_forward_hook(self._hook, with_kwargs=True)
        except TypeError:   # old torch: no kwargs in hooks
            self.h = module.register_forward_hook(lambda m, a, o: self._hook(m, a, {}, o))

    def _hook(self, mod, args, kwargs, output):
        if self.ids is None:
            x = args[self.arg] if len(args) > self.arg else kwargs.get(self.kwarg)
            if x is not None:
                self.ids = x.detach().clone()

    def remove(self):
        self.h.remove()


def make_lengths_mask(B, T, lengths):
    check(len(lengths) == B, "lengths")
    check(max(lengths) == T, "at least one row must be fully unpadded")
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return mask


def make_ids(gen, B, T, lengths, lo, hi, pad_id):
    ids = torch.randint(lo, hi, (B, T), generator=gen, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, n:] = pad_id
    return ids


def lm_labels(ids, mask):
    """HF's labels for a causal LM (the ids, padding -100; HF shifts them) and the shifted
    labels the C side uses: labels[b,t] = ids[b,t+1] if t+1 is a real token else -100."""
    B, T = ids.shape
    hf_labels = ids.clone()
    hf_labels[mask == 0] = -100
    shifted = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        for t in range(T - 1):
            if mask[b, t + 1] == 1:
                shifted[b, t] = ids[b, t + 1]
    return hf_labels, shifted


def make_optimizer(model):
    decay, nodecay = [], []
    for n, p in model.named_parameters():
        (nodecay if no_decay(n) else decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": nodecay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            foreach=False)
    try:
        from transformers import get_linear_schedule_with_warmup
        sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=WARMUP_STEPS,
                                                num_training_steps=TOTAL_STEPS)
        sched_src = "transformers.get_linear_schedule_with_warmup"
    except ImportError:
        def lam(step):  # identical formula to transformers' linear schedule
            if step < WARMUP_STEPS:
                return float(step) / float(max(1, WARMUP_STEPS))
            return max(0.0, float(TOTAL_STEPS - step) / float(max(1, TOTAL_STEPS - WARMUP_STEPS)))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        sched_src = "LambdaLR fallback (same formula)"
    return opt, sched, sched_src


# ----------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------
def case_bert_classify():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                     hidden_act="gelu", layer_norm_eps=1e-12, num_labels=3, pad_token_id=0,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     classifier_dropout=0.0, problem_type="single_label_classification")
    B, T, lengths = 4, 16, [16, 11, 4, 13]
    gen = torch.Generator().manual_seed(1001)
    ids = make_ids(gen, B, T, lengths, 1, cfg.vocab_size, cfg.pad_token_id)
    mask = make_lengths_mask(B, T, lengths)
    tt = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):   # second "segment" = last half of the real tokens
        tt[b, n // 2:n] = 1
    labels = torch.tensor([0, 2, 1, 2], dtype=torch.long)
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                hidden_act="gelu", layer_norm_eps=1e-12, num_labels=3, pad_token_id=0,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return dict(cls=BertForSequenceClassification, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="classify", input_ids=ids, mask=mask, token_type_ids=tt, labels=labels,
                pos_module=lambda m: m.bert.embeddings.position_embeddings,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


_GPT2_WANT = dict(vocab_size=101, n_embd=32, n_layer=2, n_head=4, n_positions=40, n_inner=None,
                  activation_function="gelu_new", layer_norm_epsilon=1e-5,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _gpt2_config(**extra):
    from transformers import GPT2Config
    V = 101
    return GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=40, n_inner=None,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                      bos_token_id=V - 1, eos_token_id=V - 1, **extra)


def case_gpt2_lm():
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config()   # pad_token_id left None
    B, T, lengths = 3, 16, [16, 9, 4]
    gen = torch.Generator().manual_seed(2002)
    ids = make_ids(gen, B, T, lengths, 1, cfg.vocab_size, 0)
    mask = make_lengths_mask(B, T, lengths)
    hf_labels, shifted = lm_labels(ids, mask)
    want = dict(_GPT2_WANT)   # tying is checked on the model itself below
    return dict(cls=GPT2LMHeadModel, cfg=cfg, want=want, B=B, T=T, lengths=lengths, task="lm",
                input_ids=ids, mask=mask, token_type_ids=None, labels=shifted,
                hf_labels=hf_labels,
                pos_module=lambda m: m.transformer.wpe,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


def case_gpt2_classify():
    from transformers import GPT2ForSequenceClassification
    cfg = _gpt2_config(num_labels=2, pad_token_id=0, problem_type="single_label_classification")
    B, T, lengths = 4, 16, [12, 16, 5, 9]
    gen = torch.Generator().manual_seed(3003)
    ids = make_ids(gen, B, T, lengths, 1, cfg.vocab_size, cfg.pad_token_id)
    mask = make_lengths_mask(B, T, lengths)
    labels = torch.tensor([1, 0, 1, 0], dtype=torch.long)
    want = dict(_GPT2_WANT, num_labels=2, pad_token_id=0)
    return dict(cls=GPT2ForSequenceClassification, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="classify", input_ids=ids, mask=mask, token_type_ids=None, labels=labels,
                pos_module=lambda m: m.transformer.wpe,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


def _llama_config(V, hidden, heads, kv_heads, layers, inter, tied, rope_scaling=None, **extra):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                       rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=rope_scaling, attention_dropout=0.0,
                       attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=tied,
                       bos_token_id=1, eos_token_id=2, **extra)


def _llama3_rope(factor, original):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original}


def _llama_lm(name_seed, cfg, B, T, lengths):
    from transformers import LlamaForCausalLM
    gen = torch.Generator().manual_seed(name_seed)
    ids = make_ids(gen, B, T, lengths, 3, cfg.vocab_size, 0)
    mask = make_lengths_mask(B, T, lengths)
    hf_labels, shifted = lm_labels(ids, mask)
    want = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_key_value_heads=cfg.num_key_value_heads,
                tie_word_embeddings=cfg.tie_word_embeddings)
    return dict(cls=LlamaForCausalLM, cfg=cfg, want=want, B=B, T=T, lengths=lengths, task="lm",
                input_ids=ids, mask=mask, token_type_ids=None, labels=shifted, hf_labels=hf_labels,
                pos_module=lambda m: m.model.rotary_emb, pos_arg=(1, "position_ids"),
                rope_module=lambda m: m.model.rotary_emb,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


def case_llama_lm_dh64():
    """Head dim 64, one kv head per head, odd vocabulary, padded rows, untied head, default rope."""
    return _llama_lm(4101, _llama_config(61, 128, 2, 2, 1, 40, False), 3, 16, [16, 9, 4])


def case_llama_lm_dh128():
    """Head dim 128, Llama 3.1's rope rule (every band: short, blended and long wavelengths)."""
    return _llama_lm(4102, _llama_config(53, 128, 1, 1, 1, 24, False, _llama3_rope(8.0, 32)), 2, 16, [16, 11])


def case_llama_lm_gqa4_tied():
    """Four query heads per kv head, two layers, the head tied to the embeddings (Llama 3.2)."""
    return _llama_lm(4103, _llama_config(67, 64, 4, 1, 2, 48, True, _llama3_rope(4.0, 16)), 2, 12, [12, 7])


def case_llama_classify():
    from transformers import LlamaForSequenceClassification
    cfg = _llama_config(59, 32, 4, 2, 2, 20, False, num_labels=3, pad_token_id=0,
                        problem_type="single_label_classification")
    B, T, lengths = 4, 10, [10, 6, 3, 8]
    gen = torch.Generator().manual_seed(4104)
    ids = make_ids(gen, B, T, lengths, 3, cfg.vocab_size, cfg.pad_token_id)
    mask = make_lengths_mask(B, T, lengths)
    labels = torch.tensor([2, 0, 1, 2], dtype=torch.long)
    want = dict(num_labels=3, pad_token_id=0, num_key_value_heads=2)
    return dict(cls=LlamaForSequenceClassification, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="classify", input_ids=ids, mask=mask, token_type_ids=None, labels=labels,
                pos_module=lambda m: m.model.rotary_emb, pos_arg=(1, "position_ids"),
                rope_module=lambda m: m.model.rotary_emb,
                expected_pos=torch.arange(T).unsqueeze(0).expand(B, T))


def case_roberta_classify():
    from transformers import RobertaConfig, RobertaForSequenceClassification
    cfg = RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=42, type_vocab_size=1,
                        hidden_act="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        layer_norm_eps=1e-5, num_labels=3,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        classifier_dropout=0.0, problem_type="single_label_classification")
    B, T, lengths = 4, 16, [7, 16, 3, 12]
    gen = torch.Generator().manual_seed(4004)
    ids = make_ids(gen, B, T, lengths, 2, cfg.vocab_size, cfg.pad_token_id)
    mask = make_lengths_mask(B, T, lengths)
    tt = torch.zeros(B, T, dtype=torch.long)
    labels = torch.tensor([2, 0, 1, 1], dtype=torch.long)
    pad = cfg.pad_token_id
    nonpad = (ids != pad).long()
    expected_pos = torch.cumsum(nonpad, dim=1) * nonpad + pad   # create_position_ids_from_input_ids
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=42, type_vocab_size=1,
                pad_token_id=1, layer_norm_eps=1e-5, num_labels=3,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return dict(cls=RobertaForSequenceClassification, cfg=cfg, want=want, B=B, T=T, lengths=lengths,
                task="classify", input_ids=ids, mask=mask, token_type_ids=tt, labels=labels,
                pos_module=lambda m: m.roberta.embeddings.position_embeddings,
                expected_pos=expected_pos)


# Masked LM: the masks are tunegraph's (mlm_masks.py, the plan's Philox stream at the job's
# seed, stream key 0, step s for the forward of optimizer step s), drawn here and fed to HF
# as input_ids and labels, so logits, loss and gradients compare on the same masked batch.
MLM_SEED = 42            # the job's seed (tunegraph's default)
MLM_KEY = 0              # the masking op takes the plan's first stream key
MLM_PROBABILITY = 0.3    # more masked positions than 0.15 in a 4 x 16 batch


def _mlm_spec(cls, cfg, want, B, T, lengths, ids, tt, pos_module, expected_pos, mask_id, special_ids):
    mask = make_lengths_mask(B, T, lengths)
    steps = []
    for s in range(NUM_STEPS + 1):   # the 3 steps, then the forward after them
        masked, labels = mlm_mask(ids.reshape(-1).tolist(), mask.reshape(-1).tolist(), MLM_SEED, s, MLM_KEY,
                                  MLM_PROBABILITY, cfg.vocab_size, mask_id, special_ids)
        check(any(l != -100 for l in labels), "step %d masks no position (HF's loss would be NaN)" % s)
        steps.append((torch.tensor(masked, dtype=torch.long).reshape(B, T),
                      torch.tensor(labels, dtype=torch.long).reshape(B, T)))
    return dict(cls=cls, cfg=cfg, want=want, B=B, T=T, lengths=lengths, task="mlm", input_ids=ids, mask=mask,
                token_type_ids=tt, labels=steps[0][1], mlm_steps=steps, pos_module=pos_module,
                expected_pos=expected_pos,
                mlm=dict(probability=MLM_PROBABILITY, seed=MLM_SEED, key=MLM_KEY, mask_token_id=mask_id,
                         special_token_ids=list(special_ids)))


def case_bert_mlm():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                     hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    B, T, lengths = 4, 16, [16, 11, 6, 13]
    pad, cls_id, sep, unk, mask_id = 0, 1, 2, 3, 4
    gen = torch.Generator().manual_seed(5005)
    ids = make_ids(gen, B, T, lengths, 5, cfg.vocab_size, pad)
    for b, n in enumerate(lengths):   # [CLS] ... [SEP], one [UNK] inside: never masked
        ids[b, 0], ids[b, n - 1], ids[b, n // 2] = cls_id, sep, unk
    tt = torch.zeros(B, T, dtype=torch.long)
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return _mlm_spec(BertForMaskedLM, cfg, want, B, T, lengths, ids, tt,
                     lambda m: m.bert.embeddings.position_embeddings,
                     torch.arange(T).unsqueeze(0).expand(B, T), mask_id, [pad, cls_id, sep, unk])


def case_roberta_mlm():
    from transformers import RobertaConfig, RobertaForMaskedLM
    cfg = RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=42, type_vocab_size=1,
                        hidden_act="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    B, T, lengths = 4, 16, [7, 16, 5, 12]
    bos, pad, eos, unk, mask_id = 0, 1, 2, 3, 98   # <mask> is the last id, as in roberta-base
    gen = torch.Generator().manual_seed(6006)
    ids = make_ids(gen, B, T, lengths, 4, mask_id, pad)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n - 1] = bos, eos
    tt = torch.zeros(B, T, dtype=torch.long)
    nonpad = (ids != pad).long()
    expected_pos = torch.cumsum(nonpad, dim=1) * nonpad + pad
    want = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=42, type_vocab_size=1,
                pad_token_id=1, layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return _mlm_spec(RobertaForMaskedLM, cfg, want, B, T, lengths, ids, tt,
                     lambda m: m.roberta.embeddings.position_embeddings, expected_pos, mask_id,
                     [bos, pad, eos, unk])


CASES = [("bert_classify", case_bert_classify),
         ("llama_lm_dh64", case_llama_lm_dh64),
         ("llama_lm_dh128", case_llama_lm_dh128),
         ("llama_lm_gqa4_tied", case_llama_lm_gqa4_tied),
         ("llama_classify", case_llama_classify),
         ("gpt2_lm", case_gpt2_lm),
         ("gpt2_classify", case_gpt2_classify),
         ("roberta_classify", case_roberta_classify),
         ("bert_mlm", case_bert_mlm),
         ("roberta_mlm", case_roberta_mlm)]


# ----------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------
def forward(model, spec, step=0):
    """The forward of optimizer step `step` (mlm: that step's masks; the others: the batch)."""
    kw = dict(input_ids=spec["input_ids"], attention_mask=spec["mask"])
    if spec["token_type_ids"] is not None:
        kw["token_type_ids"] = spec["token_type_ids"]
    if spec["task"] == "qa":   # labels [B, 2]: each row's start and end token
        kw["start_positions"] = spec["labels"][:, 0]
        kw["end_positions"] = spec["labels"][:, 1]
    else:
        kw["labels"] = spec["hf_labels"] if spec["task"] == "lm" else spec["labels"]
    if spec["task"] == "mlm":
        kw["input_ids"], kw["labels"] = spec["mlm_steps"][step]
    out = model(**kw)
    check(out.loss is not None, "model returned no loss")
    if spec["task"] == "qa":   # the C side's logits: [B, T, 2], start then end per token
        out.logits = torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out


def reference_loss(logits, spec):
    """Recompute the loss from the logits the way the C side does (checks label conventions)."""
    if spec["task"] in ("lm", "mlm"):
        V = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, V).float(), spec["labels"].reshape(-1),
                               ignore_index=-100)
    if spec["task"] == "qa":   # HF: positions clamped to [0, T], T ignored; the two sides averaged
        T = logits.shape[1]
        pos = spec["labels"].clamp(0, T)
        return (F.cross_entropy(logits[..., 0].float(), pos[:, 0], ignore_index=T) +
                F.cross_entropy(logits[..., 1].float(), pos[:, 1], ignore_index=T)) / 2
    return F.cross_entropy(logits.float(), spec["labels"])


def run_case(name, make, outdir):
    print("== %s" % name)
    spec = make()
    case_dir = os.path.join(outdir, name)
    os.makedirs(case_dir, exist_ok=True)

    check_config(spec["cfg"], spec["want"])
    model = build_model(spec["cls"], spec["cfg"])
    check_config(model.config, spec["want"])
    model.to(device="cpu", dtype=torch.float32)
    model.train()   # dropout is 0 everywhere, so train == eval numerically
    check_dropout_zero(model)

    named = list(model.named_parameters())           # deduplicated (tied wte appears once)
    pnames = [n for n, _ in named]
    for n, p in named:
        check(p.dtype == torch.float32, "%s is %s" % (n, p.dtype))
        check(p.device.type == "cpu", "%s on %s" % (n, p.device))
    if spec["task"] == "lm" and hasattr(model, "transformer"):
        check("lm_head.weight" not in pnames, "lm_head.weight should be tied to wte")
        check(model.lm_head.weight is model.transformer.wte.weight
              or model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
              "lm_head.weight is not tied to transformer.wte.weight")
    if spec["task"] == "lm" and hasattr(model, "model"):   # Llama: tied exactly when the config says so
        tied_now = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        check(tied_now == bool(spec["cfg"].tie_word_embeddings) and (("lm_head.weight" in pnames) != tied_now),
              "lm_head tying is %s, the config says %s" % (tied_now, spec["cfg"].tie_word_embeddings))
    if spec["task"] == "mlm":
        head = model.cls.predictions if hasattr(model, "cls") else model.lm_head
        base = model.bert if hasattr(model, "bert") else model.roberta
        bias_name = "cls.predictions.bias" if hasattr(model, "cls") else "lm_head.bias"
        check(head.decoder.weight.data_ptr() == base.embeddings.word_embeddings.weight.data_ptr(),
              "the MLM decoder is not tied to the word embeddings")
        check(head.decoder.bias.data_ptr() == head.bias.data_ptr(), "the MLM decoder bias is not the head's bias")
        check(bias_name in pnames and not any(".decoder." in n for n in pnames),
              "MLM head parameters %s: want %s and no decoder copies" % ([n for n in pnames if "bias" in n], bias_name))
        check(not any("pooler" in n for n in pnames), "a masked-LM model has no pooler")

    init_weights, tied = weights_state_dict(model, pnames)
    print("  params: %d tensors, %d values; tied copies dropped: %s"
          % (len(pnames), sum(v.numel() for v in init_weights.values()), tied or "none"))

    # Real HF config.json + weights.
    cfg = model.config
    cfg.architectures = [type(model).__name__]
    cfg.save_pretrained(case_dir)
    save_file(init_weights, os.path.join(case_dir, "model.safetensors"), metadata={"format": "pt"})

    # --- forward/backward at the initial weights --------------------------------------
    cap = PositionCapture(spec["pos_module"](model), *spec.get("pos_arg", (0, "input")))
    model.zero_grad(set_to_none=True)
    out = forward(model, spec)
    cap.remove()
    logits0 = f32(out.logits)
    loss0 = out.loss.detach().float().reshape(1).clone()
    out.loss.backward()
    grads, no_grad = {}, []
    for n, p in named:
        if p.grad is None:
            no_grad.append(n)
            grads[n] = torch.zeros_like(f32(p))
        else:
            grads[n] = f32(p.grad)
    if no_grad:
        print("  WARNING: parameters without grad (saved as zeros): %s" % no_grad)
    for n, g in grads.items():
        check(torch.isfinite(g).all().item(), "non-finite grad for %s" % n)

    ref = reference_loss(out.logits.detach(), spec)
    check(torch.allclose(ref, loss0[0], rtol=1e-5, atol=1e-6),
          "HF loss %.8g != recomputed loss %.8g (label convention mismatch)" % (loss0.item(), ref.item()))
    B, T = spec["B"], spec["T"]
    if spec["task"] in ("lm", "mlm"):
        check(tuple(logits0.shape) == (B, T, spec["cfg"].vocab_size), "logits shape %s" % (tuple(logits0.shape),))
    elif spec["task"] == "qa":
        check(tuple(logits0.shape) == (B, T, 2), "logits shape %s" % (tuple(logits0.shape),))
    else:
        check(tuple(logits0.shape) == (B, spec["cfg"].num_labels), "logits shape %s" % (tuple(logits0.shape),))

    # Positions HF actually used.
    check(cap.ids is not None, "position-embedding hook did not fire")
    pos_used = cap.ids
    if pos_used.dim() == 1:
        pos_used = pos_used.unsqueeze(0)
    pos_used = pos_used.expand(B, T).clone()
    pos_note = "matches expectation"
    if not torch.equal(pos_used.long(), spec["expected_pos"].long()):
        pos_note = "DIFFERS from the expected formula; saved what HF used"
        print("  WARNING: position ids HF used differ from the expected ones!\n  used=%s\n  expected=%s"
              % (pos_used.tolist(), spec["expected_pos"].tolist()))

    # --- 3 optimizer steps on the same batch ------------------------------------------
    model.zero_grad(set_to_none=True)
    opt, sched, sched_src = make_optimizer(model)
    loss_steps, lr_steps, gn_steps = [], [], []
    for s in range(NUM_STEPS):
        out = forward(model, spec, s)
        loss_steps.append(out.loss.item())
        out.loss.backward()
        gn = torch.nn.utils.clip_grad_norm_([p for _, p in named], max_norm=MAX_GRAD_NORM,
                                            foreach=False)
        gn_steps.append(float(gn))
        lr = opt.param_groups[0]["lr"]
        check(opt.param_groups[1]["lr"] == lr, "param groups disagree on lr")
        lr_steps.append(lr)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    check(abs(loss_steps[0] - loss0.item()) <= 1e-6 * max(1.0, abs(loss0.item())),
          "step-1 loss %.9g != initial loss %.9g (nondeterminism?)" % (loss_steps[0], loss0.item()))
    expect_lr = [LR * (s / WARMUP_STEPS if s < WARMUP_STEPS else
                       max(0.0, (TOTAL_STEPS - s) / (TOTAL_STEPS - WARMUP_STEPS)))
                 for s in range(NUM_STEPS)]
    check(all(abs(a - b) < 1e-12 for a, b in zip(lr_steps, expect_lr)),
          "lr schedule %s != expected %s" % (lr_steps, expect_lr))
    step3 = {n: f32(p) for n, p in named}
    with torch.no_grad():
        loss_after = forward(model, spec, NUM_STEPS).loss.detach().float().reshape(1).clone()
    moved = sum(1 for n in pnames if not torch.equal(step3[n], init_weights[n]))
    check(moved > 0, "no parameter changed after %d steps" % NUM_STEPS)

    # --- golden file --------------------------------------------------------------------
    golden = {
        "input_ids": i32(spec["input_ids"]),
        "attention_mask": f32(spec["mask"]),
        "position_ids": i32(pos_used),
        "labels": i32(spec["labels"]),
        "logits": logits0,
        "loss": loss0.contiguous(),
        "loss_steps": torch.tensor(loss_steps, dtype=torch.float32),
        "lr_steps": torch.tensor(lr_steps, dtype=torch.float32),
        "grad_norm_steps": torch.tensor(gn_steps, dtype=torch.float32),
        "loss_after_steps": loss_after.contiguous(),
    }
    if spec["token_type_ids"] is not None:
        golden["token_type_ids"] = i32(spec["token_type_ids"])
    if "rope_module" in spec:   # the rotary inverse frequencies HF computed (its buffer)
        golden["rope_inv_freq"] = f32(spec["rope_module"](model).inv_freq)
    if spec["task"] == "mlm":   # the masks of each step, [steps + 1, B, T]
        golden["mlm_input_ids"] = i32(torch.stack([m for m, _ in spec["mlm_steps"]]))
        golden["mlm_labels"] = i32(torch.stack([l for _, l in spec["mlm_steps"]]))
    for n in pnames:
        golden["grad." + n] = grads[n]
        golden["step3." + n] = step3[n]
    for k, v in golden.items():
        check(v.dtype in (torch.float32, torch.int32), "%s dtype %s" % (k, v.dtype))
        check(v.is_contiguous(), "%s not contiguous" % k)
        if v.dtype == torch.float32:
            check(torch.isfinite(v).all().item(), "%s has non-finite values" % k)
    save_file(golden, os.path.join(case_dir, "golden.safetensors"), metadata={"case": name})

    # --- reload check: the saved files are what HF would load ---------------------------
    reload_check = "ok"
    try:
        res = spec["cls"].from_pretrained(case_dir, attn_implementation="eager",
                                          output_loading_info=True)
        m2, info = res if isinstance(res, tuple) else (res, {})
    except TypeError:
        m2, info = spec["cls"].from_pretrained(case_dir, attn_implementation="eager"), {}

    def info_get(key):
        v = info.get(key) if isinstance(info, dict) else getattr(info, key, None)
        return list(v or [])
    missing = set(map(str, info_get("missing_keys"))) - set(tied)
    unexpected = set(map(str, info_get("unexpected_keys")))
    mismatched = info_get("mismatched_keys")
    check(not missing and not unexpected and not mismatched,
          "reload: missing %s unexpected %s mismatched %s" % (sorted(missing), sorted(unexpected), mismatched))
    m2.to(dtype=torch.float32)
    m2.train()
    with torch.no_grad():
        out2 = forward(m2, spec)
    check(torch.allclose(f32(out2.logits), logits0, rtol=0, atol=1e-6),
          "reloaded model logits differ (max abs %.3g)" % (f32(out2.logits) - logits0).abs().max().item())
    g2 = load_file(os.path.join(case_dir, "golden.safetensors"))
    check(set(g2) == set(golden), "golden reload keys")

    # --- meta -------------------------------------------------------------------------
    shapes = {n: list(init_weights[n].shape) for n in pnames}
    meta = {
        "case": name,
        "model_class": type(model).__name__,
        "task": spec["task"],
        "num_labels": int(spec["cfg"].num_labels) if spec["task"] == "classify" else None,
        "B": B, "T": T, "lengths": spec["lengths"],
        "padding_side": "right",
        "optimizer": {"type": "torch.optim.AdamW", "foreach": False,
                      "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY,
                      "no_decay_rule": NO_DECAY_RULE,
                      "no_decay_params": [n for n in pnames if no_decay(n)],
                      "decay_params": [n for n in pnames if not no_decay(n)]},
        "scheduler": {"type": "linear_schedule_with_warmup", "source": sched_src,
                      "num_warmup_steps": WARMUP_STEPS, "num_training_steps": TOTAL_STEPS},
        "num_steps": NUM_STEPS,
        "max_grad_norm": MAX_GRAD_NORM,
        "step_order": "forward, backward, clip_grad_norm_, optimizer.step, scheduler.step, zero_grad",
        "same_batch_every_step": True,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "seed": 0,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "loss": loss0.item(),
        "loss_steps": loss_steps, "lr_steps": lr_steps, "grad_norm_steps": gn_steps,
        "loss_after_steps": loss_after.item(),
        "logits_shape": list(logits0.shape),
        "param_names": pnames,
        "param_shapes": shapes,
        "tied_weights_dropped": tied,
        "embedding_padding_idx": embedding_padding_idx(model),
        "params_without_grad": no_grad,
        "position_ids_check": pos_note,
        "reload_check": reload_check,
    }
    if spec["task"] == "mlm":
        meta["mlm"] = dict(spec["mlm"], masks="tests/golden/mlm_masks.py; step s of the optimizer masks with "
                           "Philox step s; golden mlm_input_ids/mlm_labels[s]; labels = mlm_labels[0]")
    if spec["task"] == "lm":
        meta["labels_note"] = ("labels are shifted: labels[b,t] = input_ids[b,t+1] if t+1 is a real "
                               "token else -100; HF was called with unshifted labels = input_ids "
                               "with padding set to -100")
    with open(os.path.join(case_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    print("  loss %.7f  logits %s  params %d tensors (%d values)"
          % (loss0.item(), tuple(logits0.shape), len(pnames), sum(v.numel() for v in init_weights.values())))
    print("  loss_steps %s  lr_steps %s  grad_norm_steps %s  loss_after %.7f"
          % (["%.7f" % x for x in loss_steps], lr_steps, ["%.5f" % x for x in gn_steps], loss_after.item()))
    print("  position ids: %s; embedding padding_idx: %s" % (pos_note, meta["embedding_padding_idx"]))


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    return total


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    outdir = sys.argv[1]
    names = sys.argv[2:]
    unknown = set(names) - {n for n, _ in CASES}
    check(not unknown, "unknown cases %s (known: %s)" % (sorted(unknown), [n for n, _ in CASES]))
    os.makedirs(outdir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)   # fixed reduction order
    torch.set_default_dtype(torch.float32)
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    for name, make in CASES:
        if not names or name in names:
            run_case(name, make, outdir)
    total = dir_bytes(outdir)
    print("total size of %s: %d bytes" % (outdir, total))
    check(total < MAX_OUTDIR_BYTES, "OUTDIR is %d bytes, over the 3 MiB budget" % total)
    print("OK")


if __name__ == "__main__":
    main()
