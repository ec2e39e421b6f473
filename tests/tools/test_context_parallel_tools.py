"""Chapter 10's tools without a GPU: tools/cp_model.py's arithmetic (a ring pass, Ulysses' bytes and
its head rule) and its files from a made-up benchmark file, and tools/bench_context_parallel.py's
answers when it cannot run (bad flags, too few GPUs)."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import cp_model  # noqa: E402

BENCH = """# 2 x Test GPU (one machine), NCCL 2.28.3, 2026-01-01: build/bin/ch10_context_parallel --bench --ranks 2 \
--tokens-per-rank 1024 --batch 1 --heads 4 --heads-kv 2 --dim 64 --iters 5
run,ranks,split,transfer,tokens,fwd_ms,fwd_tflops,bwd_ms,bwd_tflops,fwd_over_one_rank,bwd_over_one_rank,hop_ms,hop_gbps
"1 rank",1,contiguous,1,1024,1.0,100.0,3.0,80.0,1.000,1.000,,
"2 ranks zigzag",2,zigzag,1,2048,2.2,190.0,6.5,150.0,1.900,1.880,0.010,100.0
"""


class RingModel(unittest.TestCase):
    def test_a_pass_is_one_step_plus_the_rest_at_the_slower_of_compute_and_hop(self):
        m = cp_model.Model(fwd_tflops=100.0, bwd_tflops=80.0, link_gbps=100.0, inter_gbps=10.0, batch=1, heads=4,
                           heads_kv=2, dim=64)
        n, t = 4, 1024
        step = cp_model.causal_flops(1, 4, n * t, 64) / n / n / 100e12
        hop = 2.0 * 2 * t * 64 * 2.0 / 100e9  # K and V of one rank, bf16, over 100 GB/s
        time, eff = m.ring(n, t)
        self.assertAlmostEqual(time, step + (n - 1) * max(step, hop), places=12)
        self.assertAlmostEqual(eff, step * n / time, places=9)

    def test_the_backward_carries_three_times_the_bytes_and_a_last_hop_home(self):
        m = cp_model.Model(100.0, 80.0, 1.0, 1.0, 1, 4, 2, 64)  # a slow link: every hop shows
        n, t = 2, 1024
        hop = 2.0 * 2 * t * 64 * 2.0 / 1e9
        step = 2.5 * cp_model.causal_flops(1, 4, n * t, 64) / n / n / 80e12
        time, _ = m.ring(n, t, backward=True)
        self.assertAlmostEqual(time, step + (n - 1) * max(step, 3 * hop) + 2 * hop, places=12)

    def test_beyond_one_machine_the_other_link_is_used(self):
        m = cp_model.Model(100.0, 80.0, 400.0, 10.0, 1, 4, 2, 64)
        self.assertEqual(m.bandwidth(8), 400e9)
        self.assertEqual(m.bandwidth(16), 10e9)

    def test_one_rank_is_its_compute(self):
        m = cp_model.Model(100.0, 80.0, 100.0, 10.0, 1, 4, 2, 64)
        time, eff = m.ring(1, 4096)
        self.assertAlmostEqual(time, cp_model.causal_flops(1, 4, 4096, 64) / 100e12, places=12)
        self.assertAlmostEqual(eff, 1.0)


class UlyssesModel(unittest.TestCase):
    def test_ranks_must_divide_both_head_counts(self):
        m = cp_model.Model(100.0, 80.0, 100.0, 10.0, 1, 8, 2, 64)
        self.assertEqual(m.ulysses(4, 1024), (None, None))  # heads_kv 2 is not a multiple of 4
        self.assertEqual(m.ulysses(16, 1024), (None, None))  # nor are 8 query heads
        self.assertIsNotNone(m.ulysses(2, 1024)[0])

    def test_the_backward_moves_twice_the_forward_bytes(self):
        m = cp_model.Model(1e12, 1e12, 1.0, 1.0, 1, 4, 2, 64)  # compute ~0: the time is the bytes
        fwd, _ = m.ulysses(2, 1024)
        bwd, _ = m.ulysses(2, 1024, backward=True)
        moved = 0.5 * 1024 * 64 * 2.0 * (2 * 4 + 2 * 2)
        self.assertAlmostEqual(fwd, moved / 1e9, places=6)
        self.assertAlmostEqual(bwd, 2 * moved / 1e9, places=6)


class ModelFiles(unittest.TestCase):
    def test_it_writes_its_predictions_and_the_check_against_the_measured_ranks(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "context_parallel.csv"), "w") as f:
                f.write(BENCH)
            out = os.path.join(tmp, "model.csv")
            done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cp_model.py"), "--results", tmp,
                                   "--out-csv", out, "--plot", os.path.join(tmp, "m.png")],
                                  capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(out) as f:
                first, check = f.readline(), f.readline()
                rows = list(csv.DictReader(f))
            self.assertTrue(first.startswith("# tools/cp_model.py") and "2 x Test GPU" in first, first)
            self.assertIn("2 ranks x 1024 tokens", check)
            self.assertIn("measured 2.20 ms", check)
            self.assertEqual({int(r["ranks"]) for r in rows}, {1, 2, 4, 8, 16, 32, 64})
            # 4 query heads over 2 K/V heads: Ulysses runs on 1 and 2 ranks only.
            self.assertEqual({r["ranks"] for r in rows if r["ulysses_fwd_eff"]}, {"1", "2"})

    def test_a_file_without_its_run_line_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "context_parallel.csv"), "w") as f:
                f.write(BENCH.split("\n", 1)[1])
            done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cp_model.py"), "--results", tmp],
                                  capture_output=True, text=True)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("must start with a '# ' line", done.stdout + done.stderr)


class BenchScript(unittest.TestCase):
    def run_bench(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_context_parallel.py"), *args],
                              capture_output=True, text=True)

    def test_bad_flags_are_refused_in_one_line(self):
        done = self.run_bench("--ranks", "0")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--ranks must be at least 1, got 0", done.stderr)

    def test_too_few_gpus_is_a_skip_with_the_reason(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if torch.cuda.device_count() >= 64:
            self.skipTest("this machine has 64 GPUs")
        done = self.run_bench("--ranks", "64")
        self.assertEqual(done.returncode, 77, done.stdout + done.stderr)
        self.assertIn("needs 64 GPUs", done.stdout)


if __name__ == "__main__":
    unittest.main()
