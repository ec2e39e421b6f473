"""Chapter 09's comparison table from made-up benchmark files (no GPU): tools/features_report.py
on fa_bench --features --backward's CSV (its features column, fp16 rows left out, the best bf16
kernel per point, the Ampere column) and tools/bench_flex.py --pass backward's, and with --plain
the chapter 07 kernel the features extend at the same shape."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "..", "tools", "features_report.py")

HEADER = ("chapter,kernel,variant,dtype,batch,heads_q,heads_kv,seq_q,seq_kv,head_dim,causal,status,check,time_ms,tflops,"
          "dq_rel,dk_rel,dv_rel,note,device_mib,features\n")
OURS = HEADER + "\n".join([
    '9,ch09_ampere_backward_fp16,ampere,fp16,4,16,16,4096,4096,128,1,ok,written+finite,2.0,900.0,,,,"x",1,"window 1023,0"',
    '9,ch09_ampere_backward_bf16,ampere,bf16,4,16,16,4096,4096,128,1,ok,written+finite,4.0,100.0,,,,"x",1,"window 1023,0"',
    '9,ch09_hopper_backward_bf16,hopper,bf16,4,16,16,4096,4096,128,1,ok,written+finite,1.0,400.0,,,,"x",1,"window 1023,0"',
    '9,ch09_hopper_backward_bf16,hopper,bf16,1,16,16,16384,16384,128,1,ok,written+finite,1.0,300.0,,,,"x",1,"varlen 4"',
]) + "\n"
FLEX = "\n".join([
    "feature,backend,batch,heads,seq,head_dim,status,time_ms,tflops,grad_rel_err_vs_fp64",
    "window 1024,flex,4,16,4096,128,ok,2.0,200.0,0.004",
    "packed,flex,4,16,4096,128,ok,2.0,150.0,0.004",
]) + "\n"


class BackwardTable(unittest.TestCase):
    def test_rows_compare_the_best_bf16_kernel_with_flex(self):
        with tempfile.TemporaryDirectory() as tmp:
            ours, flex, out = (os.path.join(tmp, n) for n in ("ours.csv", "flex.csv", "out.csv"))
            open(ours, "w").write(OURS)
            open(flex, "w").write(FLEX)
            ran = subprocess.run([sys.executable, REPORT, ours, flex, "--out", out, "--line", "Test GPU, 2026-01-01: x"],
                                 capture_output=True, text=True)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            lines = open(out).read().splitlines()
            self.assertEqual(lines[0], "# Test GPU, 2026-01-01: x")
            rows = {r["feature"]: r for r in csv.DictReader(lines[1:])}
            window = rows["window 1024"]
            self.assertEqual(window["kernel"], "ch09_hopper_backward_bf16")  # not the faster fp16 row
            self.assertEqual(window["over_flex"], "2.00")
            self.assertEqual(window["ampere_tflops"], "100.0")
            packed = rows["packed"]
            self.assertEqual((packed["seq"], packed["batch"]), ("4096", "4"))
            self.assertEqual(packed["over_flex"], "2.00")

    def test_plain_column_is_the_chapter_07_best_at_the_same_shape(self):
        # The standard sweep's rows: two chapter 07 kernels at 4k causal (the faster counts), a
        # faster chapter 05 row (not chapter 07's: left out), and no 4k non-causal point.
        plain_rows = HEADER + "\n".join([
            '7,ch07_fused_bf16,fused,bf16,4,16,16,4096,4096,128,1,ok,written+finite,1.0,350.0,,,,"",1,""',
            '7,ch07_fused_bulk_bf16,fused_bulk,bf16,4,16,16,4096,4096,128,1,ok,written+finite,1.0,500.0,,,,"",1,""',
            '5,ch05_other_bf16,x,bf16,4,16,16,4096,4096,128,1,ok,written+finite,1.0,900.0,,,,"",1,""',
        ]) + "\n"
        with tempfile.TemporaryDirectory() as tmp:
            ours, flex, plain, out = (os.path.join(tmp, n) for n in ("ours.csv", "flex.csv", "plain.csv", "out.csv"))
            open(ours, "w").write(OURS)
            open(flex, "w").write(FLEX)
            open(plain, "w").write(plain_rows)
            ran = subprocess.run([sys.executable, REPORT, ours, flex, "--out", out, "--line", "Test GPU, 2026-01-01: x",
                                  "--plain", plain], capture_output=True, text=True)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            rows = {r["feature"]: r for r in csv.DictReader(open(out).read().splitlines()[1:])}
            window = rows["window 1024"]
            self.assertEqual((window["plain_kernel"], window["plain_tflops"]), ("ch07_fused_bulk_bf16", "500.0"))
            self.assertEqual(window["over_plain"], "0.80")
            packed = rows["packed"]  # 4 sequences of 4096: the 4 x 4096 causal point
            self.assertEqual((packed["plain_tflops"], packed["over_plain"]), ("500.0", "0.60"))


if __name__ == "__main__":
    unittest.main()
