#!/usr/bin/env bash
# benchmarks/gpu_check.sh, checked on a machine without a GPU: the wheelhouse installs into a fresh
# venv with the network off, beside a torch that the project did not install. As root (unshare),
# with PyPI reachable for steps 1 and 2; a few minutes. Not a test of the suite: it needs the
# network and minutes.
#
#   bash benchmarks/gpu_check_local.sh          # TORCH=2.13.0 (this machine's CPU build)
#
# 1. A wheelhouse for this machine's python (gpu_wheelhouse.py --python-version X.Y), in a
#    temporary folder.
# 2. A fresh venv (no system site packages) that stands for the GPU machine's image: torch, and the
#    packages of the project's closure that the image holds (benchmarks/gpu_image_packages.txt:
#    numpy, pandas, pyarrow, matplotlib, pytest, ...), with setuptools and wheel; no Dask.
# 3. Network off (a new network namespace, loopback only): gpu_check.sh with PYTHON= that venv's
#    python. The install must pass, the gpu tests be collected and skip, bench_gpu say there is
#    no CUDA device and exit 0, and the check exit 0.
# 4. The gpu-marked tests that collecting all of tests/ finds here are those the check ran.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH:-2.13.0}
WORK=$(mktemp -d)
PYV=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
echo "## 1. wheelhouse for python $PYV in $WORK/wheelhouse"
python3 benchmarks/gpu_wheelhouse.py --python-version "$PYV" --out "$WORK/wheelhouse" \
  --present-requirements "$WORK/image.txt"

echo "## 2. a fresh venv for the machine's image: torch==$TORCH and $(wc -l <"$WORK/image.txt") packages"
python3 -m venv "$WORK/image"
"$WORK/image/bin/python" -m pip install -q "torch==$TORCH" "setuptools>=68" wheel -r "$WORK/image.txt"
if "$WORK/image/bin/python" -c 'import dask' 2>/dev/null; then
  echo "the image's venv holds dask: it would not test the wheelhouse" && exit 1
fi
"$WORK/image/bin/python" -c 'import sys, torch; print(sys.prefix, "holds torch", torch.__version__)'

echo "## 3. gpu_check.sh with the network off"
rc=0
PYTHON=$WORK/image/bin/python WHEELHOUSE=$WORK/wheelhouse OUT=$WORK/report \
  unshare --net bash -c 'ip link set lo up &&
    python3 -c "import socket; socket.create_connection((\"pypi.org\", 443), timeout=5)" 2>&1 |
    tail -n 1 | sed "s/^/network: /" && bash benchmarks/gpu_check.sh' || rc=$?
echo "gpu_check.sh exit status: $rc"
grep -q "no CUDA device" "$WORK/report/gpu-check.log" || { echo "bench_gpu did not say so"; rc=1; }

echo "## 4. the gpu-marked tests of all of tests/, as collected here"
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider -p no:benchmark -o addopts='' \
  tests | grep '::' >"$WORK/collected.txt" || true
python3 - "$WORK/report/junit.xml" "$WORK/collected.txt" <<'EOF' || rc=1
import sys
import xml.etree.ElementTree as ET

cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
ran = {}
for case in cases:
    test_id = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
    skipped = case.find("skipped")
    ran[test_id] = "skipped: " + skipped.get("message") if skipped is not None else "not skipped"
collected = set(open(sys.argv[2]).read().split())
for test_id in sorted(ran):
    print(f"  {test_id}: {ran[test_id]}")
print(f"{len(ran)} ran by the check, {len(collected)} gpu-marked in tests/:",
      "the same" if collected == set(ran) else f"differ: {sorted(collected ^ set(ran))}")
ok = collected == set(ran) and all(r.startswith("skipped") for r in ran.values()) and ran
sys.exit(0 if ok else 1)
EOF
rm -rf "$WORK/image" "$WORK/wheelhouse"  # the report stays
echo "report: $WORK/report; local check: $([ "$rc" -eq 0 ] && echo passed || echo FAILED)"
exit "$rc"
