/// Fragment of kernel.cc (see there), after its anonymous namespace. The XLA FFI handlers
/// Fwd, Bwd and Rec (the symbols build.py registers), each under its part's macro, the
/// helpers that read their buffers, and GsThreads (in every part: the threads a call runs
/// on). @FFI_TYPE@ is F64 or F32, the FFI name of `real`.

// The threads a call of n trajectories with the `threads` attribute `requested` runs on
// now (the environment read as a call reads it), for gradsolve.drivers.kernel.build.threads.
extern "C" __attribute__((visibility("default"))) int64_t GsThreads(int64_t n, int32_t requested) {
  return threads_for(n, requested);
}

// The replay's problem from its buffers, trajectories sorted by step count; false if empty.
static bool setup(Problem& pr, ffi::Buffer<ffi::@FFI_TYPE@> times, ffi::Buffer<ffi::S32> n_eff,
                  ffi::Buffer<ffi::@FFI_TYPE@> p, ffi::Buffer<ffi::S32> save,
                  ffi::Buffer<ffi::@FFI_TYPE@> tsave, ffi::Buffer<ffi::S32> subst) {
  pr.n = n_eff.element_count();
  if (pr.n == 0) return false;
  pr.s1 = times.element_count() / pr.n;
  pr.k = save.element_count() / pr.n;
  pr.times = times.typed_data(); pr.n_eff = n_eff.typed_data(); pr.p = p.typed_data();
  pr.save = save.typed_data(); pr.tsave = tsave.typed_data(); pr.subst = subst.typed_data();
  sort_by_length(pr);
  pr.soff.resize(pr.n);
  return true;
}

// Known-time events of the replay (zero-width buffers without them).
static void set_events(Problem& pr, ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::@FFI_TYPE@> jsz,
                       ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::@FFI_TYPE@> jt,
                       const ffi::Buffer<ffi::S32>* tidx) {
  pr.J = jidx.element_count() / pr.n;
  pr.jidx = jidx.typed_data(); pr.jsz = jsz.typed_data();
  pr.land = land.typed_data(); pr.jt = jt.typed_data();
  if (tidx) { pr.L = tidx->element_count() / pr.n; pr.tidx = tidx->typed_data(); }
  pr.plain = pr.J == 0 && std::none_of(pr.subst, pr.subst + pr.n * pr.k,
                                       [](int32_t s) { return s != 0; });
}

// The forward's packed layout of the stored states: `rows` (see Problem::soff) and the
// offsets. Row offsets relative to t * s1 are int32; past that range the rows keep the
// capacity stride (offsets 0).
static void pack_rows(Problem& pr, int32_t* rows) {
  int64_t row = 0;
  for (int64_t t = 0; t < pr.n; ++t) { pr.soff[t] = row; row += std::max<int32_t>(pr.n_eff[t], 0) + 1; }
  const bool fits = pr.n * pr.s1 < ((int64_t)1 << 31);
  for (int64_t t = 0; t < pr.n; ++t) {
    if (!fits) pr.soff[t] = t * pr.s1;
    rows[t] = (int32_t)(pr.soff[t] - t * pr.s1);
  }
}

static void unpack_rows(Problem& pr, const int32_t* rows) {
  for (int64_t t = 0; t < pr.n; ++t) pr.soff[t] = t * pr.s1 + rows[t];
}

