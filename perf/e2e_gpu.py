"""End-to-end GPU throughput of meshtron against PyTorch, in one run (issue 9).

For each model (GPT-2 124M / 350M / 774M / 1.5B shapes, seq 1024; llama-1b,
seq 2048; bert-large, seq 512; t5-base, encoder 512 and decoder 128 tokens;
bf16, dropout 0 or --dropout, synthetic tokens)
it trains meshtron for --warmup + --steps steps on one GPU,
then the same model in PyTorch (perf/torch_baseline.py: transformers
GPT2LMHeadModel / LlamaForCausalLM / MegatronBertForPreTraining /
T5ForConditionalGeneration, bf16 autocast, SDPA where the model has it,
fused AdamW, torch.compile), and prints
tokens/s/GPU, ms/step, TFLOP/s/GPU, MFU and the ratio meshtron / PyTorch.
With --gpus 2 it also trains meshtron with dp 2 and with tp 2 (and, asked for,
pp 2 with the 1F1B or the interleaved schedule) and prints the scaling against
one GPU (throughput of 2 GPUs / throughput of 1, and that / 2 as the scaling efficiency). Its first
line names the machine, date and command (machine()), for perf/RESULTS.md.

FLOPs per token, as meshtron prints them (no attention-mask discount):
    F = 3 x 2 x [L (4 h^2 + 2 h f + 2 s h) + h V],  V = 50304 (padded; BERT: 30592)
T5 counts encoder tokens (tokens/s too): per sample, s_e encoder tokens through
L_e layers, s_d decoder tokens through L_d layers with their cross-attention
over s_e keys, the head on the s_d decoder tokens, divided by s_e (V = 32128).
MFU = F x tokens/s/GPU / peak, peak = 989 TFLOP/s (H100/H200 dense bf16).

    python3 perf/e2e_gpu.py --meshtron build-gpu/meshtron --models 124m 350m 774m
    python3 perf/e2e_gpu.py --meshtron build-gpu/meshtron --models bert-large   # BERT (MLM + SOP)
    python3 perf/e2e_gpu.py --meshtron build-gpu/meshtron --models t5-base      # T5 (span-corruption shape)
    python3 perf/e2e_gpu.py --meshtron build-gpu/meshtron --models 774m --gpus 2 --no-torch
        # dp2, tp2 (SP on NCCL) and tp2i (no SP, copy engines, interleaved pairs) against one GPU;
        # add --accumulate 8 for the like-for-like step of perf/RESULTS.md's tp 2 numbers
    python3 perf/e2e_gpu.py ... --set parallel.overlap_grad_reduce=true   # any deck override
    python3 perf/e2e_gpu.py ... --tune-gemms   # both autotune GEMMs (run.gemm_autotune, TunableOp)
    python3 perf/e2e_gpu.py --models 774m --gpus 2 --layouts tp2 --no-torch \
        --tp-variant plain:8:1:parallel.tp_copy_engine=true \
        --tp-variant interleaved:4:2:parallel.tp_copy_engine=true,parallel.tp_interleave=true
        # tp 2 variants (name:micro-batch:micro-batches per step:settings) against one 1-GPU run
    python3 perf/e2e_gpu.py ... --llmc /path/to/llm.c/train_gpt2cu   # also llm.c (perf/llmc_baseline.py)
    python3 perf/e2e_gpu.py --models 774m --gpus 2 --layouts pp2 pp2i --accumulate 8 --no-torch
        # pipeline: 2 stages, 8 micro-batches per step (1F1B; interleaved, 2 chunks per stage)
    python3 perf/e2e_gpu.py --models 774m --gpus 2 --layouts pp2 --accumulate 8 --no-torch \
        --pp-split 18,18 --pp-split balanced   # 1F1B rows with these layers per stage (the last
        # stage also runs the LM head and the loss: balanced = 19,17), against one 1-GPU run
    python3 perf/e2e_gpu.py --meshtron build-gpu/meshtron --compare base/build-gpu/meshtron \
        --models 774m --gpus 2 --layouts tp2 --no-torch   # A/B: each run by both trees in turn

Runs on the GPU node; PyTorch is the baseline here, never part of meshtron.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEAK = 989e12
SEQ = 1024  # the GPT-2 decks' seq_length, for every framework (SEQS: the others)
DECKS = {"124m": "input_decks/gpt2-124m.deck", "350m": "input_decks/gpt2-350m.deck",
         "774m": "input_decks/gpt2-774m.deck", "1.5b": "input_decks/gpt2-1.5b.deck",
         "llama-1b": "input_decks/llama-1b.deck", "bert-large": "input_decks/bert-large.deck",
         "t5-base": "input_decks/t5-base.deck"}
# (layers, hidden, heads) of each model, for every framework's run.
SHAPES = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20),
          "1.5b": (48, 1600, 25), "llama-1b": (22, 2048, 32), "bert-large": (24, 1024, 16),
          "t5-base": (12, 768, 12)}
# Llama shapes: (kv groups, SwiGLU ffn size) and their own sequence length
# (TinyLlama-1.1B's 2048); both frameworks train the GPT-2 vocabulary.
LLAMA = {"llama-1b": (4, 5632)}
SEQS = {"llama-1b": 2048, "bert-large": 512, "t5-base": 512}
# BERT shapes (MegatronBertForPreTraining, GeLU MLP of 4 h): their
# vocabulary, bert-base-uncased's WordPiece. Both frameworks train the same
# synthetic batches: real tokens up to a length in [s/2, s] (the rest
# padding, masked out of the attention), segment B from the middle, an MLM
# label on token 1 and on about 15 % of the other real tokens, a random
# next-sentence label (meshtron's data.source = synthetic for BERT,
# src/train/data_source.cpp); tokens/s counts every position, padding too.
BERT_VOCAB = {"bert-large": 30522}
# T5 shapes (T5ForConditionalGeneration v1.0: ReLU, tied head, 32 relative
# buckets over 128): (decoder layers, d_kv, d_ff, decoder length, vocabulary:
# t5's SentencePiece pieces and 100 sentinels as its config pads them).
# SHAPES holds the encoder's layers, SEQS its length (the tokens counted).
# Both frameworks train the same synthetic batches: encoder tokens up to a
# length in [s/2, s] (the rest padding, masked out), decoder inputs of 2 to
# s_d real tokens starting from 0 (the rest padding, masked out), a label on
# each real decoder token (meshtron's data.source = synthetic for T5).
T5 = {"t5-base": (12, 64, 3072, 128, 32128)}


def padded_vocab(name):
    """The vocabulary as meshtron pads it (make_vocab_size_divisible_by = 128)."""
    vocab = T5[name][4] if name in T5 else BERT_VOCAB.get(name, 50257)
    return -(-vocab // 128) * 128


def seq_of(name):
    return SEQS.get(name, SEQ)
# The 2-GPU layouts: label -> (tp, dp, pp, their own deck settings). The
# pipeline needs several micro-batches per step (--accumulate) to fill; CUDA
# graphs do not take it (parallel.pipeline_parallel = 1 only). tp2 is
# Megatron's layout (SP, NCCL); tp2i the fastest measured one (no SP, the copy
# engines, pairs of micro-batches interleaved: perf/RESULTS.md, "Two GPUs
# (NVLink), GPT-2 774M"), which needs at least 2 micro-batches per step and
# runs eager (CUDA graphs take neither the copy engines nor the interleave).
TP_INTERLEAVED = {"parallel.sequence_parallel": "false",
                  "parallel.sequence_parallel_keep_gathered": "false",  # whatever --tp-set says
                  "parallel.tp_copy_engine": "true", "parallel.tp_interleave": "true",
                  "training.cuda_graphs": "false"}
LAYOUTS = {"dp2": (1, 2, 1, {}), "tp2": (2, 1, 1, {}), "tp2i": (2, 1, 1, TP_INTERLEAVED),
           "pp2": (1, 1, 2, {"parallel.schedule": "1f1b"}),
           "pp2i": (1, 1, 2, {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2})}


def t5_flops_per_token(name, seq, vocab):
    """T5's count per encoder token, as meshtron's (src/train/metrics.cpp): per sample the
    encoder's layers over s_e tokens, the decoder's over s_d with the cross-attention (q and o
    per decoder token, the core over s_e keys, k and v of the s_e encoder outputs), the head
    on the s_d decoder tokens; divided by s_e."""
    layers, hidden, heads = SHAPES[name]
    decoder_layers, d_kv, d_ff, decoder_seq, _ = T5[name]
    inner = heads * d_kv

    def layer(keys):
        return 4 * hidden * inner + 2 * hidden * d_ff + 2 * keys * inner
    sample = (seq * layers * layer(seq)
              + decoder_layers * (decoder_seq * (layer(decoder_seq) + 2 * hidden * inner + 2 * seq * inner)
                                  + seq * 2 * hidden * inner)
              + decoder_seq * hidden * vocab)
    return 6.0 * sample / seq


def flops_per_token(name, seq=None, vocab=None):
    """6 x (the matmul parameters + the attention scores' 2 s h per layer), as meshtron counts
    (BERT: the MLM head's dense, the pooler and the binary head are not counted; T5:
    t5_flops_per_token)."""
    layers, hidden, heads = SHAPES[name]
    seq = seq or seq_of(name)
    vocab = vocab or padded_vocab(name)
    if name in T5:
        return t5_flops_per_token(name, seq, vocab)
    if name in LLAMA:
        groups, ffn = LLAMA[name]
        kv = 2 * groups * (hidden // heads)
        per_layer = hidden * (hidden + kv) + hidden * hidden + 3 * hidden * ffn
    else:
        per_layer = 4 * hidden * hidden + 2 * hidden * 4 * hidden
    return 6.0 * (layers * (per_layer + 2 * seq * hidden) + hidden * vocab)


def run_meshtron(binary, name, micro_batch, steps, warmup, tp=1, dp=1, recompute="none", extra=(),
                 accumulate=1, pp=1):
    """Train `steps + warmup` steps; return the mean ms/step of the last `steps` (from the JSONL)."""
    out = tempfile.mkdtemp(prefix="e2e_")
    ranks = tp * dp * pp
    sets = {"run.output_dir": out, "data.source": "synthetic", "data.vocab_file": "", "data.merge_file": "",
            "training.train_iters": steps + warmup, "training.micro_batch_size": micro_batch,
            "training.global_batch_size": micro_batch * dp * accumulate, "training.precision": "bf16",
            "training.recompute": recompute, "training.eval_interval": 0, "lr_schedule.warmup_iters": 1,
            "checkpoint.save_dir": "", "checkpoint.load": "", "logging.log_interval": 1,
            "logging.progress": "off", "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
            "parallel.tensor_parallel": tp, "parallel.data_parallel": dp, "parallel.pipeline_parallel": pp,
            "parallel.sequence_parallel": "true" if tp > 1 else "false",
            "parallel.distributed_optimizer": "true" if dp > 1 else "false"}
    if name in BERT_VOCAB:  # synthetic data reads no vocab.txt (the deck's stays, as WordPiece
        sets["model.vocab_size"] = BERT_VOCAB[name]  # needs one named): the size instead
        del sets["data.vocab_file"]
    if name in T5:  # the deck's own size (synthetic data reads no tokenizer)
        sets["model.vocab_size"] = T5[name][4]
    # The caller's overrides (--set K=V pairs) replace these defaults: the
    # deck parser takes each key once.
    for flag, kv in zip(extra[::2], extra[1::2]):
        assert flag == "--set", extra
        key, value = kv.split("=", 1)
        sets[key] = value
    cmd = ["mpirun", "-np", str(ranks), binary, "train", DECKS[name]]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    planned = planned_peak_mib(binary, cmd[cmd.index("train") + 1:])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return None
        metrics = glob.glob(os.path.join(out, "**", "metrics.jsonl"), recursive=True)  # out/<run name>/
        with open(metrics[0]) as f:
            lines = [json.loads(l) for l in f if '"ms_per_step"' in l]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    timed = [l for l in lines if l["iteration"] > warmup]
    ms = sum(l["ms_per_step"] for l in timed) / len(timed)
    last = timed[-1]
    measured = max(l.get("tensor_memory_mib", 0) for l in lines)
    return {"ms_per_step": ms, "memory_mib": max(l["memory_mib"] for l in timed), "loss": last["loss"],
            # issue 67's check of `meshtron plan`: its peak against the allocator's measured peak
            "tensor_memory_mib": measured, "plan_mib": planned,
            "plan_over_measured": planned / measured if planned and measured else None,
            # meshtron's own model FLOPs per token (its log's F), for checking flops_per_token
            "flops_per_token": last["tflops_per_rank"] * 1e12 / last["tokens_per_s_per_rank"]}


def planned_peak_mib(binary, deck_and_sets):
    """`meshtron plan`'s "peak tensor memory (max over ranks)" for the same deck and settings."""
    proc = subprocess.run([binary, "plan", *deck_and_sets], capture_output=True, text=True)
    found = re.search(r"^peak tensor memory \(max over ranks\): ([0-9.]+) MiB", proc.stdout, re.M)
    return float(found.group(1)) if found else None


def plan_against_measured(run):
    """The row's memory check: plan's peak, the measured one and their ratio (None where absent)."""
    ratio = run.get("plan_over_measured")
    return {"tensor_memory_mib": run.get("tensor_memory_mib") and round(run["tensor_memory_mib"]),
            "plan_mib": run.get("plan_mib"), "plan_over_measured": ratio and round(ratio, 3)}


def machine():
    """Where and when a run happened, for its perf/RESULTS.md entry: the UTC
    time, each GPU's name and driver (nvidia-smi; none without it), the command."""
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout
    except OSError:
        query = ""
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpus": [line.strip() for line in query.splitlines() if line.strip()],
            "command": " ".join(["python3"] + sys.argv)}


