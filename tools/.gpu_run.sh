set -u
bash .deps/install.sh >/dev/null 2>&1 || true
cmake -S . -B build -DFA_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build -j16 --target fa_gpu_tests fa_bench ch06_flash_attention_v3 2>&1 | grep -E "error|warning" ; echo build rc=$?
cuobjdump --dump-sass build/chapters/CMakeFiles/fa_ch06_sm90a.dir/06_flash_attention_v3/flash_attention_v3_wgmma_sm90a.cu.o 2>/dev/null | grep -o "HGMMA[^ ]*\|UTMALDG[^ ]*" | sort | uniq -c | head
find build -name "*wgmma_sm90a*.o" | head -2
timeout 120 build/bin/fa_gpu_tests --gtest_filter='*ch06*' 2>&1 | grep -E "OK|FAILED|rel|first|Expected|mismatch|error" | head -40
timeout 60 build/bin/ch06_flash_attention_v3 2>&1 | tail -6
timeout 60 build/bin/ch06_flash_attention_v3 --dim 64 --heads 32 --causal 2>&1 | tail -4
timeout 200 build/bin/fa_bench --sweep standard --kernels ch05_tuned_bf16,ch06_wgmma_bf16 --csv $OUT/b.csv 2>&1 | tail -50
