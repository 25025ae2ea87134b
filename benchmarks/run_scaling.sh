#!/usr/bin/env bash
# The scaling runs on a many-core machine, in one go: bench_inference's forward and
# decoding sections, BLAS's busy-waiting threads and the threaded forward's two ways
# (blas_spin.py, at THREADS only), the thread probes (threads_probe.py, at THREADS and at
# 2, where a decoding step is taken apart), int8's dequantisation bound, bench_forward and
# bench_generation, at the thread counts of COUNTS (default 1, 2 and THREADS; THREADS
# defaults to every core), each report kept as OUT/<name>.md (stderr beside it), each run
# under its own time limit so that one slow run cannot take the others' time. The most
# important runs come first.
#
#     [COUNTS=2,16] benchmarks/run_scaling.sh OUT [THREADS]
#
# PYTHON picks the interpreter (default: python3, with numpy, torch, transformers,
# safetensors and threadpoolctl importable).
#
# The limits are about twice what each run took on the kit's 2-core machine at COUNTS=1,2
# while other work kept both cores busy (load average 3 to 4): inference 405 s, probe
# 12 s, int8_tiles 38 s, forward 118 s, generation 125 s, 700 s in all; blas_spin, measured
# alone at 2 threads on the idle machine, 58 s (its one-thread passes take as long on any
# machine); the probe with its decoding step taken apart, at 2 threads on the idle
# machine, 31 s (limit 120 s at each count). A machine with more cores runs the 1- and
# 2-thread rows about as fast as that one and its own count faster, so they hold there
# too. The limits add up to 1730 s.
# LIMIT_SCALE (default 1, decimals allowed) multiplies every limit: above 1 for a slower
# or busier machine, below 1 where a machine is lent for less time than that (or run fewer
# COUNTS).
set -u
OUT=${1:?usage: run_scaling.sh OUT [THREADS]}
N=${2:-$(nproc)}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -n "${COUNTS:-}" ]; then export BENCH_COUNTS=$COUNTS; fi

run() {
    local name=$1 limit
    limit=$(awk -v l="$2" -v s="${LIMIT_SCALE:-1}" 'BEGIN { printf "%d", l * s + 0.5 }')
    shift 2
    local start=$SECONDS
    timeout "$limit" "$PY" "$@" > "$OUT/$name.md" 2> "$OUT/$name.err"
    echo "$name: exit $? after $((SECONDS - start)) s (limit $limit s)"
}

echo "threads: $N; counts: ${COUNTS:-1,2,$N}; limits × ${LIMIT_SCALE:-1}; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
run inference 800 benchmarks/bench_inference.py --threads "$N" --repeats 2 --new-tokens 12 --only forward,decoding
run blas_spin 120 benchmarks/blas_spin.py --threads "$N" --repeats 2
OPENBLAS_NUM_THREADS=$N run probe 120 benchmarks/threads_probe.py
OPENBLAS_NUM_THREADS=2 run probe_2 120 benchmarks/threads_probe.py
run int8_tiles 90 benchmarks/bench_inference.py --threads "$N" --repeats 2 --new-tokens 8 --only tiles
run forward 240 benchmarks/bench_forward.py --threads "$N" --repeats 1
run generation 240 benchmarks/bench_generation.py --threads "$N" --new-tokens 16 --repeats 1
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
