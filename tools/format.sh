#!/usr/bin/env bash
# Formats the tracked C++/CUDA sources (*.cu, *.cuh, *.h, *.cpp) with clang-format and the
# repository's .clang-format.
#
#   bash tools/format.sh          format them in place (only the files that change), then
#                                 rewrite the docs' code blocks that show source regions
#                                 (tools/check_snippets.py --fix), so the docs follow
#   bash tools/format.sh --check  change nothing: name each file that is not formatted, with
#                                 the number of lines that would change and, for the first few,
#                                 the diff; exit 1 if any, 0 if none (CI runs this)
#
# The settings are tuned for Debian's clang-format 14 (`bash tools/setup.sh --format` installs
# it); other versions format a few constructs differently. CLANG_FORMAT=path picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "format.sh: unknown argument '$1' (use --check, or nothing to format in place)" >&2; exit 2 ;;
esac

cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "format.sh: $cf not found; install Debian's clang-format (apt-get install clang-format, or bash tools/setup.sh --format)" >&2
  exit 2
fi
[ -f .clang-format ] || { echo "format.sh: no .clang-format at the repository root" >&2; exit 2; }
version=$("$cf" --version | grep -o 'version [0-9]*' | head -n1 | cut -d' ' -f2)
if [ "${version:-}" != 14 ]; then
  echo "format.sh: note: $cf is version ${version:-unknown}; CI checks with clang-format 14, which may differ" >&2
fi

mapfile -d '' files < <(git ls-files -z -- '*.cu' '*.cuh' '*.h' '*.cpp')
if [ ${#files[@]} -eq 0 ]; then
  echo "format.sh: no tracked C++/CUDA sources (not a git checkout?)" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
changed=()
for f in "${files[@]}"; do
  "$cf" --style=file "$f" > "$tmp/out"
  cmp -s "$f" "$tmp/out" || changed+=("$f")
done

if [ "$check" = 1 ]; then
  if [ ${#changed[@]} -eq 0 ]; then
    echo "format: all ${#files[@]} C++/CUDA sources are formatted"
    exit 0
  fi
  shown=0
  for f in "${changed[@]}"; do
    "$cf" --style=file "$f" > "$tmp/out"
    diff -u --label "$f" --label "$f (formatted)" "$f" "$tmp/out" > "$tmp/diff" || true
    lines=$(tail -n +3 "$tmp/diff" | grep -c '^[-+]' || true)
    echo "not formatted: $f ($lines lines differ)"
    if [ "$shown" -lt 3 ]; then  # a short diff for the first few files
      tail -n +3 "$tmp/diff" | head -n 20 | sed 's/^/    /'
      shown=$((shown + 1))
    fi
  done
  echo "format: ${#changed[@]} of ${#files[@]} C++/CUDA sources are not formatted; fix with: make format (bash tools/format.sh)"
  exit 1
fi

if [ ${#changed[@]} -gt 0 ]; then
  "$cf" --style=file -i "${changed[@]}"
fi
echo "format: ${#changed[@]} of ${#files[@]} C++/CUDA sources reformatted"
# The docs show source regions verbatim; bring them up to date (77: a handout tree, skipped).
python3 tools/check_snippets.py --fix || [ $? -eq 77 ]
