#!/usr/bin/env bash
# One prepared run on a TPU machine lent to a session (the accelerator driver, issue "The
# accelerator": gs.drivers.Pallas).
#
# The device tool runs a command in a copy of the working tree with JAX (and Pallas) but
# without gradsolve's other pure-Python dependencies, and no package index. Download their
# wheels here first, into an ignored folder, matching the versions in .venv:
#
#     mkdir -p build/tpu_wheels && cd build/tpu_wheels && ../../.venv/bin/pip download --no-deps \
#         equinox==0.13.8 diffrax==0.7.2 lineax==0.1.1 optimistix==0.1.0 jaxtyping==0.3.11 \
#         wadler_lindig==0.1.8 typing_extensions==4.16.0 optax==0.2.8 numpyro==0.22.0 \
#         absl-py==2.5.1 multipledispatch==1.0.0 tqdm==4.70.1
#
# and, for inference.sampling.ChEES (the lockstep ensemble sampler; step "samplers"),
# BlackJAX (its dependencies, jax, numpy, scipy, optax and typing_extensions, are there):
#
#     ../../.venv/bin/pip download --no-deps -d . blackjax==1.7.1
#
# then run, carrying that folder:
#
#     run(command="bash benchmarks/tpu_session.sh", carry=["build/tpu_wheels"], timeout_s=590)
#
# Steps (each under its own time limit, output kept as it comes): install the wheels to a
# folder on PYTHONPATH, print the device, compare the Pallas kernels with the lanes replay
# on the chip (--check), then the benchmark at 32,768 trajectories. $STEPS picks steps
# (default "setup check bench"; also "events", "sweep" (Pallas alone up to 1,048,576
# trajectories, peak HBM per size), "lorenz", "cpu" (the host's cores), "tutorial"
# (tutorial 11 run into a notebook with its output), "population" (the 200-subject
# posterior, float32, $POP_N subjects, $POP_S seconds at most, $POP_ARGS more flags),
# "defaults" (gs.solve's gradient at its defaults, $DEF_N trajectories, default 1,048,576:
# route, capacity, second call, peak HBM), "theophylline" (inference.sample of the
# theophylline population, 4 chains vectorised on the chip, 50 + 50 draws), "fitstarts"
# (inference.fit of lynx-hare at 1,024 and 100,000 starts, chip and host), "fitstep" (one
# fit step's parts: the record in place, the gradient, both), "popstep" (one leapfrog
# step of theophylline's and the 200-subject study's posteriors), "samplers"
# (NUTS against ChEES, benchmarks/bench_samplers.py: $SAMP_MODELS, default lynx; theo in a
# call of its own; float32; $SAMP_ARGS its flags)); $NS the sizes of the bench step.
set -u
OUT=${OUT:-benchmarks/results/tpu}
mkdir -p "$OUT"
LOG="$OUT/tpu_session.log"
DEPS=${DEPS:-/tmp/gradsolve_deps}
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
STEPS=${STEPS:-"setup check bench"}
NS=${NS:-32768}
PY=${PY:-python3}

# ArviZ's binary needs (pandas, xarray, matplotlib, h5py) from the machine's own package
# index, for inference.sample's results; arviz, xarray-einstats, h5netcdf and platformdirs
# come from build/tpu_wheels
arviz_deps() {
  PIP_CONFIG_FILE=/dev/null $PY -m pip install --isolated -q --only-binary=:all: \
    --index-url file:///opt/pypi/simple --target /tmp/gradsolve_site pandas xarray \
    matplotlib h5py 2>&1 | tail -3 | tee -a "$LOG"
}

