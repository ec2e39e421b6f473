"""libfa_kernels.so through ctypes, without torch: the listing, the checks and the errors.
Runs on any machine (unittest, so no pytest is needed either)."""
import os
import subprocess
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attention_kernels as ak  # noqa: E402
from attention_kernels import _library  # noqa: E402


class Listing(unittest.TestCase):
    def setUp(self):
        self.lib = ak.load()

    def test_loads_the_library_next_to_the_package(self):
        self.assertEqual(self.lib.path.parent, Path(ak.__file__).resolve().parent)

    def test_names_match_fa_bench_list(self):
        bench = os.environ.get("FA_BENCH")
        if not bench:
            self.skipTest("FA_BENCH (the fa_bench program) is not set")
        listed = subprocess.run([bench, "--list"], capture_output=True, text=True, check=True).stdout.split("\n")
        expected = [(line.split()[1], line.split()[2]) for line in listed if line.strip()]
        ours = [(k.name, k.dtype) for k in ak.list_kernels()]
        self.assertEqual(ours, expected)

    def test_kinds_and_known_entries(self):
        kinds = {k.name: k.kind for k in ak.list_kernels()}
        self.assertEqual(kinds["ch06_pingpong_bf16"], "forward")
        self.assertEqual(kinds["ch07_wgmma_bf16"], "backward")
        self.assertEqual(kinds["ch08_split_kv_fp16"], "decode")
        self.assertEqual(len(ak.list_kernels("decode")), 4)

    def test_head_dims(self):
        found = {k.name: k for k in ak.list_kernels()}
        self.assertEqual(found["ch05_tuned_bf16"].head_dims, (64, 96, 128, 256))
        self.assertEqual(found["ch05_mma_bf16"].head_dims, (64, 128))
        self.assertEqual(found["ch07_fp32"].head_dims, (32, 64, 128))
        self.assertIn(48, found["ch01_naive"].head_dims)

    def test_tolerances(self):
        found = {k.name: k for k in ak.list_kernels()}
        self.assertTrue(found["ch06_fp8"].coarse_arithmetic)
        self.assertFalse(found["ch06_pingpong_bf16"].coarse_arithmetic)
        self.assertGreater(found["ch06_fp8"].tolerance[0], found["ch06_pingpong_bf16"].tolerance[0])
        self.assertIsNone(found["ch07_fp32"].tolerance)

    def test_deterministic_flags(self):
        found = {k.name: k for k in ak.list_kernels("backward")}
        self.assertTrue(found["ch07_deterministic_bf16"].deterministic)
        self.assertFalse(found["ch07_mma_bf16"].deterministic)

    def test_bad_kind(self):
        with self.assertRaisesRegex(ValueError, "kind must be one of None, 'forward', 'backward', 'decode'; got 'sideways'"):
            ak.list_kernels("sideways")


