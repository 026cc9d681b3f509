"""The persistent XLA compilation cache that fits and samplers switch on: where it goes, that
a second process loads what the first compiled, that it gives the same numbers, and that
the user's own configuration and the opt-out are respected. Each case runs in a new
process (JAX's configuration is global)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

FIT = textwrap.dedent("""
    import json, logging, sys, time
    import jax
    hits = []
    class Hits(logging.Handler):
        def emit(self, record):
            if "cache hit" in record.getMessage():
                hits.append(record.getMessage())
    log = logging.getLogger("jax._src.compiler")
    log.setLevel(logging.DEBUG)
    log.addHandler(Hits())
    jax.config.update("jax_enable_x64", True)
    {setup}
    import gradsolve as gs, inference, models
    before = jax.config.jax_compilation_cache_dir
    m, data = models.lynx_hare(), models.load_dataset("lynx_hare")
    t = time.perf_counter()
    r = inference.fit(m, data, steps=20, n_starts=2, seed=0, progress=False)
    print(json.dumps(dict(before=before, after=jax.config.jax_compilation_cache_dir,
                          loss=float(r.losses.min()), hits=len(hits), seconds=time.perf_counter() - t)))
""")


def _run(tmp_path, env_extra, setup=""):
    env = dict(os.environ, **env_extra)
    env.pop("GRADSOLVE_XLA_CACHE", None) if "GRADSOLVE_XLA_CACHE" not in env_extra else None
    out = subprocess.run([sys.executable, "-c", FIT.format(setup=setup)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _files(folder):
    return sorted(f for _, _, fs in os.walk(folder) for f in fs)


def test_fit_switches_the_cache_on_and_a_second_process_reuses_it(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, {"GRADSOLVE_XLA_CACHE": str(cache)})
    assert first["before"] is None and first["after"] == str(cache)
    written = _files(cache)
    assert written, "the fit compiled programs but wrote none to the cache"
    second = _run(tmp_path, {"GRADSOLVE_XLA_CACHE": str(cache)})
    # the second process loads programs the first compiled, and fits the same
    assert first["hits"] == 0 and second["hits"] >= 1
    assert second["loss"] == pytest.approx(first["loss"], rel=1e-12)


def test_opt_out_by_environment(tmp_path):
    out = _run(tmp_path, {"GRADSOLVE_XLA_CACHE": "0"})
    assert out["after"] is None


def test_opt_out_in_code(tmp_path):
    out = _run(tmp_path, {"GRADSOLVE_XLA_CACHE": str(tmp_path / "never")},
               setup="import gradsolve; gradsolve.use_compilation_cache(False)")
    assert out["after"] is None and not (tmp_path / "never").exists()


def test_a_cache_the_user_configured_is_kept(tmp_path):
    mine = tmp_path / "mine"
    out = _run(tmp_path, {"GRADSOLVE_XLA_CACHE": str(tmp_path / "ours")},
               setup=f"jax.config.update('jax_compilation_cache_dir', {str(mine)!r})")
    assert out["before"] == out["after"] == str(mine)
    assert not (tmp_path / "ours").exists()


def test_importing_changes_no_jax_configuration():
    code = ("import jax; import gradsolve, inference, models; "
            "print(jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "1.0"]
