/// Fragment of kernel.cc (see there), inside its anonymous namespace. Elementwise functions
/// that gradsolve.drivers.kernel.codegen emits calls to. Plain C++ on a `real` typedef,
/// with no placeholders: source.py also exports this text as SPECIAL_FUNCTIONS, which the
/// tests compile alone against scipy (tests/test_translator.py).

// Elementwise functions without a libm counterpart (gradsolve.drivers.kernel.codegen).
// gs_total_key: an integer ordered as XLA's total order of floats (-NaN < -inf < ... <
// -0 < +0 < ... < inf < NaN), for lt_to / le_to / eq_to.
static inline int64_t gs_total_key(double x) {
  int64_t b; std::memcpy(&b, &x, sizeof b);
  return b < 0 ? b ^ std::numeric_limits<int64_t>::max() : b;
}
static inline int32_t gs_total_key(float x) {
  int32_t b; std::memcpy(&b, &x, sizeof b);
  return b < 0 ? b ^ std::numeric_limits<int32_t>::max() : b;
}
static inline long long gs_total_key(long long x) { return x; }
static inline int gs_total_key(int x) { return x; }

// digamma: reflection to x > 0 (psi(x) = psi(1 - x) - pi / tan(pi x), NaN at the poles
// x = 0, -1, ... as in XLA), the recurrence psi(x) = psi(x + 1) - 1 / x up to x >= 10,
// then the asymptotic series (its next term is below 1e-16 there).
static inline real gs_digamma(real x) {
  const real pi = (real)3.141592653589793238462643383279502884;
  real shift = 0;
  if (x <= 0) {
    if (x == std::floor(x)) return (real)NAN;
    shift = -pi / std::tan(pi * (x - std::round(x)));  // tan has period pi; |arg| <= pi/2
    x = 1 - x;
  }
  for (int i = 0; i < 10; ++i) {
    const bool small = x < 10;
    shift -= small ? 1 / x : (real)0;
    x += small ? (real)1 : (real)0;
  }
  const real r = 1 / (x * x);
  const real series = r * ((real)1 / 12 - r * ((real)1 / 120 - r * ((real)1 / 252 - r * (
      (real)1 / 240 - r * ((real)1 / 132 - r * ((real)691 / 32760 - r * ((real)1 / 12)))))));
  return shift + std::log(x) - (real)0.5 / x - series;
}

// erfinv: Giles' single-precision approximation ("Approximating the erfinv function",
// GPU Computing Gems, 2011) refined by Halley steps: on erf (|x| <= 0.5), else on
// log(erfc(y) / (1 - |x|)) (1 - |x| exact; nearly quadratic in y, so the steps converge
// from the rougher start near |x| = 1, and erfc keeps the tail's relative accuracy).
static inline real gs_erfinv(real x) {
  const real a = std::abs(x);
  if (!(a < 1)) return a == 1 ? x * (real)INFINITY : (real)NAN;
  real w = -std::log((1 - a) * (1 + a)), p;
  if (w < 5) {
    w -= (real)2.5;
    p = (real)2.81022636e-08;
    p = (real)3.43273939e-07 + p * w; p = (real)-3.5233877e-06 + p * w;
    p = (real)-4.39150654e-06 + p * w; p = (real)0.00021858087 + p * w;
    p = (real)-0.00125372503 + p * w; p = (real)-0.00417768164 + p * w;
    p = (real)0.246640727 + p * w; p = (real)1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3;
    p = (real)-0.000200214257;
    p = (real)0.000100950558 + p * w; p = (real)0.00134934322 + p * w;
    p = (real)-0.00367342844 + p * w; p = (real)0.00573950773 + p * w;
    p = (real)-0.0076224613 + p * w; p = (real)0.00943887047 + p * w;
    p = (real)1.00167406 + p * w; p = (real)2.83297682 + p * w;
  }
  real y = p * a;
  const real c = (real)1.128379167095512573896158903121545172;  // 2 / sqrt(pi)
  if (a <= (real)0.5) {
    for (int i = 0; i < 2; ++i) {  // f = erf(y) - a: f' = c exp(-y^2), f'' = -2 y f'
      const real f = std::erf(y) - a;
      y -= f / (c * std::exp(-y * y) + y * f);
    }
  } else {
    const real q = 1 - a;
    for (int i = 0; i < 3; ++i) {  // g = log(erfc(y) / q): g'' = -2 y g' - g'^2
      const real e = std::erfc(y), g = std::log(e / q), dg = -c * std::exp(-y * y) / e;
      y -= 2 * g / (2 * dg + g * (2 * y + dg));
    }
  }
  return x < 0 ? -y : y;
}
