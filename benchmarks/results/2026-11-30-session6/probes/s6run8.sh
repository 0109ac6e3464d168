source .probe/s6common.sh
step lease_probe.log 200 python3 .probe/lease_probe.py --out $OUT/lease_probe.json
cut -c1-250 $OUT/lease_probe.log | tail -8