class Checks(unittest.TestCase):
    def setUp(self):
        self.lib = ak.load()

    def test_workspace_bytes(self):
        # ch07_fp32 keeps D = rowsum(dO * O): one float per query row.
        self.assertEqual(self.lib.check(_library.BACKWARD, "ch07_fp32", self.lib.shape(2, 3, 3, 5, 4, 64)), 2 * 3 * 5 * 4)
        self.assertEqual(self.lib.check(_library.FORWARD, "ch05_tuned_bf16", self.lib.shape(1, 2, 2, 64, 64, 64)), 0)

    def test_unknown_kernel(self):
        with self.assertRaisesRegex(ak.UnknownKernelError, r"unknown forward kernel 'nope'; registered: ch01_naive, "):
            self.lib.check(_library.FORWARD, "nope", self.lib.shape(1, 1, 1, 4, 4, 64))
        with self.assertRaisesRegex(ak.UnknownKernelError, r"unknown decode kernel 'ch05_tuned_bf16'"):
            self.lib.find(_library.DECODE, "ch05_tuned_bf16")

    def test_unsupported_head_dim(self):
        with self.assertRaisesRegex(ak.UnsupportedError,
                                    "ch05_tuned_bf16 does not take .* d80: head_dim must be 64, 96, 128 or 256, got 80"):
            self.lib.check(_library.FORWARD, "ch05_tuned_bf16", self.lib.shape(1, 1, 1, 4, 4, 80))

    def test_invalid_shapes(self):
        cases = [
            (self.lib.shape(1, 6, 4, 4, 4, 64), r"heads_q \(6\) must be a multiple of heads_kv \(4\)"),
            (self.lib.shape(0, 1, 1, 4, 4, 64), "batch must be between 1 and 65536, got 0"),
            (self.lib.shape(1, 1, 1, 4, 4, 64, scale=-1.0), "scale must be a finite number > 0"),
        ]
        for shape, message in cases:
            with self.assertRaisesRegex(ak.InvalidArgumentError, message):
                self.lib.check(_library.FORWARD, "ch01_naive", shape)
        shape = self.lib.shape(1, 1, 1, 4, 4, 64)
        shape.causal = 2
        with self.assertRaisesRegex(ak.InvalidArgumentError, "causal must be 0 or 1, got 2"):
            self.lib.check(_library.FORWARD, "ch01_naive", shape)

    def test_invalid_decode_shape(self):
        shape = self.lib.decode_shape(num_seqs=1, heads_q=4, heads_kv=2, head_dim=64, query_len=1, block_size=12,
                                      num_blocks=4, max_blocks_per_seq=4, max_context=10)
        with self.assertRaisesRegex(ak.InvalidArgumentError, "block_size must be a power of two from 1 to 1024, got 12"):
            self.lib.check(_library.DECODE, "ch08_split_kv_bf16", shape)

    def test_launch_errors(self):
        shape = self.lib.shape(1, 1, 1, 4, 4, 64)
        base = 1 << 20  # never dereferenced: every call below is refused before a launch
        # The pointers are checked before the GPU is: null, then 16-byte alignment for tensors and
        # 4 for LSE and the int arrays.
        with self.assertRaisesRegex(ak.InvalidArgumentError, "^q is a null pointer$"):
            self.lib.forward("ch01_naive", shape, 0, 0, 0, 0, 0, 0, 0, None)
        with self.assertRaisesRegex(ak.InvalidArgumentError,
                                    "^k must be 16-byte aligned, got an address 8 bytes past a 16-byte boundary$"):
            self.lib.forward("ch01_naive", shape, base, base + 8, base, base, base, 0, 0, None)
        with self.assertRaisesRegex(ak.InvalidArgumentError,
                                    "^dv must be 16-byte aligned, got an address 2 bytes past a 16-byte boundary$"):
            self.lib.backward("ch07_fp32", shape, *([base] * 8), base + 2, 0, 0, None)
        with self.assertRaisesRegex(ak.InvalidArgumentError,
                                    "^lse must be 4-byte aligned, got an address 2 bytes past a 4-byte boundary$"):
            self.lib.forward("ch01_naive", shape, base, base, base, base, base + 2, 0, 0, None)
        # An LSE 4 bytes past a 16-byte boundary is allowed: the refusal comes from further on.
        gpu = not ak.list_kernels("forward")[0].unavailable.startswith("no GPU")
        if gpu:
            with self.assertRaisesRegex(ak.InvalidArgumentError, "workspace_bytes is 0, the kernel needs at least 16"):
                self.lib.backward("ch07_fp32", shape, *([base] * 5), base + 4, *([base] * 3), 0, 0, None)
            with self.assertRaisesRegex(ak.InvalidArgumentError,
                                        "^workspace must be 16-byte aligned, got an address 4 bytes past"):
                self.lib.backward("ch07_fp32", shape, *([base] * 9), base + 4, 64, None)
        else:
            with self.assertRaisesRegex(ak.NoGpuError, "^no GPU: "):
                self.lib.backward("ch07_fp32", shape, *([base] * 5), base + 4, *([base] * 3), 0, 0, None)

    def test_features(self):
        shape = self.lib.shape(1, 4, 2, 64, 64, 64, causal=True)
        window = self.lib.features(window=(16, 0))
        with self.assertRaisesRegex(ak.UnsupportedError, "^ch05_tuned_bf16 does not take .* window 16,0: takes no sliding window"):
            self.lib.check(_library.FORWARD, "ch05_tuned_bf16", shape, window)
        with self.assertRaisesRegex(ak.UnsupportedError, "^ch07_wgmma_bf16 does not take .* softcap 30: takes no softcap"):
            self.lib.check(_library.BACKWARD, "ch07_wgmma_bf16", shape, self.lib.features(softcap=30.0))
        # Every feature off is the plain check.
        self.assertEqual(self.lib.check(_library.FORWARD, "ch01_naive", shape, self.lib.features()),
                         self.lib.check(_library.FORWARD, "ch01_naive", shape))
        cases = [
            (self.lib.features(window=(-2, 0)), "window_left must be -1 .* got -2"),
            (self.lib.features(softcap=-1.0), "softcap must be a finite number > 0 .* got -1"),
            (self.lib.features(sequences=2), "needs cu_seqlens_q and cu_seqlens_k; one is a null pointer"),
            (self.lib.features(sequences=2, cu_seqlens_q=1 << 20, cu_seqlens_k=1 << 20, max_seqlen_q=65,
                               max_seqlen_k=8), r"max_seqlen_q must be between 1 and 64 \(the packed total\), got 65"),
        ]
        for features, message in cases:
            with self.assertRaisesRegex(ak.InvalidArgumentError, message):
                self.lib.check(_library.FORWARD, "ch09_ampere_bf16", shape, features)
        bad = self.lib.features()
        bad.alibi = 2
        with self.assertRaisesRegex(ak.InvalidArgumentError, "^alibi must be 0 or 1, got 2$"):
            self.lib.check(_library.FORWARD, "ch09_ampere_bf16", shape, bad)
        base = 1 << 20
        packed = self.lib.features(sequences=2, cu_seqlens_q=base + 2, cu_seqlens_k=base, max_seqlen_q=32,
                                   max_seqlen_k=32)
        with self.assertRaisesRegex(ak.InvalidArgumentError,
                                    "^cu_seqlens_q must be 4-byte aligned, got an address 2 bytes past"):
            self.lib.forward("ch09_ampere_bf16", self.lib.shape(1, 4, 2, 64, 64, 64), base, base, base, base, base, 0,
                             0, None, packed)

    def test_error_text_is_per_call(self):
        with self.assertRaises(ak.UnknownKernelError):
            self.lib.find(_library.FORWARD, "nope")
        self.lib.find(_library.FORWARD, "ch01_naive")
        self.assertEqual(self.lib._lib.fa_last_error(), b"")


