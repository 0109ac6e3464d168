export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
timeout 230 python3 .probe/transport_check3.py --out $OUT/transport-check3.json > $OUT/transport-check3.log 2>&1; echo "check3 exit $?"
grep -v "^ *$" $OUT/transport-check3.log | cut -c1-200
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k transport tests compile_tests > $OUT/transport-gpu-tests.log 2>&1; echo "tests exit $?"; tail -8 $OUT/transport-gpu-tests.log
timeout 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 tests/adversarial_transport_pool.py > $OUT/memcheck-transport.log 2>&1; echo "memcheck exit $?"; tail -3 $OUT/memcheck-transport.log
timeout 90 ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis -c 6 python3 .probe/copy_ncu.py > $OUT/ncu-copy.txt 2>&1; echo "ncu exit $?"
grep -E "^  [a-zA-Z_].*\(|Block Size|Grid Size|Registers Per|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Waves Per SM|Theoretical Occupancy" $OUT/ncu-copy.txt | head -80