#ifdef GS_PART_FWD
static ffi::Error FwdImpl(ffi::Buffer<ffi::@FFI_TYPE@> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::@FFI_TYPE@> y0, ffi::Buffer<ffi::@FFI_TYPE@> p,
                          ffi::Buffer<ffi::S32> save, ffi::Buffer<ffi::@FFI_TYPE@> tol,
                          ffi::Buffer<ffi::@FFI_TYPE@> tsave, ffi::Buffer<ffi::S32> subst,
                          ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::@FFI_TYPE@> jsz,
                          ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::@FFI_TYPE@> jt,
                          ffi::Buffer<ffi::S32> tidx,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> ys, ffi::ResultBuffer<ffi::@FFI_TYPE@> y1,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> err,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> states,
                          ffi::ResultBuffer<ffi::S32> rows,
                          ffi::ResultBuffer<ffi::S32> cost, int32_t threads_attr) {
  Problem pr;
  if (!setup(pr, times, n_eff, p, save, tsave, subst)) return ffi::Error::Success();
  set_events(pr, jidx, jsz, land, jt, &tidx);
  pr.sw = states->element_count() / (pr.n * pr.s1);
  pack_rows(pr, rows->typed_data());
  for_threads(pr.n, threads_attr, [&](int64_t w, int64_t threads) {
    forward_thread(pr, w, threads, y0.typed_data(), tol.typed_data(), ys->typed_data(),
                   y1->typed_data(), err->typed_data(), states->typed_data(), cost->typed_data());
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Fwd, FwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>().Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>().Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Attr<int32_t>("threads"));
#endif  // GS_PART_FWD

#if defined(GS_PART_BWD) || defined(GS_PART_BWDT)
// The library built with GS_PART_BWDT carries node-time cotangents (`ts` given), the one
// built with GS_PART_BWD does not (the common case, a third less code to compile).
#ifdef GS_PART_BWDT
#define GS_TIMES true
#else
#define GS_TIMES false
#endif
static ffi::Error BwdImpl(ffi::Buffer<ffi::@FFI_TYPE@> times, ffi::Buffer<ffi::S32> n_eff,
                          ffi::Buffer<ffi::@FFI_TYPE@> p, ffi::Buffer<ffi::S32> save,
                          ffi::Buffer<ffi::@FFI_TYPE@> states, ffi::Buffer<ffi::S32> rows,
                          ffi::Buffer<ffi::@FFI_TYPE@> ct_ys,
                          ffi::Buffer<ffi::@FFI_TYPE@> ct_y1,
                          ffi::Buffer<ffi::@FFI_TYPE@> tsave, ffi::Buffer<ffi::S32> subst,
                          ffi::Buffer<ffi::S32> jidx, ffi::Buffer<ffi::@FFI_TYPE@> jsz,
                          ffi::Buffer<ffi::S32> land, ffi::Buffer<ffi::@FFI_TYPE@> jt,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> ct_tsave,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> ct_y0,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> ct_p,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> ct_jsz, int32_t threads_attr) {
  Problem pr;
  if (!setup(pr, times, n_eff, p, save, tsave, subst)) return ffi::Error::Success();
  set_events(pr, jidx, jsz, land, jt, nullptr);
  pr.sw = states.element_count() / (pr.n * pr.s1);
  unpack_rows(pr, rows.typed_data());
  for_threads(pr.n, threads_attr, [&](int64_t w, int64_t threads) {
    backward_thread<GS_TIMES>(pr, w, threads, states.typed_data(), ct_ys.typed_data(),
                              ct_y1.typed_data(), ct_tsave->typed_data(),
                              ct_y0->typed_data(), ct_p->typed_data(), ct_jsz->typed_data());
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Bwd, BwdImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>().Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>().Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Attr<int32_t>("threads"));

#endif  // GS_PART_BWD || GS_PART_BWDT

#ifdef GS_PART_REC
static ffi::Error RecImpl(ffi::Buffer<ffi::@FFI_TYPE@> t01, ffi::Buffer<ffi::@FFI_TYPE@> y0,
                          ffi::Buffer<ffi::@FFI_TYPE@> p, ffi::Buffer<ffi::@FFI_TYPE@> ts,
                          ffi::Buffer<ffi::@FFI_TYPE@> tol, ffi::Buffer<ffi::@FFI_TYPE@> dt0,
                          ffi::Buffer<ffi::@FFI_TYPE@> ctrl,
                          ffi::Buffer<ffi::@FFI_TYPE@> jt, ffi::Buffer<ffi::@FFI_TYPE@> jsz,
                          ffi::Buffer<ffi::@FFI_TYPE@> tst,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> times, ffi::ResultBuffer<ffi::S32> n_steps,
                          ffi::ResultBuffer<ffi::S32> n_rej, ffi::ResultBuffer<ffi::S32> status,
                          ffi::ResultBuffer<ffi::S32> save_index,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> dt_next,
                          ffi::ResultBuffer<ffi::@FFI_TYPE@> y_last,
                          ffi::ResultBuffer<ffi::S32> jump_index,
                          ffi::ResultBuffer<ffi::S32> tstop_index, bool fill,
                          int32_t threads_attr) {
  RecordIn in;
  in.fill = fill;
  in.n = dt0.element_count();
  if (in.n == 0) return ffi::Error::Success();
  in.k = ts.element_count() / in.n;
  in.cap = times->element_count() / in.n - 1;
  in.t01 = t01.typed_data(); in.y0 = y0.typed_data(); in.p = p.typed_data();
  in.ts = ts.typed_data(); in.tol = tol.typed_data(); in.dt0 = dt0.typed_data();
  in.ctrl = ctrl.typed_data();
  in.J = jt.element_count() / in.n; in.L = tst.element_count() / in.n;
  in.jt = jt.typed_data(); in.jsz = jsz.typed_data(); in.tst = tst.typed_data();
  in.order.resize(in.n);
  std::iota(in.order.begin(), in.order.end(), 0);
  for_threads(in.n, threads_attr, [&](int64_t w, int64_t threads) {
    record_thread(in, w, threads, times->typed_data(), n_steps->typed_data(), n_rej->typed_data(),
                  status->typed_data(), save_index->typed_data(), dt_next->typed_data(),
                  y_last->typed_data(), jump_index->typed_data(), tstop_index->typed_data());
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Rec, RecImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>().Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Arg<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>().Ret<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::@FFI_TYPE@>>()
        .Ret<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>()
        .Attr<bool>("fill").Attr<int32_t>("threads"));
#endif  // GS_PART_REC
