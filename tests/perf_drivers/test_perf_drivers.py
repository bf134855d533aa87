"""The GPU perf drivers' bookkeeping, checked on the host (CTest perf_drivers).

Issue 9's targets are judged by the MFU that perf/e2e_gpu.py (and through
its report, perf/llmc_baseline.py and perf/torch_baseline.py) computes. This
checks, without a GPU, that their shape table matches the decks meshtron
trains and llm.c's depth flags, and that their FLOPs formula equals the one
meshtron logs, on a short host run through the driver's own run_meshtron,
and what its 2-GPU rows report (speed-up, pipeline bubble bound) with the
trainer replaced by fixed timings.

    python3 tests/perf_drivers/test_perf_drivers.py --meshtron build/meshtron   # from the source root
"""
import argparse
import configparser
import contextlib
import datetime
import io
import json
import math
import os
import subprocess
import sys
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "perf"))
import compare_memory  # noqa: E402
import e2e_gpu  # noqa: E402
import llmc_baseline  # noqa: E402

MESHTRON = None  # set from --meshtron


def deck_model(path):
    deck = configparser.ConfigParser(inline_comment_prefixes=("#",))
    deck.read(os.path.join(ROOT, path))
    model = deck["model"]
    return (model.getint("num_layers"), model.getint("hidden_size"),
            model.getint("num_attention_heads"), model.getint("seq_length"))


def two_gpu_rows(argv, ms_per_step):
    """main() with argv and the trainer replaced by fixed timings:
    ms_per_step(tp, dp, pp, accumulate) -> ms. Returns the rows by layout
    ("one" for the 1-GPU run) and the calls as (tp, dp, pp, accumulate,
    the --set pairs)."""
    calls = []

    def fake_run(binary, name, micro_batch, steps, warmup, tp=1, dp=1, recompute="none",
                 extra=(), accumulate=1, pp=1):
        calls.append((tp, dp, pp, accumulate, dict(kv.split("=", 1) for kv in extra[1::2])))
        return {"ms_per_step": ms_per_step(tp, dp, pp, accumulate), "memory_mib": 1000.0,
                "loss": 5.0, "flops_per_token": 1.0}

    out = io.StringIO()
    with mock.patch.object(e2e_gpu, "run_meshtron", fake_run), \
            mock.patch.object(sys, "argv", ["e2e_gpu.py"] + argv), contextlib.redirect_stdout(out):
        e2e_gpu.main()
    rows = {r.get("layout", "one"): r for r in map(json.loads, out.getvalue().splitlines())
            if "model" in r}
    return rows, calls


