source .probe/s6common.sh
step arrive_probe.log 300 python3 .probe/arrive_probe.py --out $OUT/arrive_probe.json
cut -c1-200 $OUT/arrive_probe.log | tail -40
