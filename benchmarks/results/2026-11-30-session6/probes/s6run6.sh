# Session 6 final GPU run, as committed: transport GPU tests (IPC at 10,000 transfers), memcheck
# and racecheck over the adversarial transport script, the transport benchmark.
source .probe/s6common.sh
STRICTOPS_IPC_TRANSFERS=10000 step transport-gpu-tests.log 200 python3 -m pytest -q -rfEs -p no:cacheprovider -m gpu -k "transport" tests compile_tests
tail -1 $OUT/transport-gpu-tests.log; grep FAILED $OUT/transport-gpu-tests.log | head
step memcheck-adversarial_transport_pool.log 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/memcheck-adversarial_transport_pool.log
mkdir -p $OUT/bench
step bench/bench_transport_pool.log 200 python3 benchmarks/bench_transport_pool.py --out $OUT/bench
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds|tuning" $OUT/bench/bench_transport_pool.log | cut -c1-330
step racecheck-adversarial_transport_pool.log 100 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/racecheck-adversarial_transport_pool.log
