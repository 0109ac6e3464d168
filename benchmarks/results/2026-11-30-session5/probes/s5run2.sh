export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 240 python3 .probe/transport_check5.py --out $OUT/transport-check5.json > $OUT/transport-check5.log 2>&1; echo "check5 exit $?"
grep -v "^ *$" $OUT/transport-check5.log | grep -v "warn" | cut -c1-220
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k transport tests compile_tests > $OUT/transport-gpu-tests.log 2>&1; echo "tests exit $?"; tail -4 $OUT/transport-gpu-tests.log
