export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export WS_VARIANTS='[{}, {"convert_first": true}, {"convert_first": true, "num_stages": 3, "lag": 2}, {"num_stages": 3, "lag": 2}, {"convert_first": true, "num_stages": 3, "lag": 1}]'
timeout 150 python3 .probe/ws_sweep2.py 2>&1 | tee $OUT/sweep.log | grep -v "^ " | cut -c1-250
