# Session 6: the transport benchmark twice, then memcheck and racecheck over the adversarial
# transport script.
source .probe/s6common.sh
for i in 1 2; do
  mkdir -p $OUT/bench$i
  step bench$i/bench_transport_pool.log 240 python3 benchmarks/bench_transport_pool.py --out $OUT/bench$i
  grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench$i/bench_transport_pool.log | cut -c1-300
done
step memcheck-adversarial_transport_pool.log 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/memcheck-adversarial_transport_pool.log
step racecheck-adversarial_transport_pool.log 100 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py
tail -2 $OUT/racecheck-adversarial_transport_pool.log
