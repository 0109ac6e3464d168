# Session 6 run 9: the lease read as one vector load (committed as the next commit after ae5535e).
source .probe/s6common.sh
step lease_probe.log 60 python3 .probe/lease_probe.py --out $OUT/lease_probe.json
cut -c1-200 $OUT/lease_probe.log | tail -6
mkdir -p $OUT/bench
step bench/bench_transport_pool.log 100 python3 benchmarks/bench_transport_pool.py --out $OUT/bench
grep -E "^\| (64KiB|16MiB|256MiB)|rounds" $OUT/bench/bench_transport_pool.log | cut -c1-300
step transport-gpu-tests.log 80 python3 -m pytest -q -rfEs -p no:cacheprovider -m gpu -k "transport" tests compile_tests
tail -1 $OUT/transport-gpu-tests.log; grep FAILED $OUT/transport-gpu-tests.log | head
step memcheck-adversarial_transport_pool.log 35 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/memcheck-adversarial_transport_pool.log
