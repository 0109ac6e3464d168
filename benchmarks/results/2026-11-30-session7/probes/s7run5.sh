# Session 7 run 5, as committed (78dd9bc), on the two-GPU host: the multi-GPU tests, then the
# transport benchmark (that host was the slower one for every copy in session 6).
source .probe/s7common.sh
step multi-gpu-tests.log 200 python3 -m pytest -q -rfEs -p no:cacheprovider -m multi_gpu tests compile_tests
tail -1 $OUT/multi-gpu-tests.log; grep FAILED $OUT/multi-gpu-tests.log | head
mkdir -p $OUT/bench
step bench/bench_transport_pool.log 150 python3 benchmarks/bench_transport_pool.py --out $OUT/bench
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench/bench_transport_pool.log | cut -c1-330
