#!/usr/bin/env bash
# The GPU checks in one call, on a machine that reaches no package registry: install the project
# from a carried wheelhouse beside the machine's own torch, run the `gpu`-marked tests and
# benchmarks/bench_gpu.py, and write a report.
#
#   bash benchmarks/gpu_check.sh       # from the repo root, .wheelhouse/ and data/fashion-mnist/
#                                      # carried (python benchmarks/gpu_wheelhouse.py --data)
#
# Settings (environment): PYTHON, the machine's python whose packages (torch, numpy, pandas, ...)
# are used (default python3); WHEELHOUSE (default .wheelhouse); OUT, the report's folder (default
# gpu-report); GPU_CHECK_BUDGET, seconds for all the steps together (default 480).
#
# Steps, each under `timeout` within the budget, each reported even after an earlier one failed:
#   install   a venv over PYTHON's packages; the project installed in it, editable, from the
#             wheelhouse alone (pip --no-index, no pip configuration file, no PIP_* variable)
#   versions  python, torch, CUDA, the GPUs, NCCL, dask...: each with the folder it comes from
#   data      Fashion-MNIST found (every test session needs it)
#   tests     the gpu-marked tests (pytest -m gpu -rA)
#   bench     bench_gpu.py, ResNet-18 for 50 steps (and NCCL allreduce with two GPUs or more)
# Report in $OUT: gpu-check.log (every step's output), summary.md (versions, each step's result,
# each test's, bench_gpu's output), junit.xml. Exit status: 0 when every step passed, else 1.
set -u
cd "$(dirname "$0")/.." || exit 1

PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-.wheelhouse}
REPORT=${OUT:-gpu-report}
BUDGET=${GPU_CHECK_BUDGET:-480}
WORK=$(mktemp -d)
VENV=$WORK/venv
LOG=$REPORT/gpu-check.log
SUMMARY=$REPORT/summary.md
mkdir -p "$REPORT"
: >"$LOG"

# pip sees only the wheelhouse: no configuration file (it may name an index or a constraint), no
# PIP_* variable; --no-index below. What the machine's python holds is installed already.
for var in $(compgen -e); do
  case $var in PIP_*) unset "$var" ;; esac
done
export PIP_CONFIG_FILE=/dev/null PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHON WHEELHOUSE REPORT VENV
# The gpu-marked tests' files. Collecting all of tests/ would import every test module, and some
# need packages that the machine lacks (nbformat, ...); a gpu test is marked in its own file
# (@pytest.mark.gpu, pytestmark = pytest.mark.gpu), which this finds.
GPU_TESTS=$(grep -l 'mark\.gpu' tests/test_*.py | tr '\n' ' ')
export GPU_TESTS

# Why not `python -m venv --system-site-packages`: where PYTHON is itself a venv (the GPU
# machine's is /opt/torch/.venv), that flag shows the venv's base interpreter's packages, not
# PYTHON's. A .pth file adds PYTHON's own site folders after the venv's, so what the wheelhouse
# installs comes first and torch comes from PYTHON; pip too (the venv has none of its own).
step_install() {
  "$PYTHON" -m venv --without-pip "$VENV" || return 1
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  "$PYTHON" - "$site/_gpu_check_base.pth" <<'EOF' || return 1
import site, sys
lines = [f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()]
open(sys.argv[1], "w").write("".join(lines))
print("the venv sees", sys.executable + "'s", *site.getsitepackages())
EOF
  # PYTHON's pip, else the one its python bundles (ensurepip: no download)
  "$VENV/bin/python" -m pip --version || "$VENV/bin/python" -m ensurepip --default-pip || return 1
  echo "wheelhouse $WHEELHOUSE:" && ls "$WHEELHOUSE"
  "$VENV/bin/python" -m pip install --no-index --find-links "$WHEELHOUSE" --no-build-isolation \
    -e . || return 1
  # every installed package's requirements, the image's too: said, not failed on (a large image
  # may hold a conflict of its own that the project does not touch)
  "$VENV/bin/python" -m pip check || true
}

