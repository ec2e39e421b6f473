#!/usr/bin/env bash
# Tries the Gradescope autograder in an Ubuntu 22.04 root filesystem, the way Gradescope uses it:
# the zip of `make autograder` unpacked in ROOTFS/autograder/source, setup.sh run once as root,
# then run_autograder (copied to /autograder/run_autograder) for three submissions, each checked:
#   (a) the instructor's own tree: every CPU point;
#   (b) an untouched handout (classroom/handout.py): 0;
#   (c) a zip of the handout in which the files holding EXERCISE's regions (default
#       ch03_online_update) are the instructor's: full points for every exercise whose regions all
#       lie in those files, 0 for the others.
# GPU exercises must be listed as not graded (max_score 0): there is no GPU on Gradescope.
#
# Usage, as root on a machine that reaches archive.ubuntu.com:
#   bash classroom/gradescope/try_in_ubuntu.sh ROOTFS [EXERCISE]
# It changes ROOTFS (packages, apt sources, /autograder), so give it a copy of a clean one:
#   debootstrap --variant=minbase --include=python3 jammy /srv/jammy http://archive.ubuntu.com/ubuntu
#   cp -a /srv/jammy /tmp/jammy-test
#   bash classroom/gradescope/try_in_ubuntu.sh /tmp/jammy-test
# debootstrap's sources hold "main" only; Gradescope's image, like Docker's ubuntu:22.04, also has
# "universe" (where libeigen3-dev is) and the -updates and -security pockets, so those are written
# into ROOTFS's sources when "universe" is missing.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 ROOTFS [EXERCISE]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "try_in_ubuntu: run as root (it uses chroot and mount)" >&2; exit 2; }
rootfs=$(realpath "$1")
exercise=${2:-ch03_online_update}
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ "$rootfs" != / ] || { echo "try_in_ubuntu: ROOTFS must not be /" >&2; exit 2; }
grep -qs 'VERSION_ID="22.04"' "$rootfs/etc/os-release" ||
  { echo "try_in_ubuntu: $rootfs is not an Ubuntu 22.04 root filesystem (see its etc/os-release)" >&2; exit 2; }

work=$(mktemp -d)
cleanup() {
  if mountpoint -q "$rootfs/proc"; then umount "$rootfs/proc" || umount -l "$rootfs/proc"; fi
  rm -rf "$work"
}
trap cleanup EXIT
in_chroot() {  # a clean environment, as in a container
  chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    /bin/bash -c "$1"
}

