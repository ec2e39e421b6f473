#!/usr/bin/env bash
# expect_error.sh PATTERN COMMAND...: passes when COMMAND exits non-zero (and not by a signal)
# and prints exactly one line on stderr, which matches the extended regex PATTERN.
pattern=$1
shift
stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
"$@" >/dev/null 2>"$stderr_file"
status=$?
lines=$(wc -l <"$stderr_file")
message=$(cat "$stderr_file")
if [ "$status" -eq 0 ]; then echo "expected a non-zero exit, got 0; stderr: $message"; exit 1; fi
if [ "$status" -ge 128 ]; then echo "crashed with status $status; stderr: $message"; exit 1; fi
if [ "$lines" -ne 1 ]; then echo "expected one line on stderr, got $lines:"; cat "$stderr_file"; exit 1; fi
if ! grep -Eq -- "$pattern" "$stderr_file"; then echo "stderr does not match '$pattern': $message"; exit 1; fi
echo "exit $status: $message"
