# Session 7 run 4, as committed (78dd9bc): the whole suite on the GPU machine with the IPC test
# at 10,000 transfers, and the self-check (.ci/gpu, part "tests", packed in gpu-results.tar.gz);
# then the transport benchmark.
export PYTHONUNBUFFERED=1
s=$(date +%s)
STRICTOPS_IPC_TRANSFERS=10000 STRICTOPS_GPU_PARTS=tests timeout 430 bash .ci/gpu > /tmp/gpu.log 2>&1
echo "=== .ci/gpu exit $? in $(( $(date +%s) - s )) s"
grep -E "passed|failed|FAILED|checks" /tmp/gpu.log | tail -6
export PYTHONPATH=/tmp/site
mkdir -p $OUT/bench
s=$(date +%s)
timeout 150 python3 benchmarks/bench_transport_pool.py --out $OUT/bench > $OUT/bench/bench_transport_pool.log 2>&1
echo "=== bench exit $? in $(( $(date +%s) - s )) s"
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench/bench_transport_pool.log | cut -c1-330
