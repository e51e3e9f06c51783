set -u
export HOME=$(mktemp -d)
python3 -m autogen tune sgemv --m 16384 --n 16 > /dev/null 2>&1
for i in 1 2 3; do s=$(date +%s%N); python3 -m autogen tune sgemv --m 16384 --n 16 >/dev/null 2>&1; echo "warm $i $(( ($(date +%s%N)-s)/1000000 )) ms"; done
s=$(date +%s%N); python3 -c "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)"; echo "cuInit process $(( ($(date +%s%N)-s)/1000000 )) ms"
s=$(date +%s%N); python3 -c "pass"; echo "bare python $(( ($(date +%s%N)-s)/1000000 )) ms"
s=$(date +%s%N); python3 -S -c "pass"; echo "python -S $(( ($(date +%s%N)-s)/1000000 )) ms"
s=$(date +%s%N); python3 -c "import numpy"; echo "numpy $(( ($(date +%s%N)-s)/1000000 )) ms"
s=$(date +%s%N); python3 -c "import sqlalchemy"; echo "sqlalchemy $(( ($(date +%s%N)-s)/1000000 )) ms"
python3 -X importtime -m autogen tune sgemv --m 16384 --n 16 2> $OUT/importtime.txt >/dev/null
python3 -m cProfile -o /tmp/p.out -m autogen tune sgemv --m 16384 --n 16 > /dev/null 2>&1
python3 -c "import pstats; pstats.Stats('/tmp/p.out').sort_stats('cumulative').print_stats(45)" > $OUT/profile.txt 2>&1
python3 -c "import site,sys; print(sys.path); print(site.getsitepackages())"; ls $(python3 -c "import site; print(site.getsitepackages()[0])") | grep -c pth
sort -t'|' -k2 -n $OUT/importtime.txt | tail -25