if ! grep -qs universe "$rootfs/etc/apt/sources.list" "$rootfs"/etc/apt/sources.list.d/*.list; then
  echo "== apt sources: main restricted universe multiverse; jammy, jammy-updates, jammy-security (as in ubuntu:22.04)"
  for pocket in jammy jammy-updates jammy-security; do
    echo "deb http://archive.ubuntu.com/ubuntu $pocket main restricted universe multiverse"
  done >"$rootfs/etc/apt/sources.list"
fi

echo "== make autograder"
python3 "$repo/classroom/autograder.py" --out "$work/autograder.zip"
rm -rf "$rootfs/autograder"
mkdir -p "$rootfs/autograder/source"
python3 - "$work/autograder.zip" "$rootfs/autograder/source" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:  # unzip, keeping each file's mode
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        if info.external_attr >> 16 & 0o777:
            os.chmod(path, info.external_attr >> 16 & 0o777)
PY
cp -p "$rootfs/autograder/source/run_autograder" "$rootfs/autograder/run_autograder"  # Gradescope does this
# From here on the zip's copy of the tree is the instructor's: the handout, the solved files and
# the expected scores all come from it, whatever changes in this checkout meanwhile.
src=$rootfs/autograder/source
export PYTHONDONTWRITEBYTECODE=1
mount -t proc proc "$rootfs/proc"

echo "== setup.sh (in the chroot)"
start=$SECONDS
in_chroot "cd /autograder/source && bash ./setup.sh"
echo "setup.sh took $((SECONDS - start)) s"
echo "== versions in the chroot"
# shellcheck disable=SC2016  # expanded in the chroot
in_chroot 'grep PRETTY_NAME /etc/os-release; python3 --version; g++ --version | head -n1
  echo "Eigen $(awk "/#define EIGEN_(WORLD|MAJOR|MINOR)_VERSION/ {printf \"%s%s\", s, \$3; s = \".\"}" /usr/include/eigen3/Eigen/src/Core/util/Macros.h)"
  for t in cmake nvcc git make unzip; do command -v $t >/dev/null && echo "$t: present" || echo "$t: absent"; done'

echo "== the submissions"
python3 "$src/classroom/handout.py" "$work/handout" >/dev/null
mkdir -p "$work/solved"
cp -a "$work/handout" "$work/solved/handout"
solved_files=$(python3 - "$src" "$exercise" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "classroom"))
import handout
files = handout.exercise_files(sys.argv[1]).get(sys.argv[2])
if not files:
    sys.exit(f"try_in_ubuntu: no BEGIN SOLUTION {sys.argv[2]} region in the instructor's sources")
print("\n".join(files))
PY
)
for rel in $solved_files; do cp "$src/$rel" "$work/solved/handout/$rel"; done  # paths hold no spaces
(cd "$work/solved" && python3 -c 'import os, shutil; shutil.make_archive("handout", "zip", ".", "handout")')

grade() {  # NAME: grades $rootfs/autograder/submission as Gradescope would; results in $work/NAME.json
  echo "-- $1"
  rm -rf "$rootfs/autograder/results"
  start=$SECONDS
  in_chroot 'cd /autograder && ./run_autograder' 2>&1 | sed 's/^/   /'
  echo "   ($((SECONDS - start)) s)"
  cp "$rootfs/autograder/results/results.json" "$work/$1.json"
}
submission=$rootfs/autograder/submission
rm -rf "$submission" && mkdir -p "$submission"
cp -a "$src/." "$submission/"
grade instructor
rm -rf "$submission" && mkdir -p "$submission"
cp -a "$work/handout/." "$submission/"
grade handout
rm -rf "$submission" && mkdir -p "$submission"
cp "$work/solved/handout.zip" "$submission/"
echo "(c) is handout.zip with the instructor's ${solved_files//$'\n'/, }"
grade solved

echo "== scores"
# shellcheck disable=SC2086  # one argument per file
python3 - "$src" "$work" "$exercise" $solved_files <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "classroom"))
import handout
src, work, exercise, solved = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4:])
exercises = handout.load_config(os.path.join(src, "classroom", "exercises.json"))
files = handout.exercise_files(src)
cpu = {ex["id"]: ex["points"] for ex in exercises if ex["device"] == "cpu"}
partly = sorted(i for i in cpu if solved & set(files[i]) and not set(files[i]) <= solved)
if partly:
    sys.exit(f"try_in_ubuntu: {', '.join(partly)} have regions both in and outside {', '.join(sorted(solved))}; pick another EXERCISE")
done = {i for i in cpu if set(files[i]) <= solved}
expected = {
    "instructor": ("(a) the instructor's tree", set(cpu)),
    "handout": ("(b) the untouched handout", set()),
    "solved": (f"(c) handout.zip with the files of {exercise} solved ({', '.join(sorted(done))})", done),
}
failed = 0
for name, (what, full) in expected.items():
    results = json.load(open(os.path.join(work, name + ".json")))
    scores = {t["name"].split(":")[0]: t for t in results["tests"]}
    bad = []
    for ex in exercises:
        t = scores.get(ex["id"])
        if t is None:
            bad.append(f"{ex['id']} missing from results.json")
        elif ex["device"] == "gpu":
            if t["max_score"] != 0 or not t["output"].startswith("NOT GRADED HERE"):
                bad.append(f"{ex['id']} (GPU) is graded: {t['score']} / {t['max_score']}")
        else:
            want = cpu[ex["id"]] if ex["id"] in full else 0
            if t["score"] != want or t["max_score"] != cpu[ex["id"]]:
                bad.append(f"{ex['id']}: {t['score']} / {t['max_score']}, expected {want} / {cpu[ex['id']]}")
    want_total = sum(cpu[i] for i in full)
    if results["score"] != want_total:
        bad.append(f"total {results['score']}, expected {want_total}")
    print(f"{'ok  ' if not bad else 'FAIL'} {what}: {results['score']:g} of {sum(cpu.values()):g} CPU points "
          f"(expected {want_total:g}); {results['output']}")
    for b in bad:
        print("       " + b)
    failed += bool(bad)
sys.exit(1 if failed else 0)
PY
echo "try_in_ubuntu: all three submissions scored as expected"