def report(name, framework, micro_batch, gpus, ms, extra=None, accumulate=1, echo=True):
    tps_gpu = accumulate * micro_batch * seq_of(name) / (ms / 1e3)
    row = {"model": name, "framework": framework, "gpus": gpus, "micro_batch": micro_batch,
           "micro_batches_per_step": accumulate,
           "ms_per_step": round(ms, 2), "tokens_per_s_per_gpu": round(tps_gpu),
           "tflops_per_gpu": round(tps_gpu * flops_per_token(name) / 1e12, 1),
           "mfu": round(tps_gpu * flops_per_token(name) / PEAK, 4)}
    row.update(extra or {})
    if echo:
        print(json.dumps(row), flush=True)
    return row


def speedup(one_ms, one_tokens, two_ms, two_tokens):
    """Throughput of a 2-GPU run over the one-GPU run's: tokens per step over
    ms per step of each (dp 2 trains dp x the micro-batches of a step)."""
    return (two_tokens / two_ms) / (one_tokens / one_ms)


def pipeline_bound(pp, virtual_stages, micro_batches):
    """The speed-up over one GPU that the pipeline bubble alone allows: each
    of pp stages computes 1/pp of the step and idles (pp - 1) / (v m) of that
    time (Narayanan et al., 2021; measured on CPU ranks by
    perf/bench_pipeline_bubble.cpp). Stage imbalance and p2p come on top."""
    return pp / (1 + (pp - 1) / (virtual_stages * micro_batches))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshtron", default="build-gpu/meshtron")
    parser.add_argument("--compare", default=None, metavar="BINARY",
                        help="a second meshtron binary (another tree's build): every meshtron run "
                             "is repeated with it straight after, its rows tagged tree=compare "
                             "(the others tree=main) and scaled against its own one-GPU run: an "
                             "A/B in one command, on one machine")
    parser.add_argument("--models", nargs="+", default=["124m", "350m", "774m"])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--recompute", default="none")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--layouts", nargs="+", default=["dp2", "tp2", "tp2i"], choices=list(LAYOUTS),
                        help="with --gpus 2: which 2-GPU layouts to run after the 1-GPU run "
                             "(tp2: SP on NCCL, as Megatron; tp2i: no SP, copy engines, "
                             "parallel.tp_interleave, at least 2 micro-batches per step; "
                             "pp2: 1F1B, pp2i: interleaved 1F1B with 2 chunks per stage)")
    parser.add_argument("--tp-micro-batch", type=int, default=None,
                        help="micro-batch of the tp 2 run (default: --micro-batch); tp 2 holds half "
                             "the model per GPU, so it can take a larger one. The row names it, and "
                             "the speed-up compares tokens/s with the one-GPU run's micro-batch")
    parser.add_argument("--tp-accumulate", type=int, default=None,
                        help="micro-batches per step of the tp 2 run (default: --accumulate); with "
                             "parallel.tp_interleave (pairs of micro-batches) e.g. --tp-micro-batch 4 "
                             "--tp-accumulate 2 trains the one-GPU run's 8 x 1024 tokens per step")
    parser.add_argument("--tp-variant", action="append", default=[],
                        metavar="NAME:MB:ACC:KEY=VALUE,...",
                        help="with --gpus 2: instead of the one tp 2 row, one row per variant, all "
                             "against the same one-GPU run (one baseline for many tp settings: e.g. "
                             "'interleave:4:2:parallel.tp_interleave=true'; the variant's settings "
                             "add to --set and --tp-set; repeatable)")
    parser.add_argument("--pp-split", action="append", default=[], metavar="N0,N1",
                        help="with --layouts pp2 / pp2i: instead of one row per pipeline layout, "
                             "one per split of the layers (parallel.pipeline_layers: N0,N1 for pp2, "
                             "or balanced, which pp2i takes too), all against the same one-GPU "
                             "run (repeatable)")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step (gradient accumulation, both frameworks)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P",
                        help="hidden, embedding and attention dropout of both frameworks "
                             "(meshtron's model.hidden_dropout and model.attention_dropout, "
                             "PyTorch's resid/embd/attn_pdrop; Megatron-LM's default is 0.1); "
                             "default 0")
    parser.add_argument("--llmc", default=None, metavar="BINARY",
                        help="llm.c's train_gpt2cu (built by you, not part of meshtron): trains the "
                             "same shapes after PyTorch (perf/llmc_baseline.py) and prints the ratio")
    parser.add_argument("--llmc-extra", default="", help="more llm.c flags, e.g. '-ge 1'")
    parser.add_argument("--tune-gemms", action="store_true",
                        help="both frameworks autotune their GEMMs: meshtron's run.gemm_autotune, "
                             "PyTorch's TunableOp (a like-for-like comparison)")
    parser.add_argument("--dp-set", action="append", default=[], metavar="KEY=VALUE",
                        help="deck override for the dp 2 run only, e.g. "
                             "parallel.overlap_grad_reduce=true (repeatable)")
    parser.add_argument("--tp-set", action="append", default=[], metavar="KEY=VALUE",
                        help="deck override for the tp 2 run only, e.g. "
                             "parallel.sequence_parallel_keep_gathered=true (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra deck override for every meshtron run, e.g. "
                             "parallel.overlap_grad_reduce=true (with it, also "
                             "parallel.distributed_optimizer=true; repeatable)")
    args = parser.parse_args()
    print(json.dumps(machine()), flush=True)
    if args.tune_gemms:
        args.set.append("run.gemm_autotune=true")
    if args.dropout > 0:  # before the --set overrides, which may replace them
        args.set[:0] = [f"model.hidden_dropout={args.dropout}",
                        f"model.attention_dropout={args.dropout}"]
    extra = [arg for kv in args.set for arg in ("--set", kv)]
    dp_extra = extra + [arg for kv in args.dp_set for arg in ("--set", kv)]
    tp_extra = extra + [arg for kv in args.tp_set for arg in ("--set", kv)]

    # (tag, binary): with --compare every meshtron run is made by both, one after the other.
    trees = [("main", args.meshtron)] + ([("compare", args.compare)] if args.compare else [])
    tagged = (lambda tag, row: {"tree": tag, **row}) if args.compare else (lambda tag, row: row)

    for name in args.models:
        mb = args.micro_batch
        acc = args.accumulate
        one = {}  # tree -> its one-GPU run
        for tag, binary in trees:
            run = run_meshtron(binary, name, mb, args.steps, args.warmup, recompute=args.recompute,
                               extra=extra, accumulate=acc)
            if run is None:
                print(json.dumps(tagged(tag, {"model": name, "framework": "meshtron",
                                              "error": "run failed"})), flush=True)
                continue
            one[tag] = run
            row = report(name, "meshtron", mb, 1, run["ms_per_step"],
                         {"memory_mib": round(run["memory_mib"]), "recompute": args.recompute,
                          **plan_against_measured(run)},
                         accumulate=acc, echo=False)
            print(json.dumps(tagged(tag, row)), flush=True)
            if tag == "main":
                mine = row
        if "main" not in one:
            continue
        if not args.no_torch:
            import torch_baseline  # imports torch only when asked for
            base = torch_baseline.run(name, mb, args.steps, args.warmup, accumulate=acc,
                                      tune_gemms=args.tune_gemms, dropout=args.dropout)
            ratio = mine["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
            print(json.dumps({"model": name, "ratio_meshtron_over_pytorch": round(ratio, 3)}), flush=True)
        if args.llmc:
            import llmc_baseline
            base = llmc_baseline.run(args.llmc, name, mb, args.steps, args.warmup, accumulate=acc,
                                     extra=args.llmc_extra.split())
            if base is not None:
                ratio = mine["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
                print(json.dumps({"model": name, "ratio_meshtron_over_llmc": round(ratio, 3)}), flush=True)
        if args.gpus >= 2:
            runs = [(label, None) for label in LAYOUTS if label in args.layouts]
            if args.tp_variant:
                runs = [r for r in runs if r[0] != "tp2"] + [("tp2", v) for v in args.tp_variant]
            if args.pp_split:  # each pipeline layout once per split instead
                pipelines = [label for label, _ in runs if LAYOUTS[label][2] > 1]
                runs = [r for r in runs if r[0] not in pipelines] + \
                    [(label, split) for label in pipelines for split in args.pp_split]
            for label, variant in runs:
                tp, dp, pp, layout_sets = LAYOUTS[label]
                two_mb = args.tp_micro_batch if tp > 1 and args.tp_micro_batch else mb
                two_acc = args.tp_accumulate if tp > 1 and args.tp_accumulate else acc
                extra_two = (dp_extra if dp > 1 else tp_extra if tp > 1 else extra) + \
                    [a for key, value in layout_sets.items() for a in ("--set", f"{key}={value}")]
                variant_name = None
                if variant is not None and pp > 1:  # a --pp-split
                    variant_name = variant
                    extra_two = extra_two + ["--set", f"parallel.pipeline_layers={variant}"]
                elif variant is not None:  # NAME:MB:ACC:KEY=VALUE,...
                    variant_name, v_mb, v_acc, v_sets = (variant.split(":", 3) + [""])[:4]
                    two_mb, two_acc = int(v_mb), int(v_acc)
                    extra_two = extra_two + [a for kv in v_sets.split(",") if kv for a in ("--set", kv)]
                if layout_sets.get("parallel.tp_interleave") == "true" and two_acc < 2:
                    two_acc = 2  # the interleave pairs micro-batches: at least 2 per step
                for tag, binary in trees:
                    if tag not in one:
                        continue
                    two = run_meshtron(binary, name, two_mb, args.steps, args.warmup, tp=tp, dp=dp, pp=pp,
                                       recompute=args.recompute, extra=extra_two, accumulate=two_acc)
                    if two is None:
                        print(json.dumps(tagged(tag, {"model": name, "layout": label,
                                                      "variant": variant_name,
                                                      "error": "run failed"})), flush=True)
                        continue
                    tokens = two_mb * seq_of(name) * dp * two_acc
                    gain = speedup(one[tag]["ms_per_step"], mb * seq_of(name) * acc, two["ms_per_step"], tokens)
                    row = {"model": name, "layout": label, "variant": variant_name,
                           "micro_batch": two_mb, "micro_batches_per_step": two_acc,
                           "ms_per_step": round(two["ms_per_step"], 2),
                           "tokens_per_s_total": round(tokens / two["ms_per_step"] * 1e3),
                           "speedup_over_1_gpu": round(gain, 3),
                           "scaling_efficiency": round(gain / (tp * dp * pp), 3)}
                    if pp > 1:
                        v = int(layout_sets.get("parallel.virtual_stages", 1))
                        row["bubble_bound"] = round(pipeline_bound(pp, v, two_acc), 3)
                    row["memory_mib"] = round(two["memory_mib"])
                    print(json.dumps(tagged(tag, row)), flush=True)

if __name__ == "__main__":
    main()