class PerfDrivers(unittest.TestCase):
    def test_every_model_has_a_deck_llmc_depth_and_matching_shape(self):
        self.assertEqual(set(e2e_gpu.DECKS), set(e2e_gpu.SHAPES))
        # llm.c trains GPT-2 only; the Llama shapes have their kv groups and ffn size,
        # the BERT shapes their vocabulary, the T5 shapes their decoder and vocabulary.
        gpt2 = set(e2e_gpu.DECKS) - set(e2e_gpu.LLAMA) - set(e2e_gpu.BERT_VOCAB) - set(e2e_gpu.T5)
        self.assertEqual(gpt2, set(llmc_baseline.DESCRIPTORS))
        for name, deck in e2e_gpu.DECKS.items():
            layers, hidden, heads, seq = deck_model(deck)
            self.assertEqual(e2e_gpu.SHAPES[name], (layers, hidden, heads), deck)
            self.assertEqual(seq, e2e_gpu.seq_of(name), deck)  # report() counts seq_of tokens per sequence
            if name in gpt2:
                self.assertEqual(llmc_baseline.DESCRIPTORS[name], f"d{layers}", name)
            if name in e2e_gpu.T5:
                deck_t5 = configparser.ConfigParser(inline_comment_prefixes=("#",))
                deck_t5.read(os.path.join(ROOT, deck))
                model = deck_t5["model"]
                self.assertEqual(e2e_gpu.T5[name], tuple(model.getint(k) for k in (
                    "decoder_num_layers", "kv_channels", "ffn_hidden_size", "decoder_seq_length",
                    "vocab_size")), deck)

    def test_every_deck_validates_as_shipped(self):
        # `meshtron info` on the deck's own tp x pp ranks: the resolved deck
        # and its decomposition, or one error line (e.g. a pipeline split
        # that does not fit the layers).
        for name, deck in e2e_gpu.DECKS.items():
            parallel = configparser.ConfigParser(inline_comment_prefixes=("#",))
            parallel.read(os.path.join(ROOT, deck))
            ranks = parallel["parallel"].getint("tensor_parallel") * \
                parallel["parallel"].getint("pipeline_parallel")
            proc = subprocess.run(["mpirun", "-np", str(ranks), MESHTRON, "info", deck],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, f"{deck}: {proc.stdout[-500:]} {proc.stderr[-500:]}")
            self.assertIn(f"topology: world={ranks} ", proc.stdout, deck)

    def test_flops_per_token_equals_meshtrons(self):
        # The tiny deck on CPU ranks, 3 steps, through the driver's own run
        # (synthetic tokens: GPT-2's vocabulary padded to 50304, as on GPUs).
        deck = "input_decks/gpt-tiny.deck"
        layers, hidden, heads, seq = deck_model(deck)
        with mock.patch.dict(e2e_gpu.DECKS, tiny=deck), \
                mock.patch.dict(e2e_gpu.SHAPES, tiny=(layers, hidden, heads)):
            run = e2e_gpu.run_meshtron(MESHTRON, "tiny", micro_batch=2, steps=2, warmup=1,
                                       extra=["--set", "run.device=cpu", "--set", "training.precision=fp32"])
            self.assertIsNotNone(run, "meshtron's run failed (its output is above)")
            want = e2e_gpu.flops_per_token("tiny", seq=seq)
        self.assertTrue(math.isfinite(run["loss"]) and run["ms_per_step"] > 0, run)
        # meshtron's F from its own metrics (TFLOP/s over tokens/s, 10 digits logged)
        self.assertAlmostEqual(run["flops_per_token"] / want, 1.0, places=6)
        # meshtron plan on the same deck and settings against the measured peak
        self.assertIsNotNone(run["plan_over_measured"], run)
        self.assertLess(abs(run["plan_over_measured"] - 1.0), 0.10, run)

    def test_bert_flops_per_token_equals_meshtrons(self):
        # bert-large through the driver's own run, cut to one small layer on a
        # CPU rank: synthetic BERT batches with the WordPiece vocabulary's
        # size (no vocab file), padded to 30592 as the FLOPs formula says.
        shape, seq = (1, 64, 4), 32
        with mock.patch.dict(e2e_gpu.SHAPES, {"bert-large": shape}), \
                mock.patch.dict(e2e_gpu.SEQS, {"bert-large": seq}):
            small = {"run.device": "cpu", "training.precision": "fp32", "model.num_layers": shape[0],
                     "model.hidden_size": shape[1], "model.num_attention_heads": shape[2],
                     "model.seq_length": seq, "model.max_position_embeddings": seq}
            run = e2e_gpu.run_meshtron(MESHTRON, "bert-large", micro_batch=2, steps=2, warmup=1,
                                       extra=[a for k, v in small.items() for a in ("--set", f"{k}={v}")])
            self.assertIsNotNone(run, "meshtron's BERT run failed (its output is above)")
            want = e2e_gpu.flops_per_token("bert-large")
        self.assertEqual(e2e_gpu.padded_vocab("bert-large"), 30592)
        self.assertTrue(math.isfinite(run["loss"]) and run["ms_per_step"] > 0, run)
        self.assertAlmostEqual(run["flops_per_token"] / want, 1.0, places=6)

    def test_t5_flops_per_token_equals_meshtrons(self):
        # t5-base through the driver's own run, cut to one small encoder and
        # decoder layer on a CPU rank (synthetic T5 batches, t5's 32128 ids):
        # meshtron's F per encoder token equals the driver's T5 count.
        shape, seq, t5 = (1, 64, 4), 32, (1, 16, 128, 16, 32128)
        with mock.patch.dict(e2e_gpu.SHAPES, {"t5-base": shape}), \
                mock.patch.dict(e2e_gpu.SEQS, {"t5-base": seq}), \
                mock.patch.dict(e2e_gpu.T5, {"t5-base": t5}):
            small = {"run.device": "cpu", "training.precision": "fp32", "model.num_layers": shape[0],
                     "model.hidden_size": shape[1], "model.num_attention_heads": shape[2],
                     "model.decoder_num_layers": t5[0], "model.kv_channels": t5[1],
                     "model.ffn_hidden_size": t5[2], "model.seq_length": seq,
                     "model.decoder_seq_length": t5[3]}
            run = e2e_gpu.run_meshtron(MESHTRON, "t5-base", micro_batch=2, steps=2, warmup=1,
                                       extra=[a for k, v in small.items() for a in ("--set", f"{k}={v}")])
            self.assertIsNotNone(run, "meshtron's T5 run failed (its output is above)")
            want = e2e_gpu.flops_per_token("t5-base")
            # by hand: per sample 32 encoder tokens, 16 decoder tokens (i = 4 x 16 = 64)
            layer = lambda keys: 4 * 64 * 64 + 2 * 64 * 128 + 2 * keys * 64  # noqa: E731
            sample = 32 * layer(32) + 16 * (layer(16) + 2 * 64 * 64 + 2 * 32 * 64) + \
                32 * 2 * 64 * 64 + 16 * 64 * 32128
            self.assertAlmostEqual(want, 6 * sample / 32)
        self.assertEqual(e2e_gpu.padded_vocab("t5-base"), 32128)
        self.assertTrue(math.isfinite(run["loss"]) and run["ms_per_step"] > 0, run)
        self.assertAlmostEqual(run["flops_per_token"] / want, 1.0, places=6)

    def test_pipeline_layouts_train_the_one_rank_model(self):
        # pp2 (1F1B) and pp2i (interleaved, 2 chunks per stage) as the driver
        # runs them, on 2 CPU ranks: 4 layers (interleaved needs 2 x 2
        # chunks), 4 micro-batches per step. The pipeline splits the model,
        # not the arithmetic: the same loss as one rank, the same F.
        deck = "input_decks/gpt-tiny.deck"
        _, hidden, heads, seq = deck_model(deck)
        base = ["--set", "run.device=cpu", "--set", "training.precision=fp32",
                "--set", "model.num_layers=4"]
        with mock.patch.dict(e2e_gpu.DECKS, tiny=deck), \
                mock.patch.dict(e2e_gpu.SHAPES, tiny=(4, hidden, heads)):
            want = e2e_gpu.flops_per_token("tiny", seq=seq)
            one = e2e_gpu.run_meshtron(MESHTRON, "tiny", micro_batch=2, steps=2, warmup=1,
                                       extra=base, accumulate=4)
            self.assertIsNotNone(one, "meshtron's one-rank run failed (its output is above)")
            for label in ("pp2", "pp2i"):
                tp, dp, pp, sets = e2e_gpu.LAYOUTS[label]
                self.assertEqual((tp, dp, pp), (1, 1, 2), label)
                extra = base + [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]
                run = e2e_gpu.run_meshtron(MESHTRON, "tiny", micro_batch=2, steps=2, warmup=1,
                                           tp=tp, dp=dp, pp=pp, extra=extra, accumulate=4)
                self.assertIsNotNone(run, f"meshtron's {label} run failed (its output is above)")
                self.assertAlmostEqual(run["loss"], one["loss"], places=5, msg=label)
                self.assertAlmostEqual(run["flops_per_token"] / want, 1.0, places=6, msg=label)

    def test_speedup_arithmetic(self):
        # dp 2: twice the tokens per step in 1.04x the time of one GPU
        self.assertAlmostEqual(e2e_gpu.speedup(100.0, 8192, 104.0, 16384), 2 / 1.04)
        # pp 2: the same tokens per step in 0.55x the time
        self.assertAlmostEqual(e2e_gpu.speedup(800.0, 65536, 440.0, 65536), 800 / 440)

    def test_pipeline_bound(self):
        # 1F1B, pp 2: 8 / 16 micro-batches (perf/RESULTS.md, "Two GPUs: pipeline parallelism")
        self.assertAlmostEqual(e2e_gpu.pipeline_bound(2, 1, 8), 2 / (1 + 1 / 8))
        self.assertAlmostEqual(e2e_gpu.pipeline_bound(2, 1, 16), 32 / 17)
        # interleaving with 2 chunks per stage halves the bubble
        self.assertAlmostEqual(e2e_gpu.pipeline_bound(2, 2, 16), 64 / 33)
        self.assertAlmostEqual(e2e_gpu.pipeline_bound(4, 1, 4), 16 / 7)  # pp 4: bubble 3/4 of compute
        self.assertAlmostEqual(e2e_gpu.pipeline_bound(1, 1, 1), 1.0)  # no pipeline, no bubble

    def test_two_gpu_rows(self):
        # main() for dp2 + both pipeline layouts with a named split, the
        # trainer replaced by fixed timings: what each layout asks meshtron
        # for, and what its row reports.
        rows, calls = two_gpu_rows(
            ["--models", "774m", "--gpus", "2", "--layouts", "dp2", "pp2", "pp2i", "--accumulate", "16",
             "--no-torch", "--pp-split", "balanced"],
            lambda tp, dp, pp, accumulate: {1: 1400.0, 2: 750.0}[pp] if dp == 1 else 1450.0)
        self.assertEqual(set(rows), {"one", "dp2", "pp2", "pp2i"})
        self.assertAlmostEqual(rows["dp2"]["speedup_over_1_gpu"], round(2 * 1400 / 1450, 3))
        self.assertAlmostEqual(rows["dp2"]["scaling_efficiency"], round(1400 / 1450, 3))
        self.assertNotIn("bubble_bound", rows["dp2"])
        for label, v in (("pp2", 1), ("pp2i", 2)):
            self.assertEqual(rows[label]["variant"], "balanced", label)
            self.assertAlmostEqual(rows[label]["speedup_over_1_gpu"], round(1400 / 750, 3))
            self.assertAlmostEqual(rows[label]["scaling_efficiency"], round(1400 / 750 / 2, 3))
            self.assertAlmostEqual(rows[label]["bubble_bound"], round(e2e_gpu.pipeline_bound(2, v, 16), 3))
        pipelines = [c for c in calls if c[2] == 2]
        self.assertEqual(len(pipelines), 2)
        for tp, dp, pp, accumulate, sets in pipelines:
            self.assertEqual((tp, dp, accumulate), (1, 1, 16))
            self.assertEqual(sets["parallel.pipeline_layers"], "balanced")
        self.assertEqual(sorted(c[4]["parallel.schedule"] for c in pipelines), ["1f1b", "interleaved"])

    def test_default_two_gpu_layouts_include_the_interleaved_tp(self):
        # The default --gpus 2 run: dp2, tp2 (SP, as Megatron) and tp2i (no SP,
        # copy engines, tp_interleave), the last with the 2 micro-batches per
        # step the interleave needs, scaled by tokens against one GPU's 1.
        rows, calls = two_gpu_rows(
            ["--models", "124m", "--gpus", "2", "--no-torch"],
            lambda tp, dp, pp, accumulate: 100.0 if tp * dp == 1 else (59.0 if tp == 1 else 60.0 * accumulate))
        self.assertEqual(set(rows), {"one", "dp2", "tp2", "tp2i"})
        tp_calls = {c[4].get("parallel.tp_interleave", "false"): c for c in calls if c[0] == 2}
        plain, interleaved = tp_calls["false"], tp_calls["true"]
        self.assertEqual(plain[3], 1)
        self.assertEqual(plain[4].get("parallel.sequence_parallel"), None)  # run_meshtron's default: SP
        self.assertEqual(interleaved[3], 2)
        self.assertEqual({k: interleaved[4][k] for k in e2e_gpu.TP_INTERLEAVED}, e2e_gpu.TP_INTERLEAVED)
        self.assertEqual(rows["tp2i"]["micro_batches_per_step"], 2)
        self.assertAlmostEqual(rows["tp2"]["speedup_over_1_gpu"], round(100 / 60, 3))
        self.assertAlmostEqual(rows["tp2i"]["speedup_over_1_gpu"], round(2 * 100 / 120, 3))

    def test_dropout_reaches_both_frameworks(self):
        # --dropout sets meshtron's hidden and attention dropout (a --set may
        # still replace one) and PyTorch's pdrops.
        seen, torch_calls = [], []

        def fake_run(binary, name, micro_batch, steps, warmup, tp=1, dp=1, recompute="none",
                     extra=(), accumulate=1, pp=1):
            seen.append(dict(kv.split("=", 1) for kv in extra[1::2]))
            return {"ms_per_step": 100.0, "memory_mib": 1.0, "loss": 5.0, "flops_per_token": 1.0}

        fake_torch = mock.Mock()
        fake_torch.run = lambda *a, **kw: torch_calls.append(kw) or {"tokens_per_s_per_gpu": 1.0}
        argv = ["e2e_gpu.py", "--models", "124m", "--dropout", "0.1",
                "--set", "model.attention_dropout=0.05"]
        with mock.patch.object(e2e_gpu, "run_meshtron", fake_run), mock.patch.object(sys, "argv", argv), \
                mock.patch.dict(sys.modules, {"torch_baseline": fake_torch}), \
                contextlib.redirect_stdout(io.StringIO()):
            e2e_gpu.main()
        self.assertEqual(seen[0]["model.hidden_dropout"], "0.1")
        self.assertEqual(seen[0]["model.attention_dropout"], "0.05")  # the later --set wins
        self.assertEqual(torch_calls[0]["dropout"], 0.1)

    def test_report_arithmetic(self):
        row = e2e_gpu.report("1.5b", "x", 8, 1, 200.0, echo=False)
        tokens_per_s = 8 * e2e_gpu.SEQ / 0.2
        self.assertEqual(row["tokens_per_s_per_gpu"], round(tokens_per_s))
        self.assertAlmostEqual(row["mfu"], tokens_per_s * e2e_gpu.flops_per_token("1.5b") / 989e12, places=4)
        # GPT-2 1.5B: F = 1.0274e10, as meshtron logs it for the deck (perf/RESULTS.md, "GPT-2 1.5B on one GPU")
        self.assertAlmostEqual(e2e_gpu.flops_per_token("1.5b") / 1.0274e10, 1.0, places=4)

    def test_machine_line(self):
        line = e2e_gpu.machine()
        datetime.datetime.strptime(line["date"], "%Y-%m-%d %H:%M UTC")
        self.assertIsInstance(line["gpus"], list)  # empty where nvidia-smi is absent
        self.assertTrue(line["command"].startswith("python3 "), line)

    def test_compare_memory_on_recorded_h200_tables(self):
        # Two recorded `bench_cuda_ops memory` outputs of one H200: a base
        # table, and two runs of a changed tree appended to one log.
        here = os.path.dirname(os.path.abspath(__file__))
        base = compare_memory.tables(os.path.join(here, "memory_table_h200_base.txt"))
        runs = compare_memory.tables(os.path.join(here, "memory_table_h200_two_runs.txt"))
        self.assertEqual((len(base), len(runs)), (1, 2))
        rows, before, after = compare_memory.compare(base[0], runs)
        self.assertEqual((len(rows), before, after), (59, 35, 40))
        by_name = {row[0]: row for row in rows}
        self.assertEqual(by_name["softmax_forward bf16 [96, 1024, 1024]"], (
            "softmax_forward bf16 [96, 1024, 1024]", 0.63, 1.09, 1.09, True))
        name = "layernorm_backward bf16 [8192, 768]"
        self.assertEqual(by_name[name], (name, 0.59, 0.59, 0.59, False))
        self.assertIn("sum_of_squares (+sync) fp32 [124M]", by_name)

    def test_compare_memory_counts_a_row_by_its_lowest_run(self):
        base = {"a bf16 [1]": 0.79, "b fp32 [2]": 0.81}
        rows, before, after = compare_memory.compare(base, [{"a bf16 [1]": 0.85, "b fp32 [2]": 0.79},
                                                            {"a bf16 [1]": 0.80, "b fp32 [2]": 0.90}])
        self.assertEqual((before, after), (1, 1))  # a reaches 0.8 in both runs, b in one only
        self.assertEqual(rows[0], ("a bf16 [1]", 0.79, 0.80, 0.85, True))
        self.assertEqual(rows[1], ("b fp32 [2]", 0.81, 0.79, 0.90, True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshtron", required=True, help="the meshtron binary")
    args, rest = parser.parse_known_args()
    MESHTRON = os.path.abspath(args.meshtron)
    os.chdir(ROOT)  # the decks' relative paths
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