setup() {
  mkdir -p "$DEPS"
  if ! $PY -m pip install --no-index --no-deps --target "$DEPS" build/tpu_wheels/*.whl -q; then
    # no pip: pure-Python wheels are zip files
    for w in build/tpu_wheels/*.whl; do $PY -m zipfile -e "$w" "$DEPS"; done
  fi
  $PY -c "import jax, equinox, diffrax, gradsolve; print('jax', jax.__version__, jax.devices())"
}

for step in $STEPS; do
  echo "### $step $(date -u +%H:%M:%S)" | tee -a "$LOG"
  case $step in
    setup) setup 2>&1 | tee -a "$LOG" ;;
    check) timeout 200 $PY benchmarks/bench_accelerator.py --n 4096 --sides lanes,pallas \
             --check --repeats 3 --json "$OUT/check_4096.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    bench) for n in $NS; do
             timeout 300 $PY benchmarks/bench_accelerator.py --n "$n" --repeats 5 \
               --json "$OUT/bench_$n.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG"
           done ;;
    events) timeout 400 $PY benchmarks/bench_accelerator.py --events --n "${EVENTS_N:-32768}" \
             --repeats 5 --json "$OUT/events.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # Pallas alone, one process per size (so the peak HBM is per size), mesh capacity
    # $SWEEP_CAP (default 256)
    sweep) for n in ${SWEEP_NS:-1024 32768 262144 1048576}; do
             timeout 240 $PY benchmarks/bench_accelerator.py --n "$n" --sides pallas \
               --max-steps "${SWEEP_CAP:-256}" --repeats 5 --json "$OUT/sweep_$n.json" 2>&1 \
               | grep -v "^WARNING" | tee -a "$LOG"
           done ;;
    lorenz) timeout 300 $PY benchmarks/bench_accelerator.py --model lorenz --n 32768 \
              --repeats 3 --json "$OUT/lorenz.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # the same machine's CPU cores: the compiled kernel, the XLA lanes and Diffrax
    cpu) JAX_PLATFORMS=cpu timeout 400 $PY benchmarks/bench_accelerator.py --n 32768 \
           --sides diffrax,lanes,kernel --repeats 3 --json "$OUT/cpu.json" 2>&1 \
           | grep -v "^WARNING" | tee -a "$LOG" ;;
    # the simulated 200-subject two-compartment study under inference.sample, float32, chains
    # vectorised on the chip. ArviZ's binary needs (pandas, xarray, matplotlib, h5py) come
    # from the machine's own package index; arviz, xarray-einstats, h5netcdf and platformdirs
    # from build/tpu_wheels
    population)
      arviz_deps
      PYTHONPATH="$PYTHONPATH:/tmp/gradsolve_site" PYTHONUNBUFFERED=1 timeout "${POP_S:-480}" \
        $PY benchmarks/bench_population.py --study "${POP_N:-200}" --sides gradsolve --float32 \
        ${POP_ARGS:-} 2>&1 | grep -v "^WARNING" | tee -a "$LOG"
      cp benchmarks/results/bench_population_study_*.json "$OUT/" 2>/dev/null ;;
    # one process (its peak HBM is its own)
    defaults) timeout 300 $PY benchmarks/bench_accelerator.py --defaults --n "${DEF_N:-1048576}" \
                --repeats 3 --json "$OUT/defaults.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    theophylline)
      arviz_deps
      PYTHONPATH="$PYTHONPATH:/tmp/gradsolve_site" PYTHONUNBUFFERED=1 timeout "${THEO_S:-300}" \
        $PY -c '
import json, time, jax, inference, models
t = time.perf_counter()
r = inference.sample(models.theophylline(), models.load_dataset("theophylline"), num_chains=4,
                     num_warmup=50, num_samples=50, progress=False)
out = {"sample_s": time.perf_counter() - t, "peak_bytes": jax.devices()[0].memory_stats().get(
    "peak_bytes_in_use"), "result": type(r).__name__}
print(json.dumps(out)); print(r)' 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # where a sampler's time goes (phases against the gradient floor), lynx-hare, $SS_ARGS
    samplestep)
      arviz_deps
      PYTHONPATH="$PYTHONPATH:/tmp/gradsolve_site" PYTHONUNBUFFERED=1 timeout "${SS_S:-400}" \
        $PY benchmarks/bench_sample_step.py ${SS_ARGS:---chains 2,64} \
        --json "$OUT/sample_step${SS_TAG:-}.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # inference.fit on lynx-hare, first and second call in one process, $FIT_NS starts
    fitstep)
      PYTHONUNBUFFERED=1 timeout "${FIT_S:-300}" $PY -c '
import os, sys, time, jax
if os.environ.get("FIT_X64", "1") == "1": jax.config.update("jax_enable_x64", True)
import inference, models
m, d = models.lynx_hare(), models.load_dataset("lynx_hare")
for n in [int(x) for x in os.environ.get("FIT_NS", "16 1024").split()]:
    for call in (1, 2):
        t = time.perf_counter(); r = inference.fit(m, d, n_starts=n, seed=call, progress=False)
        print(f"fit n_starts={n} call={call} {time.perf_counter() - t:.2f} s best={float(min(r.losses)):.6g} evals={r.n_grad_evals}", flush=True)
' 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # inference.fit of lynx-hare at ensemble width, chip against its host in one process
    # (benchmarks/bench_fit_starts.py): $FITSTARTS_NS sizes, $FITSTARTS_ARGS more flags
    # (e.g. "--host-max-n 1024": the host at 100,000 starts takes about half an hour)
    # one fit step's parts (benchmarks/bench_fit_step.py) at $FITSTEP_NS starts, at the
    # trimmed capacity and padded to 4,096 (what a fit's capacity grows to)
    fitstep)
      for n in ${FITSTEP_NS:-16384 100000}; do
        for cap in "" "--capacity 4096"; do
          PYTHONUNBUFFERED=1 timeout 200 $PY benchmarks/bench_fit_step.py --n "$n" $cap 2>&1 \
            | grep -v "^WARNING" | tee -a "$LOG"
        done
      done ;;
    # one leapfrog step of a population posterior (benchmarks/bench_theo_step.py
    # --steps-only): theophylline and the simulated $POPSTEP_STUDY-subject study (default
    # 200) at $POPSTEP_CHAINS chains (default 128): record, replay gradient, solve gradient
    popstep)
      for study in 0 "${POPSTEP_STUDY:-200}"; do
        PYTHONUNBUFFERED=1 timeout 240 $PY benchmarks/bench_theo_step.py --steps-only \
          --study "$study" --chains "${POPSTEP_CHAINS:-128}" 2>&1 | grep -v "^WARNING" \
          | tee -a "$LOG"
      done ;;
    fitstarts)
      PYTHONUNBUFFERED=1 timeout "${FITSTARTS_S:-580}" $PY benchmarks/bench_fit_starts.py \
        --n "${FITSTARTS_NS:-1024,100000}" --float32 ${FITSTARTS_ARGS:---host-max-n 1024} \
        --json "$OUT/fit_starts.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # NUTS against the lockstep ensemble sampler (ChEES), min bulk ESS per second, first and
    # second run of each in one process; the route printed
    samplers)
      arviz_deps
      PYTHONPATH="$PYTHONPATH:/tmp/gradsolve_site" PYTHONUNBUFFERED=1 timeout "${SAMP_S:-580}" \
        $PY benchmarks/bench_samplers.py --platform tpu --float32 \
        --models "${SAMP_MODELS:-lynx}" \
        ${SAMP_ARGS:---repeat 2 --warmup 300 --samples 300 --nuts-chains 64 --chees-chains 128} \
        --json "$OUT/samplers.json" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
    # tutorial 11 at full size, its printed output written into the notebook
    tutorial) timeout 500 $PY tools/run_notebook.py tutorials/11_on_a_tpu.ipynb \
                "$OUT/11_on_a_tpu.ipynb" 2>&1 | grep -v "^WARNING" | tee -a "$LOG" ;;
  esac
done
