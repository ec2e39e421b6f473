#!/usr/bin/env bash
# The CUDA compiler launcher of the chapters' kernel files (CMakeLists.txt, FA_KERNEL_RESOURCES):
#   ptxas_report.sh DIR nvcc ARGS...
# runs the compile and keeps what ptxas -v says about each kernel (registers, spill stores and
# loads, stack frame, shared memory) in DIR/<object>.ptxas, beside the cubins and PTX that
# nvcc --keep leaves there; tools/kernel_resources.py reads them. Every other line of the
# compiler's stderr (warnings, errors) passes through.
dir=$1
shift
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
log="$dir/$(basename "${out:-unknown}").ptxas"
"$@" 2>"$log.part"
rc=$?
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$log.part" >&2
mv "$log.part" "$log"
exit $rc
