# Session 5 final GPU run: transport benchmark, host profile, the whole suite (CPU and GPU tests
# on this machine's torch 2.11, the IPC test at the 10,000 transfers), sanitizers on the
# transport's adversarial script, the self-check.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)'; } > $OUT/env.txt 2>&1
step() { local log=$1 t=$2; shift 2; local s=$(date +%s); timeout $t "$@" > $OUT/$log 2>&1; echo "=== exit $? in $(( $(date +%s) - s )) s: $log"; }
step bench_transport_pool.log 170 python3 benchmarks/bench_transport_pool.py --out $OUT
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|tuning" $OUT/bench_transport_pool.log | cut -c1-400
STRICTOPS_IPC_TRANSFERS=10000 step tests.log 300 python3 -m pytest -q -rfEs -p no:cacheprovider --durations=15 tests compile_tests
tail -4 $OUT/tests.log; grep -E "FAILED|ERROR" $OUT/tests.log | head
step memcheck-adversarial_transport_pool.log 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/memcheck-adversarial_transport_pool.log
step host-profile.log 45 python3 .probe/host_profile.py
head -3 $OUT/host-profile.log | cut -c1-600
step selfcheck.log 60 python3 -m strictops
tail -1 $OUT/selfcheck.log
step racecheck-adversarial_transport_pool.log 90 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/racecheck-adversarial_transport_pool.log
