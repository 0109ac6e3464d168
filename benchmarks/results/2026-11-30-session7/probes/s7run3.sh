# Session 7 run 3: volatile copy load + the flag as an inline-PTX release store (working tree of
# next/transport-load-order): phase_probe, the benchmark, transport GPU tests (GPU compile
# tests included), memcheck and racecheck.
source .probe/s7common.sh
step phase_probe.log 120 python3 .probe/phase_probe.py --out /tmp/phase_probe.json
cut -c1-200 $OUT/phase_probe.log | tail -8
mkdir -p /tmp/bench
step bench.log 200 python3 benchmarks/bench_transport_pool.py --out /tmp/bench
cp /tmp/bench/* $OUT/ 2>/dev/null; rm -f $OUT/transport_pool.png
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench.log | cut -c1-330
step transport-gpu-tests.log 200 python3 -m pytest -q -rfEs -p no:cacheprovider -m gpu -k "transport" tests compile_tests
tail -1 $OUT/transport-gpu-tests.log; grep FAILED $OUT/transport-gpu-tests.log | head
step memcheck.log 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/memcheck.log
step racecheck.log 100 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/racecheck.log