# Only when `install` failed (an image package older than a wheel's requirement, say): every
# wheel and the project without dependency checks, so that the tests still run; pip check lists
# what does not fit. The run still exits 1.
step_install_anyway() {
  "$VENV/bin/python" -m pip install --no-index --no-deps "$WHEELHOUSE"/*.whl || return 1
  "$VENV/bin/python" -m pip install --no-index --no-deps --no-build-isolation -e . || return 1
  "$VENV/bin/python" -m pip check || true
}

step_versions() {
  command -v nvidia-smi >/dev/null &&
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$VENV/bin/python" - <<'EOF'
import importlib, importlib.metadata, platform, sys

print("python", sys.version.split()[0], sys.executable, platform.platform())
missing = []
for module, dist in [("torch", "torch"), ("dask", "dask"), ("distributed", "distributed"),
                     ("numpy", "numpy"), ("pandas", "pandas"), ("pyarrow", "pyarrow"),
                     ("matplotlib", "matplotlib"), ("tqdm", "tqdm"), ("mnist1d", "mnist1d"),
                     ("pytest", "pytest"), ("pytest_timeout", "pytest-timeout"),
                     ("scaledl_lab", "scaledl_lab")]:
    try:
        where = importlib.import_module(module).__file__
        print(f"{dist:15} {importlib.metadata.version(dist):24} {where}")
    except Exception as exc:  # report every package, then fail
        print(f"{dist:15} MISSING: {exc!r}")
        missing.append(dist)
import torch

print(f"CUDA build {torch.version.cuda}; available: {torch.cuda.is_available()}; "
      f"{torch.cuda.device_count()} device(s); NCCL in torch.distributed: "
      f"{torch.distributed.is_nccl_available()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}")
if torch.cuda.is_available():
    print("cuDNN", torch.backends.cudnn.version(), "NCCL", torch.cuda.nccl.version())
sys.exit(1 if missing else 0)
EOF
}

step_data() {
  "$VENV/bin/python" -c "from scaledl_lab.data import locate; print(locate('fashion-mnist'))"
}

step_tests() {
  echo "files with gpu-marked tests: $GPU_TESTS"
  # shellcheck disable=SC2086  # GPU_TESTS is a list of file names without spaces
  "$VENV/bin/python" -m pytest -m gpu -p no:cacheprovider -p no:benchmark -o addopts='' -rA \
    --timeout 150 --junitxml "$REPORT/junit.xml" $GPU_TESTS
  local rc=$?
  [ "$rc" -eq 5 ] && echo "no gpu-marked test was collected"
  return "$rc"
}

step_bench() {
  "$VENV/bin/python" benchmarks/bench_gpu.py --batch 128 --steps 50
}
export -f step_install step_install_anyway step_versions step_data step_tests step_bench

START=$SECONDS
STEPS=()
FAILED=0
step() {  # step NAME LIMIT_S: run the function step_NAME under timeout, log it, record its result
  local name=$1 limit=$2 left rc result t0=$SECONDS
  left=$((BUDGET - (SECONDS - START)))
  ((limit > left)) && limit=$left
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
  if ((limit < 5)); then
    echo "not run: the budget of ${BUDGET}s is spent" | tee "$WORK/$name.out"
    rc=1 result="not run: the budget of ${BUDGET}s is spent"
  else
    timeout -k 10 "$limit" bash -c "step_$name" 2>&1 | tee "$WORK/$name.out"
    rc=${PIPESTATUS[0]} result=passed
    ((rc == 124 || rc == 137)) && result="timed out after ${limit}s"
    ((rc != 0 && rc != 124 && rc != 137)) && result="failed (exit $rc)"
  fi
  cat "$WORK/$name.out" >>"$LOG"
  ((rc != 0)) && FAILED=1
  STEPS+=("| $name | $result | $((SECONDS - t0)) |")
  echo "=== $name: $result" | tee -a "$LOG"
  return "$rc"
}

step install 120 || step install_anyway 60
step versions 60
step data 20
step tests 180
step bench 150

{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'); PYTHON=$PYTHON;" \
    "wheelhouse: $(ls "$WHEELHOUSE" 2>/dev/null | tr '\n' ' ')"
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${STEPS[@]}"
  echo
  echo "## Versions"
  echo
  echo '```'
  head -n 40 "$WORK/versions.out"
  echo '```'
  echo
  echo "## Tests (pytest -m gpu -rA)"
  echo
  echo '```'
  grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) |^=+ .*(passed|failed|skipped|error|no tests)' \
    "$WORK/tests.out" || tail -n 15 "$WORK/tests.out"  # no test ran: how pytest stopped
  echo '```'
  echo
  echo "## bench_gpu.py --batch 128 --steps 50"
  echo
  echo '```'
  tail -n 40 "$WORK/bench.out"
  echo '```'
} >"$SUMMARY" 2>&1
echo
cat "$SUMMARY"
echo
echo "report: $LOG, $SUMMARY, $REPORT/junit.xml; $((SECONDS - START)) s in all"
rm -rf "$WORK"
exit "$FAILED"
