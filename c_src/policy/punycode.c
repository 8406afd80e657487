/*
 * RFC 3492 Punycode encoder, written from the algorithm in §6.3 with the
 * overflow handling of §6.4. Arithmetic is done in uint32_t, whose maximum
 * stands for the RFC's "maxint".
 */
#include "policy/punycode.h"

#include "common/error.h"

/* RFC 3492 §5: the parameter values that make Bootstring "Punycode". */
#define PC_BASE 36u
#define PC_TMIN 1u
#define PC_TMAX 26u
#define PC_SKEW 38u
#define PC_DAMP 700u
#define PC_INITIAL_BIAS 72u
#define PC_INITIAL_N 0x80u
#define PC_DELIMITER '-'
/* The largest Unicode scalar value. */
#define PC_CODE_POINT_MAX 0x10FFFFu

static const uint32_t MAXINT = UINT32_MAX;

/* RFC 3492 §5: digit values 0-25 are a-z and 26-35 are 0-9. */
static char encode_digit(uint32_t d) {
  return (char)(d < 26 ? 'a' + d : '0' + (d - 26));
}

/* RFC 3492 §6.1. */
static uint32_t adapt(uint32_t delta, uint32_t numpoints, int firsttime) {
  delta = firsttime ? delta / PC_DAMP : delta / 2;
  delta += delta / numpoints;
  uint32_t k = 0;
  while (delta > ((PC_BASE - PC_TMIN) * PC_TMAX) / 2) {
    delta /= PC_BASE - PC_TMIN;
    k += PC_BASE;
  }
  return k + (PC_BASE - PC_TMIN + 1) * delta / (delta + PC_SKEW);
}

int ce_punycode_encode(const uint32_t *in, size_t n, char *out, size_t cap,
                       size_t *out_len) {
  size_t o = 0;
  uint32_t b = 0;

  /* The counters h and b are compared with n, so n must fit them. */
  if (n > MAXINT - 1)
    return CE_EINVAL;
  for (size_t j = 0; j < n; j++) {
    if (in[j] > PC_CODE_POINT_MAX)
      return CE_EINVAL;
    if (in[j] < PC_INITIAL_N) {
      if (o >= cap)
        return CE_ETOOBIG;
      out[o++] = (char)in[j];
      b++;
    }
  }
  if (b > 0) {
    if (o >= cap)
      return CE_ETOOBIG;
    out[o++] = PC_DELIMITER;
  }

  uint32_t code = PC_INITIAL_N, delta = 0, bias = PC_INITIAL_BIAS, h = b;
  while (h < n) {
    /* The smallest code point not yet handled; one exists since h < n. */
    uint32_t m = MAXINT;
    for (size_t j = 0; j < n; j++) {
      if (in[j] >= code && in[j] < m)
        m = in[j];
    }
    if (m - code > (MAXINT - delta) / (h + 1))
      return CE_EINVAL;
    delta += (m - code) * (h + 1);
    code = m;

    for (size_t j = 0; j < n; j++) {
      if (in[j] < code) {
        if (delta == MAXINT)
          return CE_EINVAL;
        delta++;
      }
      if (in[j] != code)
        continue;
      uint32_t q = delta;
      for (uint32_t k = PC_BASE;; k += PC_BASE) {
        uint32_t t = k <= bias ? PC_TMIN : k >= bias + PC_TMAX ? PC_TMAX : k - bias;
        if (q < t)
          break;
        if (o >= cap)
          return CE_ETOOBIG;
        out[o++] = encode_digit(t + (q - t) % (PC_BASE - t));
        q = (q - t) / (PC_BASE - t);
      }
      if (o >= cap)
        return CE_ETOOBIG;
      out[o++] = encode_digit(q);
      bias = adapt(delta, h + 1, h == b);
      delta = 0;
      h++;
    }
    if (delta == MAXINT)
      return CE_EINVAL;
    delta++;
    code++;
  }
  *out_len = o;
  return 0;
}
