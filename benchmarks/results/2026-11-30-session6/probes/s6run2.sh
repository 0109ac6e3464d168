# Session 6, two H200s: the whole suite (CPU and GPU tests on torch 2.11, the two-GPU tests,
# the IPC test at the 10,000 transfers), then the self-check.
source .probe/s6common.sh
STRICTOPS_IPC_TRANSFERS=10000 step tests.log 420 python3 -m pytest -q -rfEs -p no:cacheprovider --durations=20 tests compile_tests
tail -4 $OUT/tests.log; grep -E "FAILED|ERROR|SKIPPED" $OUT/tests.log | head -20
step selfcheck.log 60 python3 -m strictops
tail -1 $OUT/selfcheck.log
