#!/usr/bin/env bash
# The one prepared run for a session lent the GPU machine (issue 7's GPU table).
#
# The device tool runs a command in a copy of the working tree with jax (CUDA), diffrax,
# equinox, optax and numpyro installed and no network, and gives back what is written under
# $OUT. Use it as:
#
#     run(command="bash benchmarks/gpu_session.sh", timeout_s=590)
#
# Rows are measured most important first (the targets are at 32,768 trajectories), each in
# its own process under its own time limit, and every row is written as soon as it is
# measured (bench_core rewrites its JSON after each row), so a run cut short keeps what it
# has. The optimised HLO of the replay gradient is saved too: its kernels per step are what
# would decide a fused Pallas kernel. Total budget: ~9 minutes (the rows after the matched
# Lorenz run share what is left of 540 s).
set -u
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python -c "import jax, diffrax, equinox; print('jax', jax.__version__, 'diffrax', diffrax.__version__, 'equinox', equinox.__version__); print(jax.devices())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

row() {  # row SECONDS PROBLEM SIZE [TAG]
  local left=$(( 540 - (SECONDS - START) ))
  local limit=$(( $1 < left ? $1 : left ))
  if (( limit < 30 )); then echo "skipped $2 n=$3 (time budget)" | tee -a "$OUT/bench.log"; return; fi
  echo "# $2 n=$3 ${4:-}" >> "$OUT/bench.log"
  timeout "$limit" python benchmarks/bench_core.py --problems "$2" --sizes "$3" --repeats 5 \
    --json "$OUT/core_$2_$3${4:-}.json" 2>&1 | grep -v "^WARNING" | tee -a "$OUT/bench.log"
}

# First: the published fused-ensemble protocol (Lorenz, rho over [0, 21], matched error against
# SciPy DOP853), whose H200 figures (7.5-13.4x Diffrax; 9.7x at n = 32,768, rtol 1e-6) this
# compares with directly.
echo "# lorenz matched n=32768" >> "$OUT/bench.log"
timeout 200 python benchmarks/bench_lorenz_matched.py --n 32768 --rtols 1e-5,1e-6,1e-7,1e-8 \
  --repeats 3 --json "$OUT/lorenz_matched_32768.json" 2>&1 | grep -v "^WARNING" | tee -a "$OUT/bench.log"
row 150 lotka_volterra 32768
row 120 lorenz 32768
row 120 van_der_pol 32768
# The batched XLA replay the lanes replay replaced (gradsolve._lanes), for comparison.
GRADSOLVE_LANES=0 row 120 lotka_volterra 32768 _batched
row 60 lotka_volterra 1000
row 60 lorenz 1000
row 60 van_der_pol 1000

timeout 60 python - <<'EOF' > "$OUT/hlo_summary.txt" 2>&1
# Kernels per replay step on this device: the optimised HLO of the LV replay gradient.
import os, re, sys
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, "benchmarks")
import gradsolve as gs
from problems import make
f, t1, y0, p, ts, _ = make("lotka_volterra", 32768)
mesh = gs.record(f, 0.0, t1, y0, p, ts=ts, rtol=1e-6, atol=1e-8)
for name, fn in {
    "grad": jax.jit(jax.grad(lambda q: jnp.sum(gs.replay(f, mesh, y0, q).ys ** 2))),
    "forward": jax.jit(lambda q: gs.replay(f, mesh, y0, q).ys),
}.items():
    text = fn.lower(p).compile().as_text()
    with open(os.path.join(os.environ.get("OUT", "."), f"replay_{name}.hlo.txt"), "w") as fh:
        fh.write(text)
    print(name, "fusions:", len(re.findall(r"= \S+ fusion\(", text)),
          "custom-calls:", text.count("custom-call("), "whiles:", text.count(" while("),
          "conditionals:", text.count(" conditional("))
EOF
cat "$OUT/hlo_summary.txt"
echo "done in $(( SECONDS - START )) s; results in $OUT"
