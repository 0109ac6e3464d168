export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 200 python3 .probe/persist_probe.py $OUT/persist-probe.json 2>&1 | grep -v warn | tee $OUT/persist-probe.log
