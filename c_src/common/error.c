#include "common/error.h"

const char *ce_strerror(int err) {
  switch (err) {
  case CE_OK:
    return "success";
#define XX(name, msg)                                                        \
  case CE_E##name:                                                           \
    return msg;
    CE_ERRNO_MAP(XX)
#undef XX
  default:
    return "unknown error";
  }
}

const char *ce_err_name(int err) {
  switch (err) {
#define XX(name, msg)                                                        \
  case CE_E##name:                                                           \
    return "CE_E" #name;
    CE_ERRNO_MAP(XX)
#undef XX
  default:
    return "CE_EUNKNOWN";
  }
}