class Exports(unittest.TestCase):
    def test_only_the_c_interface_is_exported(self):
        try:
            out = subprocess.run(["nm", "-D", "--defined-only", str(ak.load().path)], capture_output=True, text=True,
                                 check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            self.skipTest(f"nm did not run: {e}")
        names = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
        self.assertIn("fa_forward", names)
        self.assertEqual({n for n in names if not n.startswith("fa_")}, set())


class Install(unittest.TestCase):
    """`pip install build/python` (setup.py's first route): a platform wheel with the library inside,
    importable from another folder with nothing but the installed files on the path. When the
    package under test is itself installed (`pip install ./python`), the installed copy is checked
    instead: pip's record of it lists the library, and an import from another folder loads it."""

    def test_installed_copy_holds_the_library_and_imports_anywhere(self):
        import importlib.metadata
        import tempfile

        package = Path(ak.__file__).resolve().parent
        if (package.parent / "pyproject.toml").is_file():
            self.skipTest(f"the package under test is the one in {package.parent}, not an installed copy")
        files = importlib.metadata.files("attention-kernels") or []
        self.assertIn("attention_kernels/libfa_kernels.so", [f.as_posix() for f in files])
        self.assertTrue((package / "libfa_kernels.so").is_file())
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FA_KERNELS_LIBRARY", "FA_BUILD_DIR")}
        probe = ("import attention_kernels as ak; lib = ak.load(); "
                 "print(ak.__file__, lib.path.parent == __import__('pathlib').Path(ak.__file__).resolve().parent, "
                 "len(ak.list_kernels()))")
        with tempfile.TemporaryDirectory() as tmp:
            ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp, env=env, capture_output=True, text=True)
        self.assertEqual(ran.returncode, 0, ran.stderr)
        where, same_folder, count = ran.stdout.split()
        self.assertEqual(Path(where).resolve().parent, package)
        self.assertEqual(same_folder, "True")
        self.assertEqual(int(count), len(ak.list_kernels()))

    def test_wheel_holds_the_library_and_imports_anywhere(self):
        import importlib.util
        import tempfile
        import zipfile

        if not (Path(ak.__file__).resolve().parent.parent / "pyproject.toml").is_file():
            self.skipTest("the package under test is an installed copy (checked by the test above), not a folder to build")
        if importlib.util.find_spec("pip") is None or importlib.util.find_spec("setuptools") is None:
            self.skipTest("pip or setuptools is not importable here")
        # Offline (--no-build-isolation), the wheel command comes from setuptools >= 70.1 or `wheel`.
        probe_wheel = "try:\n import setuptools.command.bdist_wheel\nexcept ImportError:\n import wheel"
        if subprocess.run([sys.executable, "-c", probe_wheel], capture_output=True).returncode != 0:
            self.skipTest("no bdist_wheel here (setuptools < 70.1 and no `wheel` package): pip cannot build a wheel offline")
        package = Path(ak.__file__).resolve().parent
        with tempfile.TemporaryDirectory() as tmp:
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                    "--wheel-dir", tmp, str(package.parent)], capture_output=True, text=True)
            self.assertEqual(built.returncode, 0, built.stdout + built.stderr)
            wheels = list(Path(tmp).glob("attention_kernels-*.whl"))
            self.assertEqual(len(wheels), 1, wheels)
            tag = wheels[0].name.split("-")[-1]
            self.assertNotEqual(tag, "any.whl", "the wheel holds a shared library: it must carry a platform tag")
            with zipfile.ZipFile(wheels[0]) as wheel:
                inside = wheel.read("attention_kernels/libfa_kernels.so")
                wheel.extractall(Path(tmp) / "site")
            self.assertEqual(inside, (package / "libfa_kernels.so").read_bytes())
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FA_KERNELS_LIBRARY", "FA_BUILD_DIR")}
            env["PYTHONPATH"] = str(Path(tmp) / "site")
            probe = ("import attention_kernels as ak; lib = ak.load(); "
                     "print(lib.path.parent == __import__('pathlib').Path(ak.__file__).resolve().parent, "
                     "len(ak.list_kernels()))")
            ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp, env=env, capture_output=True, text=True)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            same_folder, count = ran.stdout.split()
            self.assertEqual(same_folder, "True")
            self.assertEqual(int(count), len(ak.list_kernels()))


if __name__ == "__main__":
    unittest.main()
