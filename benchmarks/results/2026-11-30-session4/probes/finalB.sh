export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_transport_pool.py compile_tests/test_transport_pool_compile.py > $OUT/transport-gpu-tests.log 2>&1; echo "transport tests rc $?"; tail -4 $OUT/transport-gpu-tests.log
timeout 80 python3 .probe/transport_final_check.py --out $OUT/transport-final-check.json > $OUT/transport-final-check.log 2>&1; echo "transport check rc $?"; tail -30 $OUT/transport-final-check.log
timeout 90 python3 benchmarks/bench_transport_pool.py --out $OUT > $OUT/bench_transport_pool.log 2>&1; echo "transport bench rc $?"; tail -12 $OUT/bench_transport_pool.log
timeout 130 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_sparse_mla_prefill.py gluon > $OUT/memcheck-adversarial_sparse_mla_prefill-gluon.log 2>&1; echo "memcheck sparse rc $?"; tail -3 $OUT/memcheck-adversarial_sparse_mla_prefill-gluon.log
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py > $OUT/memcheck-adversarial_transport_pool.log 2>&1; echo "memcheck transport rc $?"; tail -3 $OUT/memcheck-adversarial_transport_pool.log
timeout 80 compute-sanitizer --tool racecheck --report-api-errors no python3 .probe/one_call.py > $OUT/racecheck-one-gluon-call.log 2>&1; echo "racecheck rc $?"; grep -E "RACECHECK SUMMARY|kernel gluon|kernel triton" $OUT/racecheck-one-gluon-call.log | tail -4
