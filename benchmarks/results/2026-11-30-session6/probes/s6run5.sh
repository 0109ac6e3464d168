source .probe/s6common.sh
step small_probe.log 300 python3 .probe/small_probe.py --out $OUT
cut -c1-250 $OUT/small_probe.log | tail -20
for f in $OUT/graph-*.dot; do echo $f; grep -o 'label="[^"]*' $f | cut -c1-160; done
