nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
cmake -S . -B /tmp/b -DFA_CUDA_ARCHITECTURES=90 -DFA_WERROR=ON >/dev/null && cmake --build /tmp/b -j 16 2>&1 | grep -E "error|warning" -A3 | head -20
mkdir -p $OUT
(cd /tmp/b && ctest -j 4 2>&1 | grep -E "tests passed|Total Test|\*\*\*Failed|Label|^cpu|^gpu" | head -20)
/tmp/b/bin/fa_bench --features --dims 128 --csv $OUT/fa_features.csv 2>&1 | tail -2
cd tools && python3 bench_flex.py --csv $OUT/flex_features.csv 2>&1 | grep -E "TFLOP|skipped" | wc -l
