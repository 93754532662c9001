// SPDX-License-Identifier: Apache-2.0
#include "status.h"

#include <cstdio>
#include <vector>

namespace maxsim {
namespace {
thread_local std::string t_last_error;

std::string VFormat(const char* format, va_list args) {
  va_list copy;
  va_copy(copy, args);
  char small[256];
  int n = std::vsnprintf(small, sizeof(small), format, copy);
  va_end(copy);
  if (n < 0) return format;
  if (static_cast<size_t>(n) < sizeof(small)) return std::string(small, static_cast<size_t>(n));
  std::vector<char> big(static_cast<size_t>(n) + 1);
  std::vsnprintf(big.data(), big.size(), format, args);
  return std::string(big.data(), static_cast<size_t>(n));
}
}  // namespace

Status Error(maxsim_status code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::string message = VFormat(format, args);
  va_end(args);
  return Status(code, std::move(message));
}

std::string Format(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::string message = VFormat(format, args);
  va_end(args);
  return message;
}

void SetLastError(const std::string& message) { t_last_error = message; }

maxsim_status Report(const Status& status) {
  if (!status.ok()) t_last_error = status.message();
  return status.code();
}

}  // namespace maxsim

extern "C" MAXSIM_API const char* maxsim_last_error(void) { return maxsim::t_last_error.c_str(); }
