export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
step() { local log=$1 t=$2; shift 2; local s=$(date +%s); timeout $t "$@" > $OUT/$log 2>&1; echo "=== exit $? in $(( $(date +%s) - s )) s: $log"; }
step host-profile.log 45 python3 .probe/host_profile.py
head -2 $OUT/host-profile.log | cut -c1-600
step transport-gpu-tests.log 150 python3 -m pytest -q -rfEs -p no:cacheprovider -m gpu -k "transport" tests compile_tests
tail -1 $OUT/transport-gpu-tests.log; grep FAILED $OUT/transport-gpu-tests.log | head
mkdir -p $OUT/bench6
step bench6/bench_transport_pool.log 150 python3 benchmarks/bench_transport_pool.py --out $OUT/bench6
grep -E "^\| 256MiB|^\| 64KiB|bar:|256MiB tuning" $OUT/bench6/bench_transport_pool.log | cut -c1-330
